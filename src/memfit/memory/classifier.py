"""Tell a leak from allocator retention, warm-up and a stable run, from epoch-end samples.

The input is one number per epoch: anonymous RSS at the end of the epoch (what running
out of memory is about; file-backed pages are page cache). The classifier:

1. drops the first ``warmup_epochs`` values (growth there is expected: traces, caches);
2. fits a robust slope (Theil–Sen: the median of all pairwise slopes, indifferent to a
   few outliers) to the rest, and compares the growth it predicts with the noise (the
   median absolute deviation of the residuals, and a floor of ``min_growth``); a leak
   must also still grow over the recent half of the epochs (else it is warm-up);
3. where growth is real, asks whether the memory had been freed already: if glibc's free
   bytes (``mallinfo2``, sampled beside RSS: ``held``) grew by most of the growth, or a
   ``malloc_trim(0)`` probe gives most of it back, it is allocator retention. (glibc's
   moving mmap threshold makes training steps' buffers come from its arenas after the
   first steps; RSS can then climb for several epochs while the bytes in use stay flat.)

Verdicts: ``stable``, ``warm-up`` (grew early, flat since), ``leak`` (keeps growing: with
MiB/epoch and when the budget would be hit), ``allocator-retention``, and ``too-short``
(too little of the run after its warm-up to judge: the verdict says how much is needed and
how much there was, instead of guessing). Each comes with a paragraph of explanation and
the fix.

Example:
    >>> v = classify([100e6, 110e6, 120e6, 130e6, 140e6, 150e6], warmup_epochs=1)
    >>> v.kind, round(v.slope / 2**20, 1)
    ('leak', 9.5)
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from memfit import checks
from memfit.sizes import format_size

__all__ = ["Verdict", "classify", "classify_release", "theil_sen", "too_short",
           "EXPLANATIONS", "KINDS", "TOO_SHORT", "MIN_VALUES", "MIN_GROWTH", "KEPT_MIN",
           "KEPT_SHARE", "RETENTION_FIX", "LEAK_CAUSES", "explained"]

MIN_VALUES = 4                  # epoch-end values after warm-up needed to judge at all
TOO_SHORT = "too-short"         # the verdict on a run too short to judge
#: Every verdict, in the order the views list them.
KINDS = ("stable", "warm-up", "leak", "allocator-retention", TOO_SHORT)

MIN_GROWTH = 16 * 2**20         # below this, growth over the run is noise in a TF process
NOISE_FACTOR = 4.0              # growth must exceed this many MADs of the residuals
RETAINED_SHARE = 0.5            # trim giving back this share of the growth: retention
KEPT_MIN = 32 * 2**20           # a trim after del + gc.collect() giving back this much ...
KEPT_SHARE = 0.10               # ... and this share of what stayed: retention after del

#: The fix for allocator retention, in order of preference (every view says the same).
RETENTION_FIX = (
    "In order of preference: (1) stream the data instead of building it in Python lists "
    "(`memfit pack` + `memfit.dataset`): nothing to free, nothing kept; (2) give the "
    "freed memory back: MemoryMonitor(trim='epoch'), or `memfit.malloc_trim()` right "
    "after gc.collect(); (3) last resort: `memfit run --restart-every 1 -- python "
    "train.py` (one process per epoch, resumed exactly).")

#: What usually holds the references when memory keeps growing (every view says the same).
LEAK_CAUSES = (
    "Usual causes: model.predict/fit called in a loop, models built in a loop without "
    "keras.backend.clear_session(), a tf.function called with new Python scalars (it "
    "retraces every time; pass tensors), a tf.data.Dataset rebuilt every epoch, or a global "
    "list that keeps batches.")

EXPLANATIONS = {
    "stable": (
        "Memory at the end of each epoch stays level: nothing accumulates from epoch to "
        "epoch.",
        "Nothing to fix. If the process is still too big, the level itself is the problem: "
        "stream the data (`memfit pack` + `memfit.dataset`) or lower the batch size."),
    "warm-up": (
        "Memory grew in the first epochs and has been level since: caches, tf.function "
        "traces, allocator pools and pipeline buffers filling up once. This is not a leak.",
        "Nothing to fix: memory stopped growing. Count this level in your budget; if it is "
        "more than you expect, `memfit doctor -- python train.py` measures what holds it "
        "(data in RAM, buffers, memory the allocator keeps)."),
    "leak": (
        "Memory keeps growing epoch after epoch: something holds references. " + LEAK_CAUSES,
        "Find the reference that grows and remove it (clear_session() between models, "
        "tensors instead of Python numbers into tf.function, build datasets once). Until "
        "then, MemoryMonitor(budget=..., on_leak='stop') stops training cleanly, or "
        "on_leak='restart' under memfit run with a memfit.session checkpoints and "
        "restarts the process, resuming exactly."),
    "allocator-retention": (
        "RSS grew, but a malloc_trim(0) probe gave most of it back: the memory had been "
        "freed, and glibc kept it in its arenas for reuse. This looks like a leak in "
        "`top` and is not one.",
        RETENTION_FIX),
    TOO_SHORT: (
        "Too little of the run after its warm-up to tell growth from noise: memfit does "
        "not guess. Growth early in a run is expected (traces, caches, pools); only what "
        "comes after it tells a leak from a level.",
        f"Train for more epochs (at least {MIN_VALUES} after warmup_epochs) or lower "
        "warmup_epochs."),
}

# A verdict's first sentence where its values are not epoch ends: slices of a run's
# steady time seen from outside (memfit watch, memfit run), or of its training steps
# (memfit doctor's probe). A stranger's report read "at the end of each epoch" of a run
# with no epoch.
_OVER = {
    "time": {
        "stable": "Anonymous RSS stays level through the run's steady time (after its "
                  "start-up and warm-up): nothing accumulates while it runs.",
        "warm-up": "Anonymous RSS grew early in the run's steady time and has been level "
                   "since: caches, traces, allocator pools and pipeline buffers filling up "
                   "once. This is not a leak.",
        "leak": "Anonymous RSS keeps growing through the run's steady time: something "
                "holds references. " + LEAK_CAUSES},
    "steps": {
        "stable": "Memory stays level from training step to training step: nothing "
                  "accumulates as training goes on.",
        "warm-up": "Memory grew in the first training steps and has been level since: "
                   "caches, tf.function traces, allocator pools and pipeline buffers filling "
                   "up once. This is not a leak.",
        "leak": "Memory keeps growing step after step: something holds references. "
                + LEAK_CAUSES},
}


def explained(verdict: Verdict, basis: str) -> str:
    """``verdict``'s explanation in the words of what was judged: ``"epochs"`` (as it is),
    ``"time"`` (slices of a run's steady time) or ``"steps"`` (slices of its training
    steps); what the verdict adds after its first sentence (a probe's result) is kept.

    Example:
        >>> explained(classify([100, 100, 100, 100, 100, 100]), "time")[:40]
        'Anonymous RSS stays level through the ru'
    """
    said, kind = verdict.explanation, verdict.kind
    first = EXPLANATIONS.get(kind, ("",))[0]
    if basis == "epochs" or kind not in _OVER.get(basis, {}) or not said.startswith(first):
        return said
    return _OVER[basis][kind] + said[len(first):]


_UNITS = {"epochs": "epoch ends after the warm-up",
          "s": "s of steady time after the start-up and warm-up",
          "time slices": "time slices with samples (of 10) in the steady time"}


def theil_sen(values: Sequence[float]) -> float:
    """The Theil–Sen slope of ``values`` against their index (per step)."""
    n = len(values)
    if n < 2:
        return 0.0
    return statistics.median((values[j] - values[i]) / (j - i)
                             for i in range(n) for j in range(i + 1, n))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The classifier's answer, with the numbers behind it.

    Attributes:
        kind: ``stable``, ``warm-up``, ``leak``, ``allocator-retention`` or ``too-short``.
        slope: bytes per epoch after the warm-up (Theil–Sen).
        growth: bytes from the first epoch-end sample after warm-up to the last.
        noise: the growth threshold that was used, in bytes.
        epochs: epoch-end samples considered.
        released: bytes a trim probe gave back (``None``: no probe).
        held: how much glibc's free bytes grew over the same epochs (``None``: not
            sampled).
        epochs_to_budget: for a leak with a budget, epochs until it is reached.
        needed: for ``too-short``, how much of the run the judge needs, in ``unit``.
        had: for ``too-short``, how much there was, in ``unit``.
        unit: what ``needed`` and ``had`` count: ``"epochs"`` (epoch ends after the
            warm-up), ``"s"`` (seconds of steady time, seen from outside) or
            ``"time slices"`` (time slices with samples, seen from outside).
    """

    kind: str
    slope: float
    growth: int
    noise: float
    epochs: int
    released: int | None = None
    held: int | None = None
    budget: int | None = None
    epochs_to_budget: float | None = None
    kept: int | None = None
    before: int | None = None
    needed: float | None = None
    had: float | None = None
    unit: str = "epochs"
    in_use: int | None = None

    @property
    def explanation(self) -> str:
        text = EXPLANATIONS[self.kind][0]
        if self.kept is not None:
            return ("After del + gc.collect() the memory was free for Python, and glibc kept "
                    "it in its arenas for reuse: this is the allocator keeping freed memory, "
                    "not a Python leak. It is why memory stays high after `del`, and why a "
                    "process that builds its data again every epoch can run out of memory.")
        if self.kind == "allocator-retention" and self.held is not None and \
                (self.released is None or self.released < RETAINED_SHARE * self.growth):
            return ("RSS grew, and glibc's free bytes (mallinfo2) grew by most of it: the "
                    "memory had been freed, and glibc kept it in its arenas for reuse. This "
                    "looks like a leak in `top` and is not one: the bytes in use did not "
                    "grow.")
        if self.kind == "leak":
            text += (" The bytes glibc has handed out (mallinfo2) grew with it: live "
                     "allocations hold the memory, so it is not allocator retention."
                     if self.in_use is not None and self.in_use >= RETAINED_SHARE
                     * max(self.growth, 1) else
                     " A malloc_trim(0) probe did not give the memory back, so it is not "
                     "allocator retention." if self.released is not None else
                     " No malloc_trim(0) probe ran here, so allocator retention is not ruled "
                     "out (MemoryMonitor in the training process can probe it).")
        return text

    @property
    def fix(self) -> str:
        return EXPLANATIONS[self.kind][1]

    @property
    def headline(self) -> str:
        """One line: the verdict and its numbers."""
        if self.kind == TOO_SHORT:
            return f"too short to judge: {self.need}"
        if self.kept is not None:
            released = self.released or 0
            return (f"{self.kind}: after del + gc.collect() anonymous RSS stayed at "
                    f"{format_size(self.kept)} ({format_size(self.before)} at the end of "
                    f"fit); malloc_trim gave back {format_size(released)} of it (to "
                    f"{format_size(self.kept - released)})")
        text = (f"{self.kind}: {format_size(self.growth, signed=True)} after warm-up, "
                f"{format_size(self.slope, signed=True)}/epoch over {self.epochs} epochs")
        if self.kind in ("stable", "warm-up"):
            text += f" (within the noise threshold of {format_size(self.noise)} a run)"
        if self.held is not None and self.kind == "allocator-retention":
            text += f"; glibc's free bytes {format_size(self.held, signed=True)}"
        if self.in_use is not None and self.kind == "leak":
            text += f"; glibc's bytes in use {format_size(self.in_use, signed=True)}"
        if self.released is not None:
            text += f"; malloc_trim gave back {format_size(self.released)}"
        if self.epochs_to_budget is not None:
            text += (f"; reaches the {format_size(self.budget)} budget in about "
                     f"{self.epochs_to_budget:.0f} more epochs")
        return text

    @property
    def need(self) -> str:
        """For ``too-short``: how much the judge needs and how much there was, e.g.
        ``"needs ≥ 5 s of steady time after the start-up and warm-up, had 2.3 s"``."""
        def number(x: float | None) -> str:
            return "?" if x is None else f"{x:.1f}" if self.unit == "s" else f"{x:.0f}"
        seconds = " s" if self.unit == "s" else ""
        return (f"needs ≥ {number(self.needed)} {_UNITS.get(self.unit, self.unit)}, had "
                f"{number(self.had)}{seconds}")

    def __str__(self) -> str:
        return f"{self.headline}\n{self.explanation}\nFix: {self.fix}"

    def to_record(self) -> dict:
        """Fields for a ``verdict`` event of the log."""
        return {"verdict": self.kind, "slope": self.slope, "growth": self.growth,
                "noise": self.noise, "epochs": self.epochs, "released": self.released,
                "held": self.held,
                "epochs_to_budget": self.epochs_to_budget, "headline": self.headline,
                "explanation": self.explanation, "fix": self.fix, "kept": self.kept,
                "before": self.before, "needed": self.needed, "had": self.had,
                "unit": self.unit, "in_use": self.in_use}


def too_short(needed: float, had: float, unit: str = "epochs", *, growth: float = 0,
              epochs: int = 0) -> Verdict:
    """The ``too-short`` verdict: the judge needs ``needed`` (in ``unit``), the run had
    ``had``.

    Example:
        >>> v = too_short(5.0, 2.3, "s")
        >>> v.kind, v.need
        ('too-short', 'needs ≥ 5.0 s of steady time after the start-up and warm-up, had 2.3 s')

    Args:
        needed: how much of the run the judge needs.
        had: how much the run had.
        unit: ``"epochs"``, ``"s"`` or ``"time slices"`` (see :class:`Verdict`).
        growth: bytes from the first value to the last, for the record.
        epochs: values considered, for the record.
    """
    return Verdict(TOO_SHORT, 0.0, int(growth), 0.0, epochs, needed=float(needed),
                   had=float(had), unit=unit)


def classify_release(releases: Sequence[Any], *, min_released: float = KEPT_MIN,
                     share: float = KEPT_SHARE) -> Verdict | None:
    """Allocator retention seen right after ``del`` + ``gc.collect()``, or ``None``.

    Example:
        >>> from memfit.memory.allocator import Release
        >>> v = classify_release([Release(600 * 2**20, 455 * 2**20, 230 * 2**20)])
        >>> v.kind, v.kept == 455 * 2**20
        ('allocator-retention', True)

    Args:
        releases: :class:`memfit.memory.allocator.Release` records (``before``,
            ``after_collect``, ``released``), one per collection between ``fit`` calls.
        min_released: bytes a trim must give back to count as retention.
        share: ... and this share of what stayed after the collection.
    """
    best = max((r for r in releases if r.released is not None),
               key=lambda r: r.released, default=None)
    if best is None or best.released < max(min_released, share * best.after_collect):
        return None
    return Verdict("allocator-retention", slope=0.0, growth=0, noise=float(min_released),
                   epochs=len(releases), released=int(best.released),
                   kept=int(best.after_collect), before=int(best.before))


def classify(values: Sequence[float], *, warmup_epochs: int = 1, budget: int | None = None,
             trim_probe: Callable[[], int | None] | None = None,
             min_growth: float = MIN_GROWTH,
             held: Sequence[float] | None = None,
             in_use: Sequence[float] | None = None) -> Verdict:
    """Classifies the memory of a run from one anonymous-RSS value per epoch end.

    Args:
        values: anonymous RSS (bytes) at the end of each epoch, in order.
        warmup_epochs: epochs excluded from the slope (growth there is expected).
        budget: bytes the process may use; a leak gets a projection of when it is reached.
        trim_probe: called once when growth is real; returns the bytes ``malloc_trim``
            released (``None`` if it cannot trim: retention is then not diagnosed).
        min_growth: growth, in bytes over the run, below which nothing is diagnosed.
        held: glibc's free bytes (:func:`memfit.memory.allocator.malloc_free`) at the
            same instants as ``values``; where they grew by :data:`RETAINED_SHARE` of the
            growth or more, the growth is allocator retention (ignored unless as long as
            ``values``).
        in_use: the bytes glibc has handed out (:func:`memfit.memory.allocator.malloc_in_use`)
            at the same instants; where they grew by :data:`RETAINED_SHARE` of the growth or
            more, live allocations hold it: it is not allocator retention, whatever a trim
            gives back (free memory that was there before; ignored unless as long as
            ``values``).
    """
    warmup_epochs = checks.count("warmup_epochs", warmup_epochs, minimum=0, example=1)
    values = [float(v) for v in values]
    after = values[warmup_epochs:]
    if len(after) < MIN_VALUES:     # three points cannot tell slow warm-up from a leak
        return too_short(MIN_VALUES, len(after), growth=values[-1] - values[0] if values
                         else 0, epochs=len(values))
    slope = theil_sen(after)
    intercept = statistics.median(v - slope * i for i, v in enumerate(after))
    residuals = [v - (intercept + slope * i) for i, v in enumerate(after)]
    mad = statistics.median(abs(r) for r in residuals)
    noise = max(min_growth, NOISE_FACTOR * mad)
    growth = after[-1] - after[0]           # growth after the warm-up epochs
    trend = slope * (len(after) - 1)
    # A leak is still growing at the end: the recent half's rate, over the whole period,
    # must be significant too; growth that has levelled off is warm-up.
    late = after[len(after) // 2:]
    recent = theil_sen(late) * (len(after) - 1)
    kind = "stable"
    if trend > noise and recent > noise:
        kind = "leak"
    elif max(growth, max(after) - after[0]) > noise:
        kind = "warm-up"                    # grew after warm-up, but not as a trend
    grown = max(growth, trend)
    used = None
    if in_use is not None and len(in_use) == len(values):
        live = [float(v) for v in in_use[warmup_epochs:]]
        used = int(max(live[-1] - live[0], theil_sen(live) * (len(live) - 1)))
    # Live allocations grew with it: not memory freed and kept (JAX's leak of 19 MiB an
    # epoch was called retention after a trim gave back 36 MiB of other free memory).
    allocated = used is not None and grown > 0 and used >= RETAINED_SHARE * grown
    freed = None
    if held is not None and len(held) == len(values):
        kept = [float(v) for v in held[warmup_epochs:]]
        freed = int(max(kept[-1] - kept[0], theil_sen(kept) * (len(kept) - 1)))
        if kind != "stable" and grown > 0 and freed >= RETAINED_SHARE * grown \
                and not allocated:
            kind = "allocator-retention"
    released = None
    if kind != "stable" and trim_probe is not None:
        released = trim_probe()
        if released is not None and released >= RETAINED_SHARE * grown and not allocated:
            kind = "allocator-retention"
    to_budget = None
    if kind == "leak" and budget is not None and slope > 0:
        to_budget = max(0.0, (budget - values[-1]) / slope)
    return Verdict(kind=kind, slope=slope, growth=int(growth), noise=noise,
                   epochs=len(values), released=released, held=freed, budget=budget,
                   epochs_to_budget=to_budget, in_use=used)
