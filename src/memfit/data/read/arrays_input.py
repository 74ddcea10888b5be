"""What ``memfit.dataset`` reads from a ``.npy`` source: the arrays it names, opened and
checked, and the samples asked for (``indices=``).

A source is a dict of feature name → ``.npy`` path (or in-memory array), a directory of
``.npy`` files (the feature name is the file stem), one ``.npy`` file, or a
"memfit-arrays" directory (:mod:`memfit.data.format.arrays_format`).

Example:
    >>> check_indices(np.array([True, False, True]), 3).tolist()
    [0, 2]
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.arrays_format import FORMAT, ArraysManifest, manifest_format, open_npy
from memfit.data.format.manifest import check_dtype, check_feature_name
from memfit.errors import DatasetError

__all__ = ["ArraysInput", "resolve", "open_columns", "check_indices"]


@dataclasses.dataclass
class ArraysInput:
    """What a source resolved to: where each feature is, and where it came from."""

    description: str
    paths: dict[str, str]                   # feature → .npy path
    arrays: dict[str, np.ndarray]           # feature → in-memory array
    manifest: ArraysManifest | None = None
    split: str | None = None

    @property
    def names(self) -> list[str]:
        return [*self.paths, *self.arrays]


def resolve(source: Any, split: str | None) -> ArraysInput:
    """Where each feature of ``source`` is (see the module docstring); ``split`` applies to
    a "memfit-arrays" directory only."""
    if isinstance(source, Mapping):
        if not source:
            raise DatasetError("The source has no features: give at least one, e.g. "
                               "{'x': 'x.npy', 'y': 'y.npy'}. Received: {}")
        paths, arrays = {}, {}
        for name, value in source.items():
            check_feature_name(name)
            if isinstance(value, str | os.PathLike):
                paths[name] = str(value)
            elif isinstance(value, np.ndarray):
                arrays[name] = value
            else:
                raise DatasetError(f"Feature {name!r} must be a .npy path or a NumPy array. "
                                   f"Received: {name}={type(value).__name__}")
        desc = ", ".join([f"{k}={v}" for k, v in paths.items()]
                         + [f"{k}=<array {a.dtype}{a.shape}>" for k, a in arrays.items()])
        src = ArraysInput(desc, paths, arrays)
    else:
        p = Path(source)
        if p.suffix == ".npy":
            src = ArraysInput(str(p), {p.stem: str(p)}, {})
        elif manifest_format(p) == FORMAT:
            m = ArraysManifest.load(p)
            sp = m.split(split)
            return ArraysInput(f"{m.path} [{sp.name}]",
                           {n: str(m.path / a.file) for n, a in sp.files.items()}, {},
                           manifest=m, split=sp.name)
        elif p.is_dir():
            files = sorted(f for f in p.glob("*.npy") if not f.name.startswith("."))
            if not files:
                raise DatasetError(f"No .npy files in {str(p)!r}: a directory source holds one "
                                   f".npy file per feature (the name is the file stem).")
            src = ArraysInput(str(p), {f.stem: str(f) for f in files}, {})
        else:
            raise DatasetError(f"No such .npy file or directory: {str(p)!r}.")
    if split is not None:
        raise ValueError(f"split applies to datasets written by memfit.pack; {src.description} "
                         f"has no splits: select samples with indices=... instead. "
                         f"Received: split={split!r}")
    return src


def open_columns(src: ArraysInput, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Opens and checks the features asked for; all must have the same length."""
    cols: dict[str, np.ndarray] = {}
    for name in names:
        if name in src.arrays:
            arr = src.arrays[name]
            check_dtype(name, arr.dtype)
            if arr.ndim == 0 or len(arr) == 0:
                raise DatasetError(f"Feature {name!r} has no samples. "
                                   f"Received: {name}.shape={arr.shape}")
            cols[name] = arr
            continue
        arr = open_npy(name, src.paths[name])
        if src.manifest is not None:
            f = src.manifest.features[name]
            entry = src.manifest.split(src.split).files[name]
            expected = (src.manifest.split(src.split).samples, *f.shape)
            if np.dtype(arr.dtype).name != f.dtype or tuple(arr.shape) != expected:
                raise DatasetError(
                    f"Feature {name!r}: {src.paths[name]!r} holds {arr.dtype}{arr.shape}; the "
                    f"manifest says {f.dtype}{expected}. The dataset was changed after "
                    f"packing: run `memfit verify {src.manifest.path}`.")
            if os.path.getsize(src.paths[name]) != entry.bytes:
                raise DatasetError(f"Feature {name!r}: {src.paths[name]!r} is not the size the "
                                   f"manifest says ({entry.bytes:,} bytes); run `memfit verify "
                                   f"{src.manifest.path}`.")
        cols[name] = arr
    lengths = {n: len(c) for n, c in cols.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{n}={v:,}" for n, v in lengths.items())
        files = "; ".join(f"{n}: {src.paths.get(n, 'in memory')}" for n in lengths)
        raise DatasetError(f"All features need the same number of samples (first dimension). "
                           f"Received lengths: {listed} ({files})")
    return cols


def check_indices(indices: Any, n: int) -> np.ndarray:
    """Validates an index subset (integers or a boolean mask) against ``n`` samples."""
    try:
        idx = np.asarray(indices)
    except Exception as e:  # noqa: BLE001 - anything that is not array-like
        raise ValueError(f"indices must be a 1-D array of sample indices or a boolean mask. "
                         f"Received: indices of type {type(indices).__name__} ({e})") from None
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise ValueError(f"A boolean indices mask needs one value per sample ({n:,}). "
                             f"Received: indices.shape={idx.shape}")
        idx = np.flatnonzero(idx)
    elif idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"indices must be a 1-D array of integer sample indices (or a boolean "
                         f"mask). Received: indices with dtype {idx.dtype} and shape "
                         f"{idx.shape}")
    if idx.size == 0:
        raise ValueError("indices selects no samples. Received: indices=[] (empty)")
    idx = idx.astype(np.int64, copy=False)
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        at = int(np.argmax(bad))
        raise ValueError(f"indices must lie in [0, {n:,}) (the source has {n:,} samples); "
                         f"{int(bad.sum()):,} do not. Received: indices[{at}]={int(idx[at])}")
    sorted_idx = np.sort(idx)
    dup = sorted_idx[1:] == sorted_idx[:-1]
    if dup.any():
        value = int(sorted_idx[1:][np.argmax(dup)])
        distinct = idx.size - int(dup.sum())
        raise ValueError(f"indices holds duplicates (e.g. {value} more than once); each "
                         f"sample is yielded once per epoch. Received: indices with "
                         f"{idx.size:,} values, {distinct:,} distinct")
    return idx
