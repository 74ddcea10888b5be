"""The one set of argument checks behind every public function and subcommand.

Each check returns the value (converted where that is safe: a NumPy integer becomes an
``int``) or raises ``ValueError`` saying what was wrong, with the value, and what to
give instead, in one wording everywhere::

    batch_size must be an integer >= 1, such as 32. Received: batch_size=0

The rules are the same for every argument of a kind: a count is an integer (``bool``
is not one; a NumPy integer is), a number of seconds is a finite real number, a flag is
a ``bool``. ``None`` passes only where the caller says it may (``optional=True``).

Example:
    >>> count("epochs", 3)
    3
    >>> seconds("interval", 0.5)
    0.5
    >>> count("epochs", True)
    Traceback (most recent call last):
    ...
    ValueError: epochs must be an integer >= 1, such as 3. Received: epochs=True
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["count", "number", "seconds", "flag", "choice"]


def count(name: str, value: Any, *, minimum: int = 1, optional: bool = False,
          example: int | None = None, hint: str = "") -> Any:
    """An integer ``>= minimum`` (``None`` too with ``optional``).

    Args:
        name: the argument's name, as the user wrote it.
        value: what was given.
        minimum: the smallest value allowed (``0`` for "non-negative").
        optional: whether ``None`` is allowed (it is returned as is).
        example: a value to suggest in the message (default: ``max(minimum, 3)``).
        hint: a sentence added to the message (what the argument is for).
    """
    if value is None and optional:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and int(value) >= minimum:
        return int(value)
    raise ValueError(f"{name} must be an integer >= {minimum}"
                     f"{' (or None)' if optional else ''}, such as "
                     f"{max(minimum, 3) if example is None else example}.{_hint(hint)} "
                     f"Received: {name}={value!r}")


def number(name: str, value: Any, *, minimum: float = 0, example: float = 1,
           hint: str = "") -> float:
    """A finite real number ``>= minimum`` (a share of CPUs, a fraction...).

    Example:
        >>> number("num_cpus", 0.5)
        0.5

    Args:
        name: the argument's name.
        value: what was given.
        minimum: the smallest value allowed.
        example: a value to suggest in the message.
        hint: a sentence added to the message.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= minimum:
        return float(value)
    raise ValueError(f"{name} must be a number >= {minimum:g}, such as {example:g}."
                     f"{_hint(hint)} Received: {name}={value!r}")


def seconds(name: str, value: Any, *, positive: bool = True, optional: bool = False,
            example: float = 0.5, hint: str = "") -> Any:
    """A finite number of seconds: above zero, or with ``positive=False`` zero or more.

    Args:
        name: the argument's name.
        value: what was given.
        positive: whether zero is refused.
        optional: whether ``None`` is allowed (returned as is).
        example: a value to suggest in the message.
        hint: a sentence added to the message.
    """
    if value is None and optional:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and math.isfinite(value) and (value > 0 if positive else value >= 0):
        return float(value)
    kind = "positive" if positive else "non-negative"
    raise ValueError(f"{name} must be a {kind} number of seconds"
                     f"{' (or None)' if optional else ''}, such as {example:g}.{_hint(hint)} "
                     f"Received: {name}={value!r}")


def flag(name: str, value: Any) -> bool:
    """``True`` or ``False`` (not 0/1, not a string)."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be True or False. Received: {name}={value!r}")


def choice(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """One of ``allowed``."""
    if value in allowed and isinstance(value, type(allowed[0])):
        return value
    raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}. "
                     f"Received: {name}={value!r}")


def _hint(hint: str) -> str:
    return f" {hint}" if hint else ""
