"""``memfit find-batch-size``: the largest batch size that really fits, found safely.

Every attempt runs in a child process (:func:`memfit.estimate.measure.measure_training`)
whose process tree this process watches with the one probe: a child whose anonymous RSS
passes the budget is killed and the batch size "does not fit"; so is one that runs out
of memory on its own. This process builds no model and never holds the memory at stake.

The search starts from the estimate (made in a child too): the largest batch size whose
high end fits (the safe end of its range). From the peak that trial measured it aims at
the batch size where the peak reaches the budget (the estimate's bytes a sample, then the
slope of two measured peaks), 1 % inside. It stops where two fitted peaks far apart put the
batch just past the answer within ``precision`` (3 % by default) over the budget, or, where
they do not (or with ``prove=True``), proves the edge with one trial there
(``tests/estimate/test_batch_search.py`` simulates 200 searches a row;
``benchmarks/search_simulation.py`` replays the family panel's recorded searches). Where
aiming stalls, or without an estimate (grow by ``step_factor`` from a batch that fits,
shrink from one that does not), it bisects until the bracket is within ``precision`` (or
``max_trials`` children ran).

On the CPU every child, the estimate's too, is forked from one warm parent that imported
the frameworks once (:func:`memfit.estimate.measure.warm_children`; ``warm=False``,
``--cold``: new interpreters), so a search pays ``import tensorflow`` once, not once a
child; a forked child measures what a new interpreter measures
(``benchmarks/warm_children.py``).

Example:
    >>> r = find_batch_size("mymodels:make_cnn", "2GiB")          # doctest: +SKIP
    >>> print(r)                                                  # doctest: +SKIP
    largest batch size that fits 2.0 GiB: 412 (measured peak 1.96 GiB; estimate said 420)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from memfit import checks
from memfit.estimate.advice import after_measuring
from memfit.estimate.baseline import ensure_calibration
from memfit.estimate.measure import ChildResult, measure_training, run_child, warm_children
from memfit.estimate.model import (
    EstimateError,
    ModelSpec,
    check_policy,
    input_errors,
    parse_input_shape,
)
from memfit.estimate.optimizers import check_optimizer
from memfit.frameworks import require_for_training
from memfit.memory.allocator import check_policy as check_allocator
from memfit.sizes import format_count, format_size, parse_budget

__all__ = ["SearchResult", "Trial", "find_batch_size"]


@dataclasses.dataclass(frozen=True)
class Trial:
    """One child process of the search: a batch size, what happened, the peak seen, and
    how the child started (``"warm"``: forked after one import of the frameworks, see
    :func:`memfit.estimate.measure.warm_children`; ``"cold"``: a new interpreter)."""

    batch_size: int
    status: str
    peak: int | None
    seconds: float
    started: str = "cold"

    @property
    def fits(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What :func:`find_batch_size` found.

    Attributes:
        batch_size: the largest batch size that ran within the budget (0: none did).
        peak: its measured peak anonymous RSS in bytes (the whole process).
        budget: the budget, in bytes.
        estimated: the batch size the estimate proposed (the search's start): the
            largest whose high end fits.
        estimated_point, estimated_low: the largest batch sizes whose point and low end
            fit (the other end of the estimate's range), where the estimate gave them.
        smallest_failing: the smallest batch size that did not fit, or ``None`` (then
            ``batch_size`` is only a lower bound: see ``lower_bound``, unless
            ``inferred_failing`` is set).
        inferred_failing: the batch size just past ``precision`` that the measured peaks
            put over the budget (their slope, from two fitted batch sizes far apart),
            where the search stopped on that instead of running it; ``None`` where a
            child proved the edge or the search did not stop on the peaks.
        trials: every child run, in order.
        advice: what to change when nothing fits.
        cold_reason: why children that were to be forked from the warm parent ran as new
            interpreters (a model module that sets a variable read at import), else
            ``None``.
    """

    batch_size: int
    peak: int | None
    budget: int
    estimated: int
    smallest_failing: int | None
    trials: tuple[Trial, ...]
    advice: tuple[str, ...] = ()
    estimated_point: int | None = None
    estimated_low: int | None = None
    precision: float | None = None
    inferred_failing: int | None = None
    cold_reason: str | None = None

    @property
    def lower_bound(self) -> bool:
        """``batch_size`` fits but no larger size failed: the largest may be larger."""
        return (bool(self.batch_size) and self.smallest_failing is None
                and self.inferred_failing is None)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["lower_bound"] = self.lower_bound
        out["trials"] = [dataclasses.asdict(t) for t in self.trials]
        out["advice"] = list(self.advice)
        return out

    def __str__(self) -> str:
        lines = []
        for t in self.trials:
            peak = format_size(t.peak) if t.peak is not None else "n/a"
            lines.append(f"  batch {t.batch_size:>7}: {t.status:<11} peak {peak:>10}  "
                         f"({t.seconds:.0f} s)")
        if self.batch_size and self.lower_bound:
            head = (f"at least batch size {self.batch_size} fits {format_size(self.budget)} "
                    f"(measured peak {format_size(self.peak)}; the estimate said "
                    f"{self.estimated}): a lower bound, not the largest: no larger size was "
                    f"found to fail within {format_count(len(self.trials), 'trial')}. Raise "
                    f"--max-trials (max_trials=) or --start (start=) to find the largest")
        elif self.batch_size:
            head = (f"largest batch size that fits {format_size(self.budget)}: "
                    f"{self.batch_size} (measured peak {format_size(self.peak)}; the "
                    f"estimate said {self.estimated})")
            if self.inferred_failing is not None:
                head += (f"; the measured peaks put batch {self.inferred_failing} over the "
                         f"budget (not run: a trial there is as noisy as the peaks; "
                         f"--prove runs it)")
            gap = (self.smallest_failing - self.batch_size) / self.batch_size \
                if self.smallest_failing and self.inferred_failing is None else 0.0
            if self.precision is not None and gap > self.precision \
                    and self.smallest_failing - self.batch_size > 1:
                # a stranger's --max-trials 5 ended with 127 fitting and 151 not, 19 %
                # apart, under a 3 % precision, and the answer read as exact
                head += (f", known within {gap:.0%} only: batch {self.smallest_failing} "
                         f"did not fit, and the trials ran out before the "
                         f"{self.precision:.0%} asked. Raise --max-trials (max_trials=) "
                         f"to narrow it")
        else:
            head = f"no batch size fits {format_size(self.budget)}"
        return "\n".join([head, *lines, self._against(), *(f"  - {a}" for a in self.advice)])

    def _against(self) -> str:
        """One line: the trials it took, and the answer against the estimate's range."""
        said = f"  {format_count(len(self.trials), 'trial')}"
        started = {t.started for t in self.trials}
        if started == {"warm"}:
            said += " (each forked after one import of the frameworks)"
        elif "warm" in started:
            said += " (forked after one import of the frameworks, then as new interpreters"
            said += f": {self.cold_reason})" if self.cold_reason else ")"
        elif self.cold_reason:
            said += f" (new interpreters: {self.cold_reason})"
        said += "; the estimate"
        if self.estimated_low == 0 and not self.estimated_point and not self.estimated:
            # a model too big for batch 1 read "safe 0, point 0, optimistic 0"
            said += " said no batch fits, even at its optimistic end"
        elif self.estimated_point is not None and self.estimated_low is not None:
            said += (f"'s range: safe {self.estimated}, point {self.estimated_point}, "
                     f"optimistic {self.estimated_low}")
        else:
            said += f" said {self.estimated}"
        if self.batch_size and self.estimated:
            said += f"; the answer is {self.batch_size / self.estimated:.2f}× the safe end"
        return said


def _estimate_in_child(spec: ModelSpec, budget: int, policy: str | None,
                       optimizer: str | None, device: str, timeout: float,
                       allocator: str) -> ChildResult:
    # The child adds the cached baseline: measure it here first (once per machine), where
    # the line that says so is seen.
    ensure_calibration(device)
    r = run_child({"mode": "estimate", "model": spec.to_json(), "batch_size": 1,
                   "budget": budget, "dtype_policy": policy, "optimizer": optimizer,
                   "device": device, "allocator": allocator}, timeout=timeout)
    if r.status == "error":
        raise EstimateError(r.message)
    if r.status != "ok":
        raise EstimateError(f"The estimate failed in its child process ({r.status}): "
                            f"{r.message}")
    return r


def find_batch_size(model: str | ModelSpec, budget: int | str, *,
                    dtype_policy: str | None = None, optimizer: str | None = None,
                    input_shape: Any = None, steps: int = 2, device: str = "cpu",
                    precision: float = 0.03, max_trials: int = 10, step_factor: float = 1.25,
                    start: int | None = None, timeout: float = 900.0,
                    on_trial: Any = None, allocator: str = "default",
                    prove: bool = False, warm: bool = True) -> SearchResult:
    """Finds the largest batch size whose real training steps stay within ``budget``.

    Example:
        >>> r = find_batch_size("mymodels:make_mlp", "1GiB", optimizer="adam")  # doctest: +SKIP
        >>> r.batch_size, format_size(r.peak)                                   # doctest: +SKIP
        (3100, '1016.2 MiB')

    Args:
        model: a ``.keras`` path or ``module:function`` (children load it themselves).
        budget: the memory the training process may use (``"2GiB"`` or bytes): its
            anonymous RSS, framework included.
        dtype_policy: Keras dtype policy for the children.
        optimizer: optimizer name (see :mod:`memfit.estimate.optimizers`).
        input_shape: input shape(s) for a model that does not know them.
        steps: training steps per child.
        device: ``"cpu"`` (``"gpu:N"``: children run there; on TensorFlow the budget
            is still host RSS, on JAX it is the device's memory, each child's allocator
            held to it: a batch that does not fit fails with a real device OOM).
        precision: stop when the bracket is within this fraction of the answer (default
            3 %; 0: exact, to one sample).
        max_trials: the most child processes to run.
        step_factor: how fast to grow or shrink while bracketing.
        start: the first batch size to try (default: the estimate's).
        timeout: seconds per child.
        on_trial: called with each :class:`Trial` as it ends (for progress output).
        allocator: the allocator policy of the children and of the seeding estimate
            (:mod:`memfit.memory.allocator`): ``"default"`` (glibc as it comes) or
            ``"fixed"`` — the answer holds for a training process under the same policy.
        prove: run the child just past the answer even where the measured peaks already
            put it over the budget (by default the search stops there, one child sooner,
            and says so: ``inferred_failing``).
        warm: on the CPU, fork each child from a warm parent that imported the
            frameworks once (:func:`memfit.estimate.measure.warm_children`): each child
            skips ``import tensorflow``; ``False``: each starts as a new interpreter.

    Raises:
        EstimateError: for a model that cannot be loaded (found by the estimate), or
            bad arguments, each quoting the value.
    """
    backend = require_for_training("memfit find-batch-size")
    budget_bytes = parse_budget(budget)
    check_policy(dtype_policy)
    if optimizer is not None:
        optimizer = check_optimizer(optimizer)
    with input_errors():
        checks.count("max_trials", max_trials)
        checks.count("steps", steps, example=2,
                     hint="A trial of 0 steps measures nothing: every batch size fits.")
        precision = checks.number("precision", precision, example=0.03,
                                  hint="The fraction of the answer to find it within (0: "
                                       "to one sample).")
        start = checks.count("start", start, optional=True, example=32,
                             hint="The first batch size to try (by default, the estimate's).")
        prove = checks.flag("prove", prove)
        warm = checks.flag("warm", warm)
    if not step_factor > 1:
        raise EstimateError(f"step_factor must be above 1. Received: step_factor={step_factor!r}")
    spec = model if isinstance(model, ModelSpec) else ModelSpec(
        str(model), parse_input_shape(input_shape))
    with input_errors():
        allocator = check_allocator(allocator)
    # One import for the whole search: each child, the estimate's too, is forked from a
    # warm parent that imported the frameworks (memfit.estimate.measure.warm_children).
    with warm_children(warm):
        first = _estimate_in_child(spec, budget_bytes, dtype_policy, optimizer, device,
                                   timeout, allocator)
        report = first.report
        reasons = [first.cold_reason] if first.cold_reason else []
        estimated = int(report.get("max_batch_size") or 0)
        # On a GPU under JAX the budget is the device's: each child's allocator is held to it
        # (less the per-process baseline the estimate adds, the CUDA context) and a step that
        # does not fit fails there, a real device out-of-memory; elsewhere it is host RSS.
        on_device = backend == "jax" and device.startswith("gpu")
        device_limit = max(1, budget_bytes - int(report.get("baseline") or 0)) if on_device \
            else None

        def measure(b: int) -> ChildResult:
            r = measure_training(spec, b, dtype_policy=dtype_policy, optimizer=optimizer,
                                 steps=steps, device=device,
                                 budget=None if on_device else budget_bytes,
                                 timeout=timeout, allocator=allocator, device_limit=device_limit)
            if on_device and r.report.get("gpu_peak") is not None:
                # The device's allocator peak, plus the baseline the budget includes.
                r = dataclasses.replace(r, peak=int(r.report["gpu_peak"]) + budget_bytes
                                        - (device_limit or budget_bytes))
            if r.fits and r.peak is not None and r.peak > budget_bytes:
                # The child's own peak (the kernel's high-water mark) passed the budget
                # between two of the watcher's samples: it did not fit (a held-out DCGAN
                # generator "fitted" batch 76 at 479.4 MiB of a 477.5 MiB budget).
                r = dataclasses.replace(r, status="over-budget")
            if r.cold_reason:
                reasons.append(r.cold_reason)
            return r

        search = _Search(measure, max_trials, on_trial)
        search.infer = not prove
        slope = float(report.get("bytes_per_sample") or 0)
        if slope > 0:
            # From the estimate's safe end, jump to where the measured peaks say the budget
            # is reached (the estimate's slope, then the measured one), and prove the edge
            # with one failing trial within the precision. Where not even batch size 1 is
            # safe by the estimate (a model whose weights, slots and optimizer update are
            # most of the budget: the wide MLP of issue 27), batch size 1 is the first trial:
            # it says whether anything fits, and its peak is where the aim starts from.
            search.secant(max(1, start if start is not None else estimated), budget_bytes,
                          slope, precision, step_factor)
        else:
            # Without an estimate, batch size 1 may be far from the answer: double until a
            # failure brackets it, then bisect.
            near = start is not None or estimated > 0
            search.bracket(max(1, start if start is not None else estimated),
                           step_factor if near else max(step_factor, 2.0))
        search.bisect(precision)
        advice: tuple[str, ...] = ()
        if search.lo == 0:
            one = search.results.get(1)
            lines = list(report.get("advice") or ()) or [
                "nothing fits: use mixed precision, a lighter optimizer, or a smaller model"]
            advice = tuple(lines if one is None else after_measuring(
                lines, budget_bytes, one.peak, one.status, report.get("total")))
        return SearchResult(batch_size=search.lo,
                            peak=search.results[search.lo].peak if search.lo else None,
                            budget=budget_bytes, estimated=estimated,
                            smallest_failing=search.hi, trials=tuple(search.trials),
                            advice=advice, estimated_point=report.get("point_batch_size"),
                            estimated_low=report.get("low_batch_size"), precision=precision,
                            inferred_failing=search.inferred,
                            cold_reason=reasons[0] if reasons else None)


class _Search:
    """Brackets the largest batch size that fits, then bisects; every batch size tried is
    a child process (:func:`~memfit.estimate.measure.measure_training`), run once.

    Args:
        measure: runs the child for a batch size.
        max_trials: the most children to run.
        on_trial: called with each :class:`Trial` as it ends, or ``None``.
    """

    def __init__(self, measure: Callable[[int], ChildResult], max_trials: int,
                 on_trial: Callable[[Trial], Any] | None):
        self.measure = measure
        self.max_trials = max_trials
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self.results: dict[int, ChildResult] = {}
        self.lo = 0                       # the largest batch size that fits (0: none yet)
        self.hi: int | None = None        # the smallest that does not
        self.factor = 1.25                # the step down after a failure aimed far off
        self.infer = True                 # stop where the measured peaks put the edge
        self.inferred: int | None = None  # the batch the peaks put over the budget

    def fits(self, b: int) -> bool:
        """Whether batch size ``b`` ran within the budget (a child, the first time)."""
        if b not in self.results:
            r = self.measure(b)
            if r.status == "error":
                raise EstimateError(r.message)
            self.results[b] = r
            trial = Trial(b, r.status, r.peak, r.seconds, r.started)
            self.trials.append(trial)
            if self.on_trial is not None:
                self.on_trial(trial)
        return self.results[b].fits

    def trials_left(self) -> bool:
        return len(self.trials) < self.max_trials

    def bracket(self, b: int, factor: float) -> None:
        """From ``b``: grows by ``factor`` while batch sizes fit, shrinks while they do not,
        until one that fits and one that does not are known (or batch size 1 fails)."""
        while self.trials_left():
            if self.fits(b):
                self.lo = b
                if self.hi is not None:
                    break
                b = max(b + 1, int(b * factor))
            else:
                self.hi = b
                if self.lo or b == 1:
                    break
                b = max(1, int(b / factor))

    def peak(self, b: int) -> int | None:
        """The measured peak of batch size ``b`` (tried already), or ``None``."""
        r = self.results.get(b)
        return None if r is None else r.peak

    def secant(self, start: int, budget: int, slope: float, precision: float,
               factor: float) -> None:
        """From ``start``, aims each trial at the batch size where the peak reaches the
        budget: the last peak that fitted plus the bytes left over the slope (the
        estimate's ``slope`` bytes a sample until two trials fitted, then the measured
        one), 1 % inside. Once the aim is within ``precision`` of the largest batch that
        fitted, one trial just past it proves the edge (it fails: done). Every aim stays
        inside the bracket; where the aim stalls, :meth:`bisect` finishes."""
        self.factor = factor
        b = start
        while self.trials_left():
            if self.fits(b):
                self.lo = max(self.lo, b)
            else:
                self.hi = b if self.hi is None else min(self.hi, b)
            if self.hi is not None and (self.hi - self.lo <= 1 or (
                    self.lo and (self.hi - self.lo) / self.lo <= precision)):
                return
            if self.infer and self.lo and self._edge_inferred(budget, slope, precision):
                return
            if not self.lo:
                if self.hi == 1:
                    return
                b = max(1, int(self.hi / factor))       # nothing fitted yet: step down
                continue
            b = self._aim(budget, slope, precision)
            if b is None:
                return                                   # bisect() finishes

    def _measured_slope(self) -> float | None:
        """Bytes a sample from two fitted peaks far enough apart for the run-to-run noise
        (a few %) not to dominate it: the largest batch that fitted and the largest that
        fitted at most 90 % of it; ``None`` where there are no such two."""
        fitted = sorted(x for x, r in self.results.items() if r.fits and r.peak)
        if not fitted:
            return None
        top = fitted[-1]
        far = [x for x in fitted if x <= 0.9 * top]
        if not far:
            return None
        return (self.peak(top) - self.peak(far[-1])) / (top - far[-1])

    def _edge_inferred(self, budget: int, slope: float, precision: float) -> bool:
        """Whether the measured peaks put the batch just past the precision over the
        budget: the largest batch that fitted is then the answer, within ``precision``,
        without a child to prove it (one that would be as noisy as the peaks: issue 27's
        held-out models fitted a batch size in one search and failed it in another).
        Only a slope measured between two real peaks counts, and only one the estimate
        does not contradict (within 0.5-2x of its bytes a sample, or lower)."""
        s = self._measured_slope()
        if s is None or s <= 0 or s > 2 * slope or self.lo != max(
                b for b, r in self.results.items() if r.fits):
            return False
        far = max(b for b, r in self.results.items() if r.fits and r.peak
                  and b <= 0.9 * self.lo)
        if self.peak(self.lo) - self.peak(far) < 0.05 * self.peak(self.lo):
            # Peaks that rose by less than 5 % over the two: the run-to-run noise (1-3 %
            # on the family panel, more where memory jumps) is too much of their slope to
            # stop on (a simulated wide MLP ended within 3 % in 60 of 100 searches
            # without this, 95 with it): a child proves the edge.
            return False
        nxt = self.lo + max(1, math.floor(self.lo * precision))
        if self.hi is not None and nxt >= self.hi:
            return False
        if self.peak(self.lo) + s * (nxt - self.lo) > budget:
            self.inferred = nxt
            return True
        return False

    def _aim(self, budget: int, slope: float, precision: float) -> int | None:
        """The next batch size to try from the largest that fitted (see :meth:`secant`),
        or ``None`` where aiming has nothing new to try."""
        fitted = sorted(x for x, r in self.results.items() if r.fits and r.peak)
        s = slope
        # Two measured peaks give the slope only where they are far enough apart for the
        # run-to-run noise (a few %) not to dominate it.
        from_peaks = len(fitted) >= 2 and fitted[-1] - fitted[-2] >= 0.1 * fitted[-1]
        grow = False
        if from_peaks:
            measured = (self.peak(fitted[-1]) - self.peak(fitted[-2])) / \
                (fitted[-1] - fitted[-2])
            if 0.5 * slope <= measured <= 2 * slope:
                s = measured
            elif 0 < measured < 0.5 * slope:
                # Two real peaks far apart say a sample costs far less than the estimate
                # says (issue 27: 4.5 MiB estimated, 0.15 measured, and the search crept
                # up by 44 samples a child): aim with theirs. (Where they say more, the
                # estimate's aim overshoots, and a failure brackets the answer.)
                s = measured
            elif measured <= 0:
                # Peaks not rising with the batch: the run-to-run noise is larger than
                # what these batches add. Neither slope can aim: at least double the
                # largest batch that fitted, until a failure brackets the answer.
                grow = True
        left = budget - (self.peak(self.lo) or budget)
        aim = int(self.lo + 0.99 * left / s) if left > 0 else self.lo
        if grow:
            aim = max(aim, 2 * self.lo)
        edge = self.lo + max(1, math.floor(self.lo * precision))    # failing there: done
        if aim <= edge and self.hi is not None and self.hi > edge * (1 + precision) + 1 \
                and any(r.fits for b, r in self.results.items() if b > 1 and b < self.lo):
            # The peaks say the budget is reached, yet a failure is far above: the peaks'
            # run-to-run noise is as large as what is left (memory nearly flat in the
            # batch). Creeping up by the precision would take many children: bisect.
            return None
        nxt = edge if aim <= edge else aim
        if self.hi is not None:
            # Past a failure: the batch just within the precision below it ends the search
            # if it fits; take it unless the aim is clearly lower.
            below = math.ceil(self.hi / (1 + precision)) if precision > 0 else self.hi - 1
            if nxt >= self.hi:
                # The peaks said the failing batch should have fitted: memory jumped there
                # (an allocator's region doubling, a kernel's workspace), so the edge is
                # likely just below it: try there once; after that, or where the bracket
                # is wide, halve it.
                failures = sum(not r.fits for r in self.results.values())
                narrow = below <= self.lo * (1 + 2 * precision) + 1
                nxt = below if narrow or failures == 1 else (self.lo + self.hi) // 2
                if not from_peaks and not narrow and self.lo * self.factor < self.hi:
                    # The failure was aimed with the estimate's slope alone (one peak
                    # known, far below): that slope was off, not the memory jumping;
                    # step down by the factor, as without an estimate.
                    nxt = int(self.hi / self.factor)
            elif aim >= below * (1 - precision):
                nxt = below
            if nxt <= self.lo:
                nxt = (self.lo + self.hi) // 2
        if nxt <= self.lo or nxt in self.results:
            return None
        return nxt

    def bisect(self, precision: float) -> None:
        """Halves the bracket until it is within ``precision`` of the answer (0: one
        sample), or no trials are left."""
        while (self.inferred is None and self.hi is not None and self.hi - self.lo > 1
               and self.trials_left()
               and (self.lo == 0 or (self.hi - self.lo) / self.lo > precision)):
            mid = (self.lo + self.hi) // 2 if self.lo else max(1, self.hi // 2)
            if self.fits(mid):
                self.lo = mid
            else:
                self.hi = mid
