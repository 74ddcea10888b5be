"""Lines a callback holds back until Keras has printed the epoch's line.

Keras runs the callbacks a user passes before its own progress bar, so a line printed in
``on_epoch_end`` under a bar lands above the epoch it is about (``Epoch 10/10``, the line,
then ``282/282 - 10s ...``). :class:`memfit.MemoryMonitor` holds its verdict here; it is
said at the next epoch's start, at the end of training, or before a restart's exit line
(:class:`memfit.supervise.callback.SessionCallback`), whichever comes first.
"""

from __future__ import annotations

import sys

__all__ = ["hold", "say_held"]

_HELD: list[str] = []


def hold(text: str) -> None:
    """Keeps ``text`` for :func:`say_held`.

    Args:
        text: one or more lines, without the final newline.

    Example:
        >>> hold("memfit: stable")
        >>> say_held()
    """
    _HELD.append(text)


def say_held() -> None:
    """Prints on stderr, in order, what :func:`hold` kept, and forgets it.

    Example:
        >>> say_held()          # nothing held: prints nothing
    """
    lines = list(_HELD)
    _HELD.clear()
    for text in lines:
        print(text, file=sys.stderr)
