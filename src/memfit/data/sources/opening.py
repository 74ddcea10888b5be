"""What the user passed to ``memfit.pack``, turned into a source: a dict of arrays or of
``.npy`` paths, an ``.npz`` or ``.npy`` file, or an iterable of dicts of arrays.

Example:
    >>> src = open_source({"x": np.zeros((10, 3), "float32"), "y": np.arange(10)})
    >>> src.length, sorted(src.features)
    (10, ['x', 'y'])
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.sources.columns import ArraySource, StreamSource
from memfit.errors import DatasetError

__all__ = ["open_source"]


def _load_npy(name: str, path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DatasetError(f"Feature {name!r}: no such file {path!r}.") from None
    except ValueError as e:
        raise DatasetError(f"Feature {name!r}: {path!r} is not a readable .npy file of "
                           f"numbers ({e}).") from None



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
