"""Finding the NumPy arrays a training process holds: in ``fit``'s arguments, and alive.

Two views, both counted by the memory that backs the arrays (a view counts its owner's
buffer once, however many views there are):

* :func:`fit_arrays`: the arrays passed to ``model.fit`` (``x``, ``y``,
  ``validation_data``, ``sample_weight``, nested in dicts, lists and tuples), by name;
* :func:`resident_arrays`: every array reachable from a container the garbage collector
  tracks (NumPy arrays are not tracked themselves, so the referents of every tracked
  object are looked at) or from a live stack frame — a module's globals, a function's
  locals, a list of batches, an object's attributes.

Arrays kept by memfit's own input pipeline (the block reader's windows and scratch,
prefetched windows, the arrays path's gathers) are not the user's data: they are found
by ownership (reachable from an object of ``memfit.data`` through plain containers) and
reported apart by :func:`memfit_buffers`, charged to the pipeline's budget. Many small
arrays in one Python container (a list of ``(x, y)`` tuples, a dict of arrays) are
counted together, as one :class:`ArrayInfo` with ``container`` set.

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

__all__ = ["ArrayInfo", "fit_arrays", "resident_arrays", "owner_of", "describe_array",
           "memfit_buffers", "OWN_MODULES"]

#: Objects of these modules own the arrays they reach: memfit's input pipeline.
OWN_MODULES = ("memfit.data",)
_OWN_DEPTH = 6                  # hops from a memfit.data object through plain containers
_OWN_MAX_NODES = 200_000        # objects looked at, at most


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One array's memory (of its owner, for a view).

    Attributes:
        shape: the owner's shape.
        dtype: the owner's dtype name.
        nbytes: bytes of the owner's buffer.
        mapped: backed by a memory-mapped file (page cache, not anonymous memory).
        names: where it was seen: ``fit(x)``, a variable name (``x_train``), ...
        container: for many small arrays held by one Python container, what it is
            (``"list of 6,000 tuples"``); ``shape`` is then ``(arrays,)``, ``dtype`` the
            arrays' dtypes, ``nbytes`` their total.
    """

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    mapped: bool
    names: tuple[str, ...] = ()
    container: str | None = None

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "nbytes": self.nbytes,
                "mapped": self.mapped, "names": list(self.names),
                "container": self.container}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArrayInfo:
        return cls(tuple(data["shape"]), data["dtype"], int(data["nbytes"]),
                   bool(data["mapped"]), tuple(data.get("names", ())),
                   data.get("container"))


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

    def note(value: Any, name: str) -> None:
        owner, _ = owner_of(value)
        names = owners.get(id(owner), (None, None, None))[2]
        if names is not None and name not in names:
            names.append(name)

    for scope in _scopes():
        for name, value in list(scope.items()):
            if name.startswith("_"):
                continue
            if isinstance(value, ndarray):
                note(value, name)
            elif isinstance(value, list | tuple) and len(value) <= 10_000:
                for i, item in enumerate(value):     # a list that keeps arrays: KEPT[3]
                    if isinstance(item, ndarray):
                        note(item, f"{name}[{i}]")


_PLAIN = (dict, list, tuple, set, frozenset)


def _module(obj: Any) -> str:
    """The module of ``obj``'s class ("" when it has none a string names)."""
    module = getattr(type(obj), "__module__", "")
    return module if isinstance(module, str) else ""


def _own_arrays(objects: list[Any]) -> dict[int, Any]:
    """Owners of the arrays reachable from objects of :data:`OWN_MODULES`, by id."""
    np = _numpy()
    frontier = [o for o in objects if _module(o).startswith(OWN_MODULES)]
    seen = {id(o) for o in frontier}
    found: dict[int, Any] = {}
    for _ in range(_OWN_DEPTH):
        following = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) in seen:
                    continue
                seen.add(id(ref))
                if isinstance(ref, np.ndarray):
                    owner, _ = owner_of(ref)
                    found[id(owner)] = owner
                    continue
                module = _module(ref)
                # plain containers, memfit's objects and futures holding built windows;
                # never modules, functions, classes, frames or threads
                if isinstance(ref, _PLAIN) or module.startswith(("memfit.", "concurrent.",
                                                                 "collections", "queue")):
                    following.append(ref)
        frontier = following
        if not frontier or len(seen) > _OWN_MAX_NODES:
            break
    return found


def memfit_buffers(*, min_bytes: int = 2**20) -> tuple[int, int]:
    """memfit's own pipeline buffers alive: ``(arrays, bytes)`` of at least ``min_bytes``.

    Example:
        >>> count, size = memfit_buffers()      # (0, 0) before any memfit dataset
        >>> count >= 0 and size >= 0
        True
    """
    if _numpy() is None:
        return 0, 0
    owned = [o for o in _own_arrays(gc.get_objects()).values() if o.nbytes >= min_bytes]
    return len(owned), sum(int(o.nbytes) for o in owned)


def _containers(objects: list[Any], taken: set[int], min_bytes: int,
                small: int) -> list[ArrayInfo]:
    """Lists, dicts and tuples holding many small arrays (an element, or an element's
    element: a list of ``(x, y)`` tuples), each array counted once, largest first."""
    ndarray = _numpy().ndarray
    # Modules' namespaces hold a script's variables, not its data: the lists in them are
    # the containers (a stranger's module-level list of arrays was reported as "unnamed:
    # a dict of 16 dicts/lists", its module's globals). A list a variable names counts
    # however short it is.
    namespaces = {id(vars(m)) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    named = {id(v) for scope in _scopes() for n, v in list(scope.items())
             if isinstance(v, list | dict) and not n.startswith("_")}
    candidates = []
    for obj in objects:
        if not isinstance(obj, list | dict) or id(obj) in namespaces or \
                (len(obj) < 16 and id(obj) not in named):
            continue
        items = obj.values() if isinstance(obj, dict) else obj
        arrays: dict[int, Any] = {}
        inner: set[str] = set()
        try:
            for item in list(items)[:1_000_000]:
                if isinstance(item, ndarray):
                    arrays[id(item)] = item
                    inner.add("arrays")
                elif isinstance(item, tuple | list | dict):
                    inner.add(type(item).__name__ + "s")
                    for sub in (item.values() if isinstance(item, dict) else item):
                        if isinstance(sub, ndarray):
                            arrays[id(sub)] = sub
        except RuntimeError:            # changed size while read (another thread)
            continue
        total = sum(int(a.nbytes) for a in arrays.values() if a.nbytes < small)
        if total >= min_bytes:
            candidates.append((total, obj, arrays, inner))
    out = []
    for _, obj, arrays, inner in sorted(candidates, key=lambda c: c[0], reverse=True):
        mine = [a for i, a in arrays.items() if i not in taken and a.nbytes < small]
        total = sum(int(a.nbytes) for a in mine)
        if total < min_bytes:
            continue
        taken.update(id(a) for a in mine)
        kind = f"{type(obj).__name__} of {len(obj):,} " + "/".join(sorted(inner))
        dtypes = "/".join(sorted({str(a.dtype) for a in mine}))
        names = tuple(dict.fromkeys(n for scope in _scopes() for n, v in list(scope.items())
                                    if v is obj and not n.startswith("_")))
        out.append(ArrayInfo((len(mine),), dtypes, total, False, names[:3], kind))
    return out


def resident_arrays(*, min_bytes: int = 2**20) -> list[ArrayInfo]:
    """Every array alive in this process with a buffer of at least ``min_bytes``, and
    the Python containers whose small arrays come to that much together.

    Names are the variables that hold the array (or a view of it, or the container) in
    ``__main__`` and in the frames of every thread's stack. memfit's own pipeline
    buffers are left out (:func:`memfit_buffers` counts them). Takes about half a
    second in a process with TensorFlow loaded (it looks at every tracked object once).

    Args:
        min_bytes: smaller buffers (and containers) are left out.
    """
    np = _numpy()
    if np is None:
        return []
    owners: dict[int, tuple[Any, bool, list[str]]] = {}
    objects = gc.get_objects()
    own = _own_arrays(objects)

    def add(candidate: Any) -> None:
        owner, mapped = owner_of(candidate)
        if owner.nbytes >= min_bytes and id(owner) not in owners and id(owner) not in own:
            owners[id(owner)] = (owner, mapped, [])

    ndarray = np.ndarray
    for obj in objects:
        for ref in gc.get_referents(obj):
            if isinstance(ref, ndarray):
                add(ref)
    for scope in _scopes():                 # locals of frames the collector does not track
        for value in list(scope.values()):
            if isinstance(value, ndarray):
                add(value)
    _name(owners)
    containers = _containers(objects, set(own), min_bytes, small=min_bytes)
    del objects
    return sorted(_infos(owners) + containers, key=lambda a: a.nbytes, reverse=True)
