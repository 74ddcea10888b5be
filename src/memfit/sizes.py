"""Byte sizes and counts: one parser and one printer for every budget memfit takes or
prints, and one printer for a count of things (``1 shard``, ``3 shards``).

Budgets are plain integers of bytes inside memfit. Users may write them the way they
think of them: ``"512MiB"``, ``"2GB"``, ``"1.5G"``, ``"4096"``; output always uses IEC
units (KiB, MiB, GiB) so that a number printed can be pasted back as an argument.

Example:
    >>> parse_size("1.5G")
    1610612736
    >>> format_size(3 * 2**20)
    '3.0 MiB'
    >>> format_count(1, "shard"), format_count(4096, "sample")
    ('1 shard', '4,096 samples')
"""

from __future__ import annotations

import math
import numbers
import re

__all__ = ["parse_size", "format_size", "format_count", "plural", "parse_budget",
           "BARE_MEMORY_FLOOR"]

_IEC = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_SI = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)


#: A memory size written as a bare number (no unit) below this is refused as a missing
#: unit: ``--budget 10`` was taken as 10 bytes and answered "nothing fits" (a stranger).
BARE_MEMORY_FLOOR = 2**20


def parse_size(value: str | int | float, *, name: str = "size", positive: bool = False,
               memory: bool = False) -> int:
    """Parses a byte size into an integer number of bytes.

    ``KiB/MiB/GiB`` and the short forms ``K/M/G`` are powers of 1024; ``KB/MB/GB`` are
    powers of 1000 (as disk makers and the SI use them); a bare number is bytes.

    Example:
        >>> parse_size("512MiB"), parse_size("2GB"), parse_size(4096)
        (536870912, 2000000000, 4096)

    Args:
        value: a string such as ``"512MiB"``, ``"2GB"``, ``"1.5G"``, ``"300"``, or a
            non-negative number of bytes.
        name: what the size is for, used in the error message (e.g. ``"memory_budget"``).
        positive: refuse 0 bytes too (a budget: nothing fits in none).
        memory: the size is memory for a process or a training to run in (a budget, an
            RSS limit): a string without a unit below :data:`BARE_MEMORY_FLOOR` (1 MiB) is
            refused as a unit left out (``"10"``, not ``"10GiB"``); a Python number is
            taken as the bytes it says.

    Returns:
        The size in bytes (rounded down to a whole byte).

    Raises:
        ValueError: if the value is not a size, quoting the received value.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a size such as '512MiB', '2GB' or a number of bytes. "
                         f"Received: {name}={value!r}")
    size = _parse(value, name)
    if memory and isinstance(value, str) and re.fullmatch(r"\s*[\d.]+\s*", value) \
            and 0 < float(value) < BARE_MEMORY_FLOOR:
        shown = value.strip()
        raise ValueError(f"A memory size without a unit is a number of bytes: {shown} is "
                         f"{format_size(size)}, too little for anything to run in. Give a "
                         f"unit, such as {shown}GiB or {shown}MiB (bare numbers are taken "
                         f"from 1 MiB up). Received: {name}={value!r}")
    if positive and size <= 0:
        raise ValueError(f"{name} must be more than 0 bytes, such as '2GiB'. "
                         f"Received: {name}={value!r}")
    return size


def parse_budget(value: str | int | float, name: str = "budget") -> int:
    """A memory budget: :func:`parse_size` of memory (``memory=True``), more than 0 bytes.

    Example:
        >>> parse_budget("8GiB")
        8589934592

    Args:
        value: the budget (``"8GiB"``, or bytes); name: what it is, for the message.
    """
    return parse_size(value, name=name, positive=True, memory=True)


def _parse(value: str | int | float, name: str) -> int:
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative number of bytes. "
                             f"Received: {name}={value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a size string such as '512MiB' or a number of bytes. "
                         f"Received: {name}={value!r} of type {type(value).__name__}")
    match = _PATTERN.match(value)
    if not match:
        raise ValueError(f"{name} is not a size: use a number with an optional unit, such as "
                         f"'512MiB', '2GB', '1.5G' or '4096'. Received: {name}={value!r}")
    number, prefix, binary, byte = match.groups()
    prefix = prefix.lower()
    if binary and not prefix:
        raise ValueError(f"{name} has a unit without a prefix. Received: {name}={value!r}")
    if prefix and byte and not binary and prefix in _SI:
        factor = _SI[prefix]            # "2GB": decimal, as written on disks
    else:
        factor = _IEC[prefix]           # "2GiB", "2G", "2": binary
    return int(float(number) * factor)


def format_size(num_bytes: int | float | None, *, signed: bool = False) -> str:
    """Formats a number of bytes with IEC units, e.g. ``'1.5 GiB'``.

    Example:
        >>> format_size(1536), format_size(-2**20, signed=True)
        ('1.5 KiB', '-1.0 MiB')

    Args:
        num_bytes: the size; ``None`` prints as ``'n/a'`` (a source that was absent).
        signed: print a ``+`` in front of positive values (for growth and deltas).
    """
    if num_bytes is None:
        return "n/a"
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, numbers.Real):
        raise TypeError(f"format_size formats a number of bytes (an int or a float); to read "
                        f"a size such as '2GiB', use parse_size. Received: {num_bytes!r}")
    sign = "-" if num_bytes < 0 else ("+" if signed and num_bytes > 0 else "")
    value = abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{int(value)} B" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(n: int | float, noun: str, many: str | None = None) -> str:
    """``noun`` as a count of ``n`` takes it: itself for 1, its plural otherwise.

    Example:
        >>> plural(1, "batch", "batches"), plural(2, "batch", "batches"), plural(0, "step")
        ('batch', 'batches', 'steps')

    Args:
        n: the count.
        noun: the singular.
        many: the plural, where it is not ``noun + "s"``.
    """
    return noun if n == 1 else (many if many is not None else noun + "s")


def format_count(n: int, noun: str, many: str | None = None) -> str:
    """A count and its noun, the count with thousands separators: ``'1 shard'``,
    ``'1,024 samples'``. Every line memfit prints that counts things uses it.

    Example:
        >>> format_count(1, "record"), format_count(0, "process", "processes")
        ('1 record', '0 processes')

    Args:
        n: the count.
        noun: the singular.
        many: the plural, where it is not ``noun + "s"``.
    """
    return f"{n:,} {plural(n, noun, many)}"
