"""Finding the NumPy arrays a training process holds: in ``fit``'s arguments, and alive.

Two views, both counted by the memory that backs the arrays (a view counts its owner's
buffer once, however many views there are):

* :func:`fit_arrays`: the arrays passed to ``model.fit`` (``x``, ``y``,
  ``validation_data``, ``sample_weight``, nested in dicts, lists and tuples), by name;
* :func:`resident_arrays`: every array reachable from a container the garbage collector
  tracks (NumPy arrays are not tracked themselves, so the referents of every tracked
  object are looked at) or from a live stack frame — a module's globals, a function's
  locals, a list of batches, an object's attributes.

Arrays backed by a memory-mapped file (``np.load(..., mmap_mode="r")``, ``np.memmap``)
are reported apart: their pages are file-backed page cache, not anonymous memory.

Example:
    >>> import numpy as np
    >>> big = np.zeros((1024, 1024))                 # 8 MiB
    >>> infos = resident_arrays(min_bytes=2**20)
    >>> any(a.nbytes == big.nbytes and not a.mapped for a in infos)
    True
"""

from __future__ import annotations

import dataclasses
import gc
import mmap
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["ArrayInfo", "fit_arrays", "resident_arrays", "owner_of", "describe_array"]


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One array's memory (of its owner, for a view).

    Attributes:
        shape: the owner's shape.
        dtype: the owner's dtype name.
        nbytes: bytes of the owner's buffer.
        mapped: backed by a memory-mapped file (page cache, not anonymous memory).
        names: where it was seen: ``fit(x)``, a variable name (``x_train``), ...
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    mapped: bool
    names: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes,
                "mapped": self.mapped, "names": list(self.names)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArrayInfo:
        return cls(tuple(data["shape"]), data["dtype"], int(data["nbytes"]),
                   bool(data["mapped"]), tuple(data.get("names", ())))


def _numpy() -> Any:
    return sys.modules.get("numpy")


def owner_of(array: Any) -> tuple[Any, bool]:
    """The array that owns ``array``'s buffer, and whether that buffer is a mapped file."""
    np = _numpy()
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    mapped = isinstance(owner, np.memmap) or isinstance(owner.base, mmap.mmap)
    return owner, mapped


def describe_array(shape: tuple[int, ...], dtype: str) -> str:
    """``float32 (20000, 3072)``."""
    return f"{dtype} {tuple(shape)}"


def _flatten(value: Any, name: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    np = _numpy()
    if np is not None and isinstance(value, np.ndarray):
        yield name, value
    elif depth > 4:
        return
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(v, f"{name}[{k!r}]", depth + 1)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{name}[{i}]", depth + 1)
    elif hasattr(value, "to_numpy") and hasattr(value, "dtypes"):   # a pandas object
        try:
            yield from _flatten(value.to_numpy(copy=False), name, depth + 1)
        except Exception:       # noqa: BLE001 - mixed dtypes need a copy: not what is held
            return


def fit_arrays(arguments: Mapping[str, Any]) -> list[ArrayInfo]:
    """The arrays among ``fit``'s arguments, each owner once, largest first.

    Args:
        arguments: ``fit``'s bound arguments by name (``x``, ``y``, ``validation_data``,
            ``sample_weight``...).
    """
    if _numpy() is None:
        return []
    owners: dict[int, tuple[Any, bool, list[str]]] = {}
    for key in ("x", "y", "sample_weight", "validation_data"):
        for name, array in _flatten(arguments.get(key), key):
            owner, mapped = owner_of(array)
            owners.setdefault(id(owner), (owner, mapped, []))[2].append(name)
    _name(owners)
    return _infos(owners)


def _infos(owners: Mapping[int, tuple[Any, bool, list[str]]]) -> list[ArrayInfo]:
    out = [ArrayInfo(tuple(int(d) for d in o.shape), str(o.dtype), int(o.nbytes), mapped,
                     tuple(names)) for o, mapped, names in owners.values()]
    return sorted(out, key=lambda a: a.nbytes, reverse=True)


_LIBRARIES = tuple(f"{os.sep}{name}{os.sep}" for name in
                   ("memfit", "keras", "tensorflow", "numpy"))


def _frames() -> Iterator[Any]:
    """Frames of every thread's stack, but those of memfit and the libraries under it."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if not any(part in frame.f_code.co_filename for part in _LIBRARIES):
                yield frame
            frame = frame.f_back


def _scopes() -> Iterator[Mapping[str, Any]]:
    main = sys.modules.get("__main__")
    if main is not None:
        yield vars(main)
    for frame in _frames():
        try:
            yield frame.f_locals
        except Exception:       # noqa: BLE001
            continue


def _name(owners: dict[int, tuple[Any, bool, list[str]]]) -> None:
    """Adds the variables (of ``__main__`` and the stacks) that hold each owner or a view."""
    ndarray = _numpy().ndarray
    for scope in _scopes():
        for name, value in list(scope.items()):
            if isinstance(value, ndarray) and not name.startswith("_"):
                owner, _ = owner_of(value)
                names = owners.get(id(owner), (None, None, None))[2]
                if names is not None and name not in names:
                    names.append(name)


def resident_arrays(*, min_bytes: int = 2**20) -> list[ArrayInfo]:
    """Every array alive in this process with a buffer of at least ``min_bytes``.

    Names are the variables that hold the array (or a view of it) in ``__main__`` and
    in the frames of every thread's stack. Takes about half a second in a process with
    TensorFlow loaded (it looks at every tracked object once).

    Args:
        min_bytes: smaller buffers are left out.
    """
    np = _numpy()
    if np is None:
        return []
    owners: dict[int, tuple[Any, bool, list[str]]] = {}

    def add(candidate: Any) -> None:
        owner, mapped = owner_of(candidate)
        if owner.nbytes >= min_bytes and id(owner) not in owners:
            owners[id(owner)] = (owner, mapped, [])

    ndarray = np.ndarray
    for obj in gc.get_objects():
        for ref in gc.get_referents(obj):
            if isinstance(ref, ndarray):
                add(ref)
    for scope in _scopes():                 # locals of frames the collector does not track
        for value in list(scope.values()):
            if isinstance(value, ndarray):
                add(value)
    _name(owners)
    return _infos(owners)
