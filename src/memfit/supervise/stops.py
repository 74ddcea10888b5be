"""Why ``memfit run`` stops instead of restarting once more: failures that restarting will
not cure, judged from the processes run so far (:class:`~memfit.supervise.run_results.ChildRun`).

- :func:`repeated`: the same failure at the same checkpoint twice in a row, with no
  progress between (a bug, a batch that can never fit).
- :func:`memory_stall`: restarts for ``--max-rss`` that each get no further than a step
  past where they resumed: the training needs about ``--max-rss`` to start and take a
  step, so each process restarts as soon as it has begun (a stranger's run took 11
  one-step processes before ``--max-restarts`` stopped it, with no hint why).
- :func:`tally`: the restarts counted by cause, for the stop at ``--max-restarts``.

Example:
    >>> from memfit.supervise.run_results import Cause, ChildRun
    >>> def child(resumed, ended, mib=700):
    ...     from memfit.memory.probe import Sample
    ...     peak = Sample(t=0.0, pid=1, rss=mib * 2**20, rss_anon=mib * 2**20, rss_file=0)
    ...     return ChildRun(pid=1, exit_code=75, cause=Cause.RESTART, reason="max-rss",
    ...                     started=0.0, ended=1.0, peak=peak, resumed_at=resumed,
    ...                     ended_at=ended)
    >>> runs = [child((0, 0), (0, 1)), child((0, 1), (0, 2)), child((0, 2), (0, 3))]
    >>> print(memory_stall(runs, 600 * 2**20))  # doctest: +ELLIPSIS
    3 processes in a row reached --max-rss 600.0 MiB within one step of where they resumed ...
"""

from __future__ import annotations

import collections
import signal
from collections.abc import Sequence

from memfit.sizes import format_size
from memfit.supervise.checkpoint import where
from memfit.supervise.run_results import Cause, ChildRun

__all__ = ["STALLED_AFTER", "memory_stall", "repeated", "tally"]

# Restarts for --max-rss in a row, each within a step of where it resumed, that stop a run.
STALLED_AFTER = 3

# Exit statuses of a process ended by a SIGTERM or a SIGINT (as Popen and a shell give them).
_SENT_FROM_OUTSIDE = {-signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGINT,
                      128 + signal.SIGINT}


def repeated(children: Sequence[ChildRun]) -> str | None:
    """A stop reason when the last two processes failed the same way at the same place.

    Args:
        children: the run's processes so far, in order.
    """
    if len(children) < 2:
        return None
    a, b = children[-2], children[-1]
    same = (a.cause, a.exit_code, a.ended_at) == (b.cause, b.exit_code, b.ended_at)
    if not same or b.progressed:
        return None
    if b.cause == Cause.KILLED and (b.exit_code in _SENT_FROM_OUTSIDE or
                                    (a.oom_killed is False and b.oom_killed is False)):
        # a SIGTERM or SIGINT someone sent the training, or SIGKILLs the kernel's OOM
        # killer did not send: not a failure that repeats by itself (a stranger's two
        # SIGTERMs during the start-up were called one "it will not go away by
        # restarting", and on JAX, random SIGKILLs landing twice in the recompile before
        # the first checkpoint); --max-restarts still bounds them
        return None
    if b.cause == Cause.RESTART and b.reason == "max-rss":
        return (f"two restarts for --max-rss in a row made no progress past "
                f"{where(*b.ended_at)}: the training needs more memory than --max-rss to take "
                f"a step; raise --max-rss or lower the batch size")
    return (f"{b.cause} ({b.reason}) twice in a row at {where(*b.ended_at)}, with no progress "
            f"in between: it will not go away by restarting")


def _one_step(child: ChildRun) -> bool:
    """Whether ``child`` restarted for ``--max-rss`` within one step of where it resumed."""
    (e0, s0), (e1, s1) = child.resumed_at, child.ended_at
    return child.cause == Cause.RESTART and child.reason == "max-rss" and e1 == e0 \
        and s1 - s0 <= 1


def memory_stall(children: Sequence[ChildRun], max_rss: int | None) -> str | None:
    """A stop reason when the last :data:`STALLED_AFTER` processes each reached
    ``max_rss`` within one step of where they resumed: the run would take a process a
    step. Says the peaks they reached and what to raise ``--max-rss`` above.

    Args:
        children: the run's processes so far, in order.
        max_rss: the run's ``--max-rss`` in bytes (``None``: no such limit, no stall).
    """
    last = list(children[-STALLED_AFTER:])
    if max_rss is None or len(last) < STALLED_AFTER or not all(map(_one_step, last)):
        return None
    peaks = [c.peak.anon_or_total for c in last if c.peak is not None]
    seen = (f" (their peaks {format_size(min(peaks))}–{format_size(max(peaks))})"
            if peaks else "")
    return (f"{len(last)} processes in a row reached --max-rss {format_size(max_rss)} within "
            f"one step of where they resumed{seen}, so each would restart as soon as it has "
            f"begun: the training needs about that much to start and take a step. Raise "
            f"--max-rss above {format_size(max(peaks + [max_rss]))} or lower the batch size")


def tally(children: Sequence[ChildRun]) -> str:
    """The restarts among ``children`` counted by why they happened, for a stop at
    ``--max-restarts``: ``"9 for --max-rss, 2 killed"``; with the fix when most were for
    ``--max-rss``.

    Args:
        children: the processes that restarted unasked (not by ``--restart-every``).
    """
    counts = collections.Counter(
        "for --max-rss" if c.cause == Cause.RESTART and c.reason == "max-rss" else str(c.cause)
        for c in children)
    said = ", ".join(f"{n} {why}" for why, n in counts.most_common())
    if counts["for --max-rss"] * 2 > len(children):
        said += ("; a process reaches --max-rss soon after it starts: raise --max-rss or "
                 "lower the batch size")
    return said
