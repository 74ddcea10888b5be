"""The two kinds of source every packer reads: :class:`ArraySource` (random-access
columns: arrays in memory, memory-mapped ``.npy`` files, lists of arrays for
variable-shape features) and :class:`StreamSource` (an iterable of dicts of arrays, of
unknown length). A new source either gives one of them (as the CSV and ``.npz`` sources
do) or a class with the same members.

Every source is validated before a byte is written: equal lengths, supported dtypes, and
ragged rows only where a variable shape was declared. Errors name the feature and the
values.

Example:
    >>> src = ArraySource({"x": np.zeros((10, 3), "float32"), "y": np.arange(10)})
    >>> src.length, sorted(src.features)
    (10, ['x', 'y'])
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from memfit.data.format.manifest import Feature, check_dtype, check_feature_name
from memfit.data.read.buffers import release_pages
from memfit.errors import DatasetError

__all__ = ["ArraySource", "Columns", "StreamSource"]

Columns = dict[str, Any]   # feature name → ndarray (fixed) or list of ndarrays (variable)


def _row_array(name: str, row: Any, index: int) -> np.ndarray:
    arr = np.asarray(row)
    if arr.dtype == object:
        raise DatasetError(f"Feature {name!r} row {index} is not a numeric array "
                           f"(got {type(row).__name__}: {str(row)[:60]!r}).")
    return arr


# A page fault on a mapped file maps the cached pages around it too (the kernel's
# fault-around, 64 KiB), so one 32 MiB chunk of shuffled rows of a large ``.npy`` column
# mapped nearly the whole file before the packer released its pages: 1.0 GiB of
# file-backed RSS for a 1 GiB Parquet table, 0.2 GiB for a 0.25 GiB one (issue 30).
# Gathering a few hundred rows at a time and releasing the pages after each bounds it.
MAPPED_BYTES = 32 * 2**20
FAULT_AROUND_BYTES = 64 * 1024


def _gather_mapped(col: np.memmap, indices: np.ndarray) -> np.ndarray:
    """``col[indices]`` (ascending ``indices``) of a memory-mapped column, read in pieces
    that map at most ~:data:`MAPPED_BYTES` of it, its pages released after each piece.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
        >>> np.save(path, np.arange(10.0))
        >>> _gather_mapped(np.load(path, mmap_mode="r"), np.array([1, 4, 9])).tolist()
        [1.0, 4.0, 9.0]

    Args:
        col: a memory-mapped array (first dimension = rows).
        indices: the rows to read, ascending.
    """
    out = np.empty((len(indices), *col.shape[1:]), col.dtype)
    row_bytes = col.dtype.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
    piece = max(1, MAPPED_BYTES // (row_bytes + FAULT_AROUND_BYTES))
    for a in range(0, len(indices), piece):
        np.take(col, indices[a:a + piece], axis=0, out=out[a:a + piece])
        release_pages([col])
    return out


class ArraySource:
    """Random-access columns: NumPy arrays, ``np.memmap``\\s, or lists of arrays for
    variable-shape features. All columns must have the same length.

    ``identity``, where set, is what the columns were made from (a CSV file's path, size
    and mtime, and how it was read): :meth:`fingerprint` names it instead of the columns'
    own files, which are made again, under another name, by every run.
    """

    identity: str | None = None
    #: the label's classes, label ``i`` is ``class_names[i]`` (an image folder's; empty
    #: where the labels are the user's own numbers); the manifest records them.
    class_names: Sequence[str] = ()

    random_access = True

    def __init__(self, columns: Mapping[str, Any], *, variable: Iterable[str] = (),
                 paths: Mapping[str, str] | None = None, description: str = "arrays"):
        variable = set(variable)
        if not columns:
            raise DatasetError("The source has no features: give at least one named array, "
                               "e.g. {'x': images, 'y': labels}. Received: {}")
        unknown = variable - set(columns)
        if unknown:
            raise DatasetError(f"variable names features the source does not have: "
                               f"{sorted(unknown)}; features are {sorted(columns)}. "
                               f"Received: variable={sorted(variable)}")
        self.paths = dict(paths or {})
        self.description = description
        self.columns: Columns = {}
        self.features: dict[str, Feature] = {}
        lengths = {}
        for name, col in columns.items():
            check_feature_name(name)
            if name in variable:
                rows = list(col)
                self.features[name] = self._variable_feature(name, rows)
                self.columns[name] = rows
                lengths[name] = len(rows)
                continue
            if isinstance(col, np.ndarray) and col.dtype != object:
                arr = col
            else:
                arr = self._as_fixed(name, col)
            if arr.ndim == 0:
                raise DatasetError(f"Feature {name!r} is a scalar, not an array of samples "
                                   f"(first dimension = samples). Received: {name}={arr!r}")
            dtype = check_dtype(name, arr.dtype)
            if 0 in arr.shape[1:]:
                raise DatasetError(f"Feature {name!r} has an empty sample shape "
                                   f"{arr.shape[1:]}. Received: {name}.shape={arr.shape}")
            self.features[name] = Feature(name, dtype, tuple(int(d) for d in arr.shape[1:]))
            self.columns[name] = arr
            lengths[name] = arr.shape[0]
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{n}={v}" for n, v in lengths.items())
            raise DatasetError(f"All features need the same number of samples (first "
                               f"dimension). Received lengths: {listed}")
        self.length = next(iter(lengths.values()))
        if self.length == 0:
            raise DatasetError("The source has no samples (length 0); nothing to pack.")

    @staticmethod
    def _as_fixed(name: str, col: Any) -> np.ndarray:
        rows = list(col)
        shapes = {np.shape(r) for r in rows[:100_000]}
        if len(shapes) > 1:
            a, b = sorted(shapes, key=str)[:2]
            raise DatasetError(
                f"Feature {name!r} has rows of different shapes, e.g. {a} and {b}, and no "
                f"variable shape was declared. Declare it (variable=[{name!r}] in Python, "
                f"--variable {name} on the command line) or pad the rows to one shape.")
        arr = np.asarray(rows)
        if arr.dtype == object:
            check_dtype(name, arr.dtype)
        return arr

    @staticmethod
    def _variable_feature(name: str, rows: list) -> Feature:
        if not rows:
            raise DatasetError(f"Feature {name!r} has no rows.")
        first = _row_array(name, rows[0], 0)
        if first.ndim == 0:
            raise DatasetError(f"Variable feature {name!r} needs rows of at least one "
                               f"dimension; row 0 is a scalar: {rows[0]!r}")
        dtype = check_dtype(name, first.dtype)
        inner = first.shape[1:]
        for i, row in enumerate(rows):
            arr = _row_array(name, row, i)
            if arr.shape[1:] != inner or arr.dtype != first.dtype:
                raise DatasetError(
                    f"Variable feature {name!r} may vary only in its first dimension and must "
                    f"keep one dtype: row 0 is {first.dtype}{first.shape}, row {i} is "
                    f"{arr.dtype}{arr.shape}.")
        return Feature(name, dtype, (None, *(int(d) for d in inner)))

    def take(self, indices: np.ndarray) -> Columns:
        """The rows at ``indices`` (in that order), read in sorted order for locality."""
        order = np.argsort(indices, kind="stable")
        sorted_idx = indices[order]
        out: Columns = {}
        for name, col in self.columns.items():
            if isinstance(col, list):
                out[name] = [np.asarray(col[i]) for i in indices]
                continue
            rows = _gather_mapped(col, sorted_idx) if isinstance(col, np.memmap) \
                else col[sorted_idx]
            result = np.empty_like(rows)
            result[order] = rows
            out[name] = result
        return out

    def release_pages(self) -> None:
        """Drops the page cache mapped by memory-mapped columns (bounds file-backed RSS)."""
        release_pages(self.columns.values())

    def fingerprint(self) -> str:
        """Identifies the content cheaply: paths with size and mtime, else shapes and a hash
        of a few rows (enough to refuse resuming a pack over different data)."""
        h = hashlib.sha256()
        if self.identity is not None:
            h.update(self.identity.encode())
        for name in sorted(self.columns):
            h.update(name.encode())
            if self.identity is not None:
                h.update(f"{self.features[name]}".encode())
                continue
            if name in self.paths:
                st = os.stat(self.paths[name])
                h.update(f"{self.paths[name]}:{st.st_size}:{st.st_mtime_ns}".encode())
                continue
            col = self.columns[name]
            if isinstance(col, list):
                picks = [col[i] for i in sorted({0, len(col) // 2, len(col) - 1})]
                for p in picks:
                    h.update(np.ascontiguousarray(p).tobytes())
                h.update(str(len(col)).encode())
            else:
                h.update(f"{col.dtype}{col.shape}".encode())
                picks = sorted({0, len(col) // 2, len(col) - 1})
                h.update(np.ascontiguousarray(col[picks]).tobytes())
        return h.hexdigest()


class StreamSource:
    """An iterable of dicts of arrays (one sample each), of unknown length.

    The first sample fixes the features; every later one is checked against them as it
    arrives (a bad sample stops the pack before its shard is renamed into place).
    """

    random_access = False
    length = None
    class_names: Sequence[str] = ()

    def __init__(self, samples: Iterable[Mapping[str, Any]], *, variable: Iterable[str] = (),
                 description: str = "iterable"):
        self.description = description
        self._iter = iter(samples)
        try:
            first = next(self._iter)
        except StopIteration:
            raise DatasetError("The iterable yielded no samples; nothing to pack.") from None
        if not isinstance(first, Mapping):
            raise DatasetError(f"An iterable source must yield dicts of arrays (feature name "
                               f"→ one sample). Received an element of type "
                               f"{type(first).__name__}: {str(first)[:80]!r}")
        variable = set(variable)
        unknown = variable - set(first)
        if unknown:
            raise DatasetError(f"variable names features the samples do not have: "
                               f"{sorted(unknown)}; features are {sorted(first)}.")
        self.features: dict[str, Feature] = {}
        for name, value in first.items():
            arr = _row_array(name, value, 0)
            dtype = check_dtype(name, arr.dtype)
            if name in variable:
                if arr.ndim == 0:
                    raise DatasetError(f"Variable feature {name!r} needs at least one "
                                       f"dimension; sample 0 is a scalar.")
                self.features[name] = Feature(name, dtype, (None, *arr.shape[1:]))
            else:
                self.features[name] = Feature(name, dtype, tuple(arr.shape))
        self._first = first

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        for i, s in enumerate(itertools.chain([self._first], self._iter)):
            if not isinstance(s, Mapping) or set(s) != set(self.features):
                got = sorted(s) if isinstance(s, Mapping) else type(s).__name__
                raise DatasetError(f"Sample {i} has features {got}; the first sample had "
                                   f"{sorted(self.features)}.")
            out = {}
            for name, f in self.features.items():
                arr = _row_array(name, s[name], i)
                ok = (arr.shape[1:] == f.inner_shape and arr.ndim >= 1) if f.variable \
                    else arr.shape == f.shape
                if not ok or arr.dtype.name != f.dtype:
                    raise DatasetError(
                        f"Sample {i} feature {name!r} is {arr.dtype}{arr.shape}; the first "
                        f"sample fixed it as {f.dtype}{f.shape}"
                        + ("" if f.variable else f" (declare variable=[{name!r}] if its "
                           f"first dimension varies)") + ".")
                out[name] = arr
            yield out
