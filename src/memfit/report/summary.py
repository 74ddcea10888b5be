"""The numbers of a report: one summary per process and the verdict(s) on the run.

Example:
    >>> from memfit.report import load
    >>> from memfit.report.summary import summarize, verdicts
    >>> data = load("runs/exp1")                                 # doctest: +SKIP
    >>> [s.peak_anon for s in summarize(data)]                   # doctest: +SKIP
    [1289748480]
    >>> verdicts(data)[0].kind                                   # doctest: +SKIP
    'leak'
"""

from __future__ import annotations

import dataclasses

from memfit.memory.classifier import EXPLANATIONS, MIN_VALUES, TOO_SHORT, classify
from memfit.memory.log import Event
from memfit.report.data import ProcessData, RunData, anon, number
from memfit.sizes import format_count, format_size

__all__ = ["ProcessSummary", "VerdictSummary", "summarize", "verdicts", "doctor_findings",
           "MIN_EPOCHS"]

MIN_EPOCHS = MIN_VALUES + 1  # epoch ends (one of warm-up) before the classifier is asked


@dataclasses.dataclass(frozen=True)
class ProcessSummary:
    """What one process did, in bytes and seconds (``None``: the log has no such number).

    Attributes:
        pid: the process.
        command: its command from its ``start`` event (or the writer's, see
            :attr:`memfit.report.ProcessData.command`).
        source: the writer of that ``start`` event (``monitor``, ``watch``, ``run``...).
        duration: seconds from its first record to its last.
        samples: records with a memory number.
        peak_anon: highest anonymous RSS sampled.
        final_anon: anonymous RSS at its last sample.
        growth: final minus first anonymous RSS.
        peak_rss: highest total RSS (sampled, or the kernel's high-water mark if logged).
        epochs: ``epoch_end`` events.
        anon_is_total: the log had no anon/file split: the anon columns hold total RSS.
    """

    pid: int
    command: str
    duration: float
    samples: int
    peak_anon: float | None
    final_anon: float | None
    growth: float | None
    peak_rss: float | None
    epochs: int
    anon_is_total: bool = False
    source: str = ""


@dataclasses.dataclass(frozen=True)
class VerdictSummary:
    """A verdict on the run, with where it came from.

    Attributes:
        kind: ``stable``, ``warm-up``, ``leak``, ``allocator-retention`` or ``too-short``.
        headline: one line with the numbers.
        explanation: what the verdict means.
        fix: what to do.
        pid: the process judged (``None``: the whole log).
        origin: ``"log"`` (a ``verdict`` event), ``"computed"`` (classified from the
            ``epoch_end`` events here) or ``"too-few-epochs"``.
        note: more from the ``verdict`` event (its ``basis`` and ``note``), if any.
    """

    kind: str
    headline: str
    explanation: str
    fix: str
    pid: int | None
    origin: str
    note: str = ""


def _summary(process: ProcessData) -> ProcessSummary:
    values = [anon(r) for r in process.samples]
    # the peak of every record that measured this process: one measured inside it
    # (a probe's train_begin) is a floor of its tree's at that instant, and may be what
    # the outside samples missed (the timeline marks the same peak)
    peaks = [v for v in (anon(r) for r in process.records) if v is not None]
    totals = [v for r in process.records for v in (number(r.get("rss")),
                                                   number(r.get("rss_peak"))) if v is not None]
    return ProcessSummary(
        pid=process.pid, command=process.command, duration=process.duration,
        samples=len(values), peak_anon=max(peaks, default=None),
        final_anon=values[-1] if values else None,
        growth=values[-1] - values[0] if values else None,
        peak_rss=max(totals, default=None), epochs=len(process.epoch_ends),
        anon_is_total=process.anon_is_total, source=process.source)


def summarize(data: RunData) -> tuple[ProcessSummary, ...]:
    """One :class:`ProcessSummary` per process of the run (:attr:`RunData.measured`: a
    writer that only sampled others, the ``memfit watch`` process, is not a row), in order
    of first appearance.

    Args:
        data: the run, from :func:`memfit.report.load`.
    """
    return tuple(_summary(p) for p in data.measured)


def _from_event(record: dict) -> VerdictSummary:
    kind = str(record.get("verdict") or record.get("kind") or TOO_SHORT)
    explanation, fix = EXPLANATIONS.get(kind, ("", ""))
    note = " ".join(filter(None, (f"Judged from {record['basis']}." if record.get("basis")
                                  else "", str(record.get("note") or ""))))
    return VerdictSummary(kind=kind, headline=str(record.get("headline") or kind),
                          explanation=str(record.get("explanation") or explanation),
                          fix=str(record.get("fix") or fix), pid=record["pid"], origin="log",
                          note=note)


def _device(v: VerdictSummary) -> VerdictSummary:
    """A verdict on the device's memory (``scope: "device"``), named as such."""
    return dataclasses.replace(v, headline=f"device memory: {v.headline}")


def doctor_findings(data: RunData) -> str | None:
    """What ``memfit doctor`` found in this log's run, in one line (its last ``findings``
    event), or ``None`` when the doctor did not run here.

    Args:
        data: the run, from :func:`memfit.report.load`.
    """
    found = data.events(Event.FINDINGS)
    if not found:
        return None
    last = found[-1]
    kinds, sizes = list(last.get("kinds") or []), list(last.get("bytes") or [])
    if not kinds:
        return "memfit doctor found no memory problem in this run"
    sizes += [None] * (len(kinds) - len(sizes))
    return "memfit doctor found " + ", ".join(
        f"{k} (about {format_size(b)} at stake)" if isinstance(b, int | float) else str(k)
        for k, b in zip(kinds, sizes, strict=True)) + "; its report is in doctor.json here"


def _with_findings(v: VerdictSummary, findings: str | None) -> VerdictSummary:
    """A verdict of a run the doctor measured: with the doctor's findings, and without a
    fix that says to run the doctor (a stranger's report of a doctor's workdir read
    "Nothing to fix ... memfit doctor measures what holds it" beside a 219 MiB finding)."""
    if findings is None:
        return v
    fix = v.fix if "memfit doctor" not in v.fix else (
        "See memfit doctor's findings (above): they say what holds the memory, and what to "
        "do about it.")
    return dataclasses.replace(v, note=" ".join(filter(None, (v.note, f"{findings}."))),
                               fix=fix)


def verdicts(data: RunData) -> tuple[VerdictSummary, ...]:
    """The verdict(s) on a run.

    The last ``verdict`` event of the log wins (and the last on the device's memory,
    ``scope: "device"``, from ``MemoryMonitor`` on a GPU, follows it). Without one, each
    process with at least ``MIN_EPOCHS`` (5) ``epoch_end`` events is classified from its
    anonymous RSS at those epoch ends (``warmup_epochs`` from the ``start`` event, else the
    classifier's default). Without those either, a single ``too-short`` verdict says why
    nothing can be judged. Where ``memfit doctor`` ran (a ``findings``
    event), each verdict carries its findings in its note, and a fix that says to run the
    doctor points to them instead.
    """
    found = _verdicts(data)
    findings = doctor_findings(data)
    return tuple(_with_findings(v, findings) for v in found)


def _verdicts(data: RunData) -> tuple[VerdictSummary, ...]:
    """:func:`verdicts` without the doctor's findings."""
    every = data.events(Event.VERDICT)
    logged = [e for e in every if e.get("scope") != "device"]
    device = [e for e in every if e.get("scope") == "device"]
    if logged:
        return (_from_event(logged[-1]),
                *((_device(_from_event(device[-1])),) if device else ()))
    warmup = data.start.get("warmup_epochs")
    kwargs = {"warmup_epochs": warmup} if isinstance(warmup, int) and warmup >= 0 else {}
    out = []
    for process in data.processes.values():
        values = [v for v in (anon(r) for r in process.epoch_ends) if v is not None]
        if len(values) >= MIN_EPOCHS:
            v = classify(values, **kwargs)
            out.append(VerdictSummary(v.kind, v.headline, v.explanation, v.fix, process.pid,
                                      "computed"))
    if out:
        return tuple(out)
    most = max((len(p.epoch_ends) for p in data.processes.values()), default=0)
    if most == 0:
        why = ("This log has no epoch_end events (no MemoryMonitor in the script; memfit "
               "watch and memfit run sample time only), so there is nothing to compare "
               "from epoch to epoch.")
    else:
        why = (f"The longest-running process logged {format_count(most, 'epoch end')}; "
               f"at least {MIN_EPOCHS} in one process are needed "
               f"to tell growth from noise.")
    return (VerdictSummary(
        TOO_SHORT, f"too short to judge: needs ≥ {MIN_EPOCHS} epoch ends in one process, "
                   + ("the log has none (no MemoryMonitor)" if most == 0 else
                      f"had {most} (too few epochs in one process)"), why,
        ("Record epoch ends with memfit.MemoryMonitor in model.fit and train for at least "
         f"{MIN_EPOCHS} epochs (more after a warm-up), then run memfit report again."
         if most == 0 else
         # a stranger's run had 6 epochs, 3 a process (memfit run --restart-every 3), and
         # was told to record epoch ends, which it did
         f"Train for at least {MIN_EPOCHS} epochs in one process (more after a warm-up): "
         f"under memfit run --restart-every N each process trains N epochs, so give N ≥ "
         f"{MIN_EPOCHS} for the report to judge the trend; then run memfit report again."),
        None, "too-few-epochs"),)
