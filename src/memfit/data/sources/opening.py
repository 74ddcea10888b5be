"""What the user passed to ``memfit.pack``, turned into a source: a dict of arrays or of
``.npy`` paths, an ``.npz`` or ``.npy`` file, or an iterable of dicts of arrays.

Example:
    >>> src = open_source({"x": np.zeros((10, 3), "float32"), "y": np.arange(10)})
    >>> src.length, sorted(src.features)
    (10, ['x', 'y'])
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.arrays_format import open_npy
from memfit.data.sources.columns import ArraySource, StreamSource
from memfit.errors import DatasetError

__all__ = ["open_source"]


#: The other kinds of input, by what a path ends with: what ``pack`` takes them with.
_OTHER_KINDS = {".csv": "a CSV file: pack(csv=PATH, label=...) or `memfit pack --csv PATH`",
                ".parquet": "a Parquet file: pack(parquet=PATH, label=...) or `memfit pack "
                            "--parquet PATH --label COLUMN`",
                ".tfrecord": "TFRecord files: pack(tfrecord=PATH) or `memfit pack --tfrecord "
                             "PATH`"}


def _other_kind(path: str) -> str | None:
    """How ``pack`` takes the input at ``path`` when it is not arrays, or ``None``."""
    if os.path.isdir(path):
        return ("a folder (of images? pack(images=DIR, image_size=(H, W)) or `memfit pack "
                "--images DIR --image-size H,W`)")
    low = path.lower()
    return next((how for end, how in _OTHER_KINDS.items()
                 if low.endswith(end) or f"{end}." in low or low.endswith(end + "s")), None)


def _load_npy(name: str, path: str) -> np.ndarray:
    other = _other_kind(path) if not path.endswith(".npy") else None
    if path.endswith(".npz"):
        other = (f"an .npz archive: a NAME=PATH input is one .npy array; give the .npz on "
                 f"its own (pack({path!r}, ...) or `memfit pack {path}`) to pack all its "
                 f"arrays")
    if other is not None:
        raise DatasetError(f"Feature {name!r}: {path!r} is {other}. Received: {name}={path}")
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise DatasetError(f"Feature {name!r}: no such file {path!r}.") from None
    except PermissionError as e:
        raise DatasetError(f"Feature {name!r}: {path!r} cannot be read ({e.strerror}). Give "
                           f"memfit read access to it (chmod), or pack a copy you can "
                           f"read.") from None
    except OSError:
        pass                            # a directory...: open_npy says what it is
    # The one .npy reader (memfit.dataset's too): the header read as data, never a
    # pickle; truncated files, dtypes and shapes refused with the file named.
    return open_npy(name, path)



def _load_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive, read whole (never unpickled)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise DatasetError(f"No such .npz file: {path!r}.") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        if "allow_pickle" in str(e) and zipfile.is_zipfile(path):
            why = ("holds an array of Python objects (dtype=object), which memfit does not "
                   "unpickle; save numeric arrays (x.astype('float32'))")
        else:
            why = ("is not a readable .npz archive (not a whole zip file of .npy arrays: "
                   "cut short, or another format)")
        raise DatasetError(f"{path!r} {why}. Write it again with np.savez(path, x=..., "
                           f"y=...), or give each array as a .npy file.") from None


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
            return ArraySource(_load_npz(path), variable=variable, description=path)
        if path.endswith(".npy"):
            name = Path(path).stem
            return ArraySource({name: _load_npy(name, path)}, variable=variable,
                               paths={name: path}, description=path)
        other = _other_kind(path)
        if other is not None:
            raise DatasetError(f"{path!r} is {other}. Received: {path!r}")
        raise DatasetError(f"Unknown source file type {path!r}: give arrays as .npy or .npz "
                           f"files; CSV, Parquet and TFRecord files and folders of images "
                           f"have their own options (--csv, --parquet, --tfrecord, "
                           f"--images). Received: {path!r}")
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
