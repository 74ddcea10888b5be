"""Exit codes that memfit's processes use to talk to each other.

``RESTART`` (75, ``EX_TEMPFAIL``: "temporary failure, try again"): a training process
checkpointed and asks its supervisor (`memfit run`) to start it again — e.g. after
``--restart-every`` epochs, a ``--max-rss`` request, or ``MemoryMonitor(on_leak="restart")``.
``CONFIG`` (78, ``EX_CONFIG``): a training process found that it cannot run as
configured (its workdir holds another model's checkpoints, ``--max-rss`` is below its
baseline...); a supervisor stops instead of restarting it.
``CHECKPOINT_FAILED`` (74, ``EX_IOERR``): a training process could not write its
checkpoint (disk full, file-size limit); the previous one is kept, and a supervisor
stops, since a restart would fail the same way.
``DATA_ERROR`` (65, ``EX_DATAERR``): a training process met a damaged, truncated or
missing shard (memfit's ``CorruptShardError``); a supervisor stops, since a restart would
read the same bytes.
``START_COLD`` (76): a training process that a warm parent forked (``memfit run``'s warm
start) found it changed a variable the frameworks read when imported; a supervisor
starts it again as a new interpreter, and starts every later one so.
``NOT_FOUND`` (127): the command to run does not exist, as in a shell.

A process killed by signal N exits, as a shell reports it, with ``128 + N``;
:func:`signal_name` names N.

Example:
    >>> signal_name(15), signal_name(137 - 128), signal_name(99)
    ('SIGTERM', 'SIGKILL', 'signal 99')
"""

import signal

__all__ = ["DATA_ERROR", "CHECKPOINT_FAILED", "RESTART", "START_COLD", "CONFIG", "NOT_FOUND",
           "signal_name"]

DATA_ERROR = 65
CHECKPOINT_FAILED = 74
RESTART = 75
START_COLD = 76
CONFIG = 78
NOT_FOUND = 127


def signal_name(number: int) -> str:
    """A signal's name (``"SIGTERM"``), or ``"signal N"`` for a number without one.

    Args:
        number: the signal's number (an exit code ``128 + N``: give ``N``).
    """
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
