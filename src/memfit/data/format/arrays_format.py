"""The "memfit-arrays" format: what ``memfit.pack(..., format="arrays")`` writes, and the
``.npy`` files that ``memfit.dataset`` reads memory-mapped.

A "memfit-arrays" directory holds ``<split>/<feature>.npy`` plus a ``manifest.json``
with dtypes, shapes and sha256 (:class:`ArraysManifest`). ``memfit.dataset`` reads
``.npy`` arrays (:func:`is_arrays_source`) from such a directory, from a dict of feature
name → ``.npy`` path (or in-memory array), a directory of ``.npy`` files (the feature
name is the file stem) or one ``.npy`` file, each opened by :func:`open_npy` after
checking it is whole.

Example:
    >>> is_arrays_source({"x": "x.npy"}), is_arrays_source("data/x.npy")
    (True, True)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.manifest import (
    MANIFEST,
    ManifestBase,
    ManifestSchema,
    check_dtype,
    manifest_file,
)
from memfit.errors import DatasetError

__all__ = ["ArraysManifest", "ArrayFile", "ArraysSplit", "FORMAT", "FORMAT_VERSION",
           "is_arrays_source", "manifest_format", "open_npy"]

FORMAT = "memfit-arrays"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ArrayFile:
    """One ``.npy`` file of a split: its path relative to the dataset, size and sha256."""

    file: str
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class ArraysSplit:
    """A split of an arrays dataset: its sample count and one ``.npy`` file per feature."""

    name: str
    samples: int
    files: dict[str, ArrayFile]

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArraysManifest(ManifestBase[ArraysSplit]):
    """``manifest.json`` of a "memfit-arrays" directory (written last: its presence means
    every ``.npy`` file is complete).

    Layout: ``<split>/<feature>.npy``, each a plain ``.npy`` file (C order, little-endian)
    whose first dimension is the split's samples, so ``np.load(path, mmap_mode="r")`` reads
    it without memfit.

    Its fields are :class:`~memfit.data.format.manifest.ManifestBase`'s.

    Example:
        >>> import tempfile
        >>> from memfit.data.packing.packer import pack
        >>> out = tempfile.mkdtemp() + "/a"
        >>> _ = pack({"x": np.zeros((10, 2), "float32")}, out, format="arrays", progress=False)
        >>> m = ArraysManifest.load(out)
        >>> m.splits["train"].files["x"].file, m.samples, manifest_format(out)
        ('train/x.npy', 10, 'memfit-arrays')
    """

    @property
    def file_count(self) -> int:
        return sum(len(s.files) for s in self.splits.values())

    def to_json(self) -> dict[str, Any]:
        return {
            **self.common_json(FORMAT, FORMAT_VERSION),
            "features": {n: {"dtype": f.dtype, "shape": list(f.shape)}
                         for n, f in self.features.items()},
            "splits": {n: {"samples": s.samples,
                           "files": {f: dataclasses.asdict(a) for f, a in s.files.items()}}
                       for n, s in self.splits.items()},
            "totals": {"samples": self.samples, "bytes": self.bytes, "files": self.file_count},
            "layout": ("One .npy file per split and feature, <split>/<feature>.npy: C order, "
                       "little-endian, first dimension = samples of the split, the rest = "
                       "the feature's shape. Read with np.load(path, mmap_mode='r')."),
        }

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ArraysManifest:
        """Reads ``DIRECTORY/manifest.json`` of an arrays dataset.

        Raises:
            DatasetError: if there is no complete memfit arrays dataset there.
        """
        schema, doc = ManifestSchema.open(directory, FORMAT, FORMAT_VERSION)
        features = schema.features(doc, variable=False)
        splits = {}
        listed = schema.mapping(schema.field(doc, "splits"), "splits", nonempty=True)
        for name, s in listed.items():
            where = f"splits.{name}"
            s = schema.mapping(s, where)
            files = {}
            for f, a in schema.mapping(schema.field(s, "files", where), f"{where}.files",
                                       nonempty=True).items():
                at = f"{where}.files.{f}"
                a = schema.mapping(a, at)
                files[f] = ArrayFile(file=schema.file_name(schema.field(a, "file", at),
                                                           f"{at}.file"),
                                     bytes=schema.count(a, "bytes", at),
                                     sha256=schema.sha256(schema.field(a, "sha256", at),
                                                          f"{at}.sha256"))
            if set(files) != set(features):
                raise schema.error(f"{where}.files", sorted(files),
                                   f"one file per feature {sorted(features)}")
            splits[name] = ArraysSplit(name, schema.count(s, "samples", where, positive=True),
                                       files)
        return cls(features=features, splits=splits, **schema.common(doc))


def manifest_format(path: str | os.PathLike) -> str | None:
    """The ``format`` of ``PATH/manifest.json`` (or of that file), ``None`` without one.

    Example:
        >>> import tempfile
        >>> manifest_format(tempfile.mkdtemp()) is None             # no manifest.json there
        True
    """
    file = manifest_file(path)
    if not file.is_file():
        return None
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        # a stranger read "JSONDecodeError('Unterminated string ...')": the words, and a fix
        why = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise DatasetError(f"{file} is damaged or not a memfit manifest ({why}). Pack the "
                           f"dataset again (memfit pack) or restore manifest.json from a "
                           f"copy.") from None
    return doc.get("format") if isinstance(doc, dict) else None


def is_arrays_source(source: Any) -> bool:
    """Whether ``memfit.dataset`` should read ``source`` as ``.npy`` arrays.

    True for a mapping (feature name → ``.npy`` path or array), a ``.npy`` path, a
    "memfit-arrays" directory, and a directory of ``.npy`` files without a manifest or
    TFRecord shards.

    Example:
        >>> is_arrays_source({"x": "x.npy"}), is_arrays_source("data/x.npy")
        (True, True)
    """
    if isinstance(source, Mapping):
        return True
    if not isinstance(source, str | os.PathLike):
        return False
    p = Path(source)
    if p.suffix == ".npy":
        return True
    if p.is_dir() or (p.name == MANIFEST and p.is_file()):
        fmt = manifest_format(p)
        if fmt is not None:
            return fmt == FORMAT
        return p.is_dir() and any(p.glob("*.npy")) and not any(p.glob("*.tfrecord*"))
    return False


def _read_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    if version == (3, 0):
        # NumPy writes 3.0 only for structured dtypes with non-Latin-1 field names,
        # which memfit does not store (and NumPy reads privately).
        raise ValueError("its header is .npy format 3.0, used only for structured arrays "
                         "with non-Latin-1 field names, which memfit does not read")
    raise ValueError(f"its header gives .npy format version {version[0]}.{version[1]}, "
                     f"which NumPy never writes: the file is damaged")


def open_npy(name: str, path: str | os.PathLike) -> np.memmap:
    """Memory-maps one feature's ``.npy`` file after checking it is whole and usable.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "x.npy"
        >>> np.save(path, np.zeros((5, 3), "float32"))
        >>> x = open_npy("x", path)
        >>> type(x).__name__, x.shape
        ('memmap', (5, 3))

    Args:
        name: the feature name (for the error messages).
        path: the ``.npy`` file.

    Raises:
        DatasetError: naming the file when it is missing, not a ``.npy`` file, truncated
            or longer than its header says, of an unsupported dtype, or has no samples.
    """
    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a .npy file" if p.is_dir() else "does not exist"
        raise DatasetError(f"Feature {name!r}: {str(p)!r} {what}. Check the path: give a "
                           f".npy file for each feature. Received: {name}={str(p)!r}")
    size = p.stat().st_size
    try:
        with open(p, "rb") as f:
            shape, fortran, dtype = _read_header(f)
            offset = f.tell()
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} is not a readable .npy file "
                           f"({e}). Write it again (np.save) or restore it from a copy."
                           ) from None
    check_dtype(name, dtype, where=f" (file {str(p)!r})")
    if len(shape) == 0:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} holds a scalar, not an array of "
                           f"samples (first dimension = samples).")
    expected = offset + math.prod(shape) * dtype.itemsize
    if size < expected:
        raise DatasetError(
            f"Feature {name!r}: {str(p)!r} is truncated: its header describes "
            f"{dtype}{tuple(shape)}, {expected:,} bytes with the header, but the file has "
            f"{size:,} bytes. Write it again (np.save) or restore it from a copy.")
    if size > expected:
        raise DatasetError(
            f"Feature {name!r}: {str(p)!r} has {size - expected:,} bytes more than its header "
            f"describes ({dtype}{tuple(shape)}, {expected:,} bytes with the header); it is "
            f"not a file np.save wrote (overwritten in place?).")
    if shape[0] == 0:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} has no samples (shape {shape}).")
    if 0 in shape[1:]:
        raise DatasetError(f"Feature {name!r}: {str(p)!r} has an empty sample shape "
                           f"{tuple(shape[1:])}. Received: {name}.shape={tuple(shape)}")
    return np.memmap(p, dtype=dtype, mode="r", offset=offset, shape=tuple(shape),
                     order="F" if fortran else "C")
