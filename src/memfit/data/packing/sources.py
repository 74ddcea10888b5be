"""Sources that ``memfit.pack`` reads: arrays (in memory or memory-mapped ``.npy``),
``.npz`` archives, CSV files, and any iterable of dicts of arrays.

Every source is validated before a byte is written: equal lengths, supported dtypes, and
ragged rows only where a variable shape was declared. Errors name the feature and the
values.

Example:
    >>> src = open_source({"x": np.zeros((10, 3), "float32"), "y": np.arange(10)})
    >>> src.length, sorted(src.features)
    (10, ['x', 'y'])
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.manifest import Feature, check_dtype, check_feature_name
from memfit.data.read.buffers import release_pages
from memfit.errors import DatasetError

__all__ = ["ArraySource", "StreamSource", "open_source", "csv_to_npy"]

Columns = dict[str, Any]   # feature name → ndarray (fixed) or list of ndarrays (variable)


def _row_array(name: str, row: Any, index: int) -> np.ndarray:
    arr = np.asarray(row)
    if arr.dtype == object:
        raise DatasetError(f"Feature {name!r} row {index} is not a numeric array "
                           f"(got {type(row).__name__}: {str(row)[:60]!r}).")
    return arr


class ArraySource:
    """Random-access columns: NumPy arrays, ``np.memmap``\\s, or lists of arrays for
    variable-shape features. All columns must have the same length."""

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
            rows = col[sorted_idx]
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
        for name in sorted(self.columns):
            h.update(name.encode())
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


def _load_npy(name: str, path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DatasetError(f"Feature {name!r}: no such file {path!r}.") from None
    except ValueError as e:
        raise DatasetError(f"Feature {name!r}: {path!r} is not a readable .npy file of "
                           f"numbers ({e}).") from None


def csv_to_npy(path: str, workdir: Path, *, label: str | None = None,
               delimiter: str = ",") -> dict[str, str]:
    """Converts a CSV file to ``.npy`` columns in ``workdir`` in two streamed passes.

    Columns are typed by content: all integers → int64, otherwise numbers → float32; an
    empty or non-numeric cell is an error naming the row and column. With ``label``, the
    label column becomes feature ``y`` and the other columns are stacked into ``x``
    (float32, one vector per row); otherwise each column is its own feature.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "t.csv").write_text("a,b,target\\n1,0.5,0\\n2,1.5,1\\n")
        >>> paths = csv_to_npy(str(d / "t.csv"), d / "npy", label="target")
        >>> np.load(paths["x"]).tolist(), np.load(paths["y"]).tolist()
        ([[1.0, 0.5], [2.0, 1.5]], [0, 1])

    Returns:
        feature name → path of the ``.npy`` file written.
    """
    header, is_int, rows = _scan_csv(path, delimiter, label)
    workdir.mkdir(parents=True, exist_ok=True)
    out = {name: np.lib.format.open_memmap(workdir / f"{name}.npy", mode="w+", dtype=dt,
                                           shape=shape)
           for name, (dt, shape) in _csv_features(header, is_int, rows, label).items()}
    _fill_from_csv(out, path, delimiter, header, is_int, label)
    for arr in out.values():
        arr.flush()
    return {name: str(workdir / f"{name}.npy") for name in out}


def _scan_csv(path: str, delimiter: str,
              label: str | None) -> tuple[list[str], list[bool], int]:
    """The first pass: the header, whether each column holds integers only, and the
    number of rows; every cell is checked to be a number."""
    try:
        f = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"No such CSV file: {path!r}.") from None
    with f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if not header:
            raise DatasetError(f"CSV file {path!r} is empty: it needs a header row.")
        header = [h.strip() for h in header]
        if label is not None and label not in header:
            raise DatasetError(f"CSV file {path!r} has no column {label!r}; columns are "
                               f"{header}. Received: label={label!r}")
        is_int = [True] * len(header)
        rows = 0
        for line_no, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise DatasetError(f"CSV file {path!r} line {line_no} has {len(row)} cells; "
                                   f"the header has {len(header)}.")
            for j, cell in enumerate(row):
                try:
                    if is_int[j]:
                        int(cell)
                        continue
                except ValueError:
                    is_int[j] = False
                try:
                    float(cell)
                except ValueError:
                    raise DatasetError(
                        f"CSV file {path!r} line {line_no} column {header[j]!r} is not a "
                        f"number: {cell!r}. memfit packs numeric CSV columns; encode "
                        f"categories as integers first.") from None
            rows += 1
    if rows == 0:
        raise DatasetError(f"CSV file {path!r} has a header but no rows.")
    return header, is_int, rows


def _csv_features(header: list[str], is_int: list[bool], rows: int,
                  label: str | None) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Feature name → (dtype, shape) of the ``.npy`` columns a CSV file becomes."""
    if label is not None:
        j_label = header.index(label)
        return {"x": (np.float32, (rows, len(header) - 1)),
                "y": (np.int64 if is_int[j_label] else np.float32, (rows,))}
    return {h: (np.int64 if is_int[j] else np.float32, (rows,)) for j, h in enumerate(header)}


def _fill_from_csv(out: dict[str, np.ndarray], path: str, delimiter: str, header: list[str],
                   is_int: list[bool], label: str | None) -> None:
    """The second pass: the rows, 65,536 at a time, into the ``.npy`` columns."""
    if label is not None:
        j_label = header.index(label)
        x_cols = [j for j in range(len(header)) if j != j_label]
    chunk = 65536
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=delimiter)
        next(reader)
        start = 0
        while True:
            block = list(itertools.islice(reader, chunk))
            if not block:
                break
            table = np.array(block, dtype=np.float64 if not all(is_int) else np.int64)
            stop = start + len(block)
            if label is not None:
                out["x"][start:stop] = table[:, x_cols]
                out["y"][start:stop] = table[:, j_label]
            else:
                for j, h in enumerate(header):
                    out[h][start:stop] = table[:, j]
            start = stop


def open_source(source: Any, *, variable: Iterable[str] = ()) -> ArraySource | StreamSource:
    """Turns what the user passed to ``pack`` into a source.

    Args:
        source: a dict of arrays (or of ``.npy`` paths), a path to an ``.npz`` or ``.npy``
            file, or an iterable/generator of dicts of arrays.
        variable: names of features whose first dimension varies from sample to sample.
    """
    if isinstance(source, str | os.PathLike):
        path = str(source)
        if path.endswith(".npz"):
            try:
                with np.load(path, allow_pickle=False) as z:
                    arrays = {k: z[k] for k in z.files}
            except FileNotFoundError:
                raise DatasetError(f"No such .npz file: {path!r}.") from None
            return ArraySource(arrays, variable=variable, description=path)
        if path.endswith(".npy"):
            name = Path(path).stem
            return ArraySource({name: _load_npy(name, path)}, variable=variable,
                               paths={name: path}, description=path)
        if path.endswith(".csv"):
            raise DatasetError("Pack a CSV file with pack(csv=PATH, label=...) or "
                               f"`memfit pack --csv PATH`. Received: {path!r}")
        raise DatasetError(f"Unknown source file type {path!r}: use .npy, .npz or .csv.")
    if isinstance(source, Mapping):
        columns, paths = {}, {}
        for name, value in source.items():
            if isinstance(value, str | os.PathLike):
                columns[name] = _load_npy(name, str(value))
                paths[name] = str(value)
            else:
                columns[name] = value
        desc = ", ".join(f"{k}={v}" for k, v in paths.items()) or "arrays"
        return ArraySource(columns, variable=variable, paths=paths, description=desc)
    if isinstance(source, Iterable) and not isinstance(source, bytes | np.ndarray):
        return StreamSource(source, variable=variable)
    raise DatasetError(f"Cannot pack a {type(source).__name__}: give a dict of arrays, a .npz "
                       f"or .npy path, or an iterable of dicts of arrays. Received: "
                       f"{str(source)[:80]!r}")
