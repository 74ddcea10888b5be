"""Frozen dataclasses written as JSON data and read back by their type hints.

What crosses a file in a workdir is data, never a pickle: a workdir may sit on a disk
that others can write, and unpickling a file runs whatever it says. A contract that is
a tree of dataclasses (the Ray driver's request and result) goes through :func:`dump`
and comes back through :func:`load`, which builds only the classes its type hints name
and checks every value against its hint; a value of the wrong type is an error naming
its place (``result.records['a'].peak``).

The types understood: dataclasses, ``str``, ``int``, ``float`` (an integer is accepted),
``bool``, ``None``, ``pathlib.Path`` (a string), enums (their value), ``tuple[X, ...]``,
fixed tuples ``tuple[A, B]``, ``list[X]``, ``dict``/``Mapping[str, X]``, unions such as
``X | None``, and ``Any`` (JSON data as it is).

Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Job:
    ...     name: str
    ...     peak: int | None = None
    ...     tags: tuple[str, ...] = ()
    >>> data = dump(Job("a", 5, ("x",)))
    >>> data
    {'name': 'a', 'peak': 5, 'tags': ['x']}
    >>> load(Job, data)
    Job(name='a', peak=5, tags=('x',))
    >>> load(Job, {"name": "a", "peak": "5"})
    Traceback (most recent call last):
    ...
    ValueError: Job.peak: expected int, found '5'
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memfit.atomic import write_text_atomic

__all__ = ["dump", "load", "write", "read"]


def dump(value: Any) -> Any:
    """``value`` as JSON data (dicts, lists, strings, numbers, booleans, ``None``).

    Args:
        value: a dataclass instance, or anything :func:`load` understands.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return dump(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): dump(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [dump(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"cannot write a {type(value).__name__} as JSON data: {value!r}")


def load(cls: Any, data: Any, where: str | None = None) -> Any:
    """The value of type ``cls`` that :func:`dump` wrote as ``data``.

    Args:
        cls: the type (a dataclass, or a hint such as ``tuple[int, ...]``).
        data: JSON data.
        where: the value's place, for errors (default: the type's name).

    Raises:
        ValueError: a value does not match its type hint (the message names its place).
    """
    return _load(cls, data, where or getattr(cls, "__name__", str(cls)))


def _name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _wrong(hint: Any, data: Any, where: str) -> ValueError:
    return ValueError(f"{where}: expected {_name(hint)}, found {str(data)[:80]!r}"
                      if isinstance(data, str) else
                      f"{where}: expected {_name(hint)}, found {type(data).__name__} "
                      f"{str(data)[:80]}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _load(hint: Any, data: Any, where: str) -> Any:
    if hint is Any:
        return data
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if data is None and type(None) in options:
            return None
        options = tuple(o for o in options if o is not type(None))
        if len(options) == 1:           # X | None: X's own error says where
            return _load(options[0], data, where)
        for option in options:
            try:
                return _load(option, data, where)
            except ValueError:
                continue
        raise _wrong(hint, data, where)
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(data, list):
            raise _wrong(hint, data, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise _wrong(hint, data, where)
        return tuple(_load(a, v, f"{where}[{i}]")
                     for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin is list:
        if not isinstance(data, list):
            raise _wrong(hint, data, where)
        (arg,) = typing.get_args(hint) or (Any,)
        return [_load(arg, v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(data, dict):
            raise _wrong(hint, data, where)
        args = typing.get_args(hint)
        value = args[1] if len(args) == 2 else Any
        return {k: _load(value, v, f"{where}[{k!r}]") for k, v in data.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(data, dict):
            raise _wrong(hint, data, where)
        fields = {f.name: f for f in dataclasses.fields(hint)}
        unknown = set(data) - set(fields)
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)} for {hint.__name__}")
        hints = _hints(hint)
        values = {}
        for name, f in fields.items():
            if name in data:
                values[name] = _load(hints[name], data[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and \
                    f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}: missing field {name!r}")
        return hint(**values)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise _wrong(hint, data, where) from None
    if hint is Path:
        if not isinstance(data, str):
            raise _wrong(hint, data, where)
        return Path(data)
    if hint is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if hint in (str, int, bool) and type(data) is hint:
        return data
    if hint is type(None) and data is None:
        return None
    raise _wrong(hint, data, where)


def write(path: str | os.PathLike, value: Any) -> None:
    """Writes ``dump(value)`` as JSON under a temporary name, then renames it (a reader
    never sees half a file; :func:`memfit.atomic.write_text_atomic`).

    Args:
        path: the file.
        value: what to write (see :func:`dump`).
    """
    write_text_atomic(path, json.dumps(dump(value)))


def read(cls: Any, path: str | os.PathLike) -> Any:
    """The ``cls`` that :func:`write` wrote to ``path``.

    Args:
        cls: its type.
        path: the file.

    Raises:
        ValueError: the file is not JSON, or a value does not match its type.
    """
    try:
        data = json.loads(Path(path).read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    return load(cls, data)
