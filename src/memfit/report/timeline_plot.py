"""The memory timeline: one PNG of a run's memory over time, drawn with matplotlib (Agg).

Top panel: anonymous RSS (solid; what running out of memory is about) and file-backed
RSS (dashed; page cache the kernel can drop), one colour per process. Bottom panel, when
the log has them: the TensorFlow allocator's current (solid) and peak (dotted) bytes per
device and the NVML per-process figure (dashed). Thin grey lines mark epoch ends;
labelled lines mark restarts, exits and stops.

The figure is drawn on a :class:`matplotlib.figure.Figure` with the Agg canvas, never
through ``pyplot``: the user's backend and open figures are left alone.

Example:
    >>> from memfit.report import load, timeline
    >>> timeline(load("runs/exp1"), "runs/exp1/timeline.png")     # doctest: +SKIP
    PosixPath('runs/exp1/timeline.png')
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
from pathlib import Path

from memfit.atomic import temporary_name
from memfit.memory.log import Event
from memfit.report.data import MARK_EVENTS, ProcessData, RunData, anon, number
from memfit.sizes import format_count, format_size

__all__ = ["timeline", "title", "event_label", "format_duration"]

_PID_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f",
               "#e377c2")
_DEVICE_COLORS = ("#ff7f0e", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b")
# in order of precedence: a group of marks close in time takes the first one's colour
_MARK_COLORS = {Event.RESTART: "#d62728", Event.STOP: "#9467bd", Event.EXIT: "#444444"}
_MAX_PIDS_IN_LEGEND = 8
_MAX_EPOCH_MARKS = 30
_LABEL_GAP = 0.03             # a rotated two-line label, as a share of the width
# the limit drawn, and its name on the plot (memfit run's --max-rss is a restart threshold)
_BUDGET_KEYS = {"max_rss": "--max-rss (restart at)", "memory_budget": "memory budget",
                "budget": "budget"}


def format_duration(seconds: float) -> str:
    """``'42.0 s'``, ``'3 min 20 s'``, ``'2 h 05 min'``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _reason(record: dict) -> str:
    return str(record.get("reason") or record.get("why") or record.get("message") or "")


def event_label(record: dict, *, reason: bool = True) -> str:
    """A short label for a ``restart``/``exit``/``stop`` event: its exit code, its reason.

    Example:
        >>> event_label({"event": "exit", "code": -9, "reason": "killed"})
        'exit -9 (signal): killed'
    """
    event = record["event"]
    code = record.get("code", record.get("returncode"))
    text = f"{event} {code}" if event == Event.EXIT and code is not None else event
    if event == Event.EXIT and isinstance(code, int) and code < 0:
        text += " (signal)"
    return f"{text}: {_reason(record)}" if reason and _reason(record) else text


def _size_unit(max_bytes: float) -> tuple[str, int]:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= 1.5 * factor:
            return unit, factor
    return "B", 1


def _time_unit(duration: float) -> tuple[str, float]:
    if duration >= 3 * 3600:
        return "h", 3600.0
    if duration >= 600:
        return "min", 60.0
    return "s", 1.0


def _series(process: ProcessData, value) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for record in process.records:
        y = value(record)
        if y is not None:
            xs.append(record["t"])
            ys.append(y)
    return xs, ys


def _gpu_value(device: str, key: str):
    def value(record: dict) -> float | None:
        gpu = record.get("gpu")
        if not isinstance(gpu, dict) or not isinstance(gpu.get(device), dict):
            return None
        return number(gpu[device].get(key))
    return value


def _devices(data: RunData) -> list[tuple[int, str]]:
    seen: dict[tuple[int, str], None] = {}
    for record in data.records:
        if isinstance(record.get("gpu"), dict):
            for device in record["gpu"]:
                seen[(record["pid"], str(device))] = None
    return list(seen)


def _pid_label(process: ProcessData) -> str:
    # a memfit share job is named by its name: two jobs may run the same command
    job = next((r for r in process.records
                if r.get("event") == Event.JOB_START and r.get("job")), None)
    label = f"job {job['job']}: pid {process.pid}" if job else f"pid {process.pid}"
    given = job.get("command") if job else None
    line = " ".join(map(str, given)) if isinstance(given, list) else process.command
    program, _, rest = " ".join(line.split()).partition(" ")
    command = " ".join(filter(None, (os.path.basename(program), rest)))
    if command:
        label += f" ({command if len(command) <= 32 else command[:31] + '…'})"
    trees = [r.get("processes") for r in process.samples if number(r.get("processes"))]
    if trees and max(trees) > 1:
        label += f", tree of ≤{max(trees)}"
    return label


def title(data: RunData) -> str:
    """The timeline's title: the source, how long, from when, and how many processes the
    run had (:attr:`RunData.measured`: the number the report's summary gives too).

    Example:
        >>> title(load("runs/exp1"))                         # doctest: +SKIP
        'Memory timeline — runs/exp1\\n3 min 20 s from 2025-01-01 12:00, 1 process'

    Args:
        data: a run, from :func:`memfit.report.load`.
    """
    source = str(data.source)
    if len(source) > 70:
        source = "…" + source[-69:]
    when = datetime.datetime.fromtimestamp(data.first_t).strftime("%Y-%m-%d %H:%M")
    n = len(data.measured)
    return (f"Memory timeline — {source}\n{format_duration(data.duration)} from {when}, "
            f"{format_count(n, 'process', 'processes')}")


def _marks(data: RunData, axes, t0: float, scale: float) -> None:
    """Epoch ends (thin) on every panel; restarts/exits/stops (labelled) too."""
    from matplotlib.transforms import blended_transform_factory

    epochs = data.events(Event.EPOCH_END)
    marks = data.events(*MARK_EVENTS)
    groups: list[list[dict]] = []           # events close in time share one label
    for record in marks:
        if groups and record["t"] - groups[-1][-1]["t"] <= 0.01 * max(data.duration, 1e-9):
            groups[-1].append(record)
        else:
            groups.append([record])
    every = max(1, math.ceil(len(epochs) / _MAX_EPOCH_MARKS))    # thin out many epochs
    label = "epoch end" if every == 1 else f"epoch end (1 in {every} shown)"
    for i, ax in enumerate(axes):
        for n, record in enumerate(epochs[every - 1::every]):
            ax.axvline((record["t"] - t0) / scale, color="0.6", lw=0.6, ls=(0, (2, 2)),
                       zorder=0, label=label if n == 0 and i == 0 else None)
        labelled = _labelled(groups, data.duration)
        for group in groups:
            x = (group[0]["t"] - t0) / scale
            events = {r["event"] for r in group}
            color = _MARK_COLORS[next(e for e in _MARK_COLORS if e in events)]
            ax.axvline(x, color=color, lw=1.4, alpha=0.85, zorder=1)
            nearby = labelled.get(id(group))
            if i == 0 and nearby is not None:   # events on one line, the first reason below
                text = " · ".join(dict.fromkeys(event_label(r, reason=False) for r in group))
                reason = next((_reason(r) for r in group if _reason(r)), "")
                if reason:
                    text += "\n" + (reason if len(reason) <= 44 else reason[:43] + "…")
                if nearby:
                    text += f"\n(+{nearby} more just after)"
                ax.text(x, 0.98, text + " ", rotation=90, ha="right", va="top", fontsize=8,
                        color=color, transform=blended_transform_factory(ax.transData,
                                                                           ax.transAxes),
                        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7,
                              "pad": 1})


def _labelled(groups: list[list[dict]], duration: float) -> dict[int, int]:
    """Which groups of marks get a label, by ``id``, with how many unlabelled groups follow
    each too close to have their own: a label is about :data:`_LABEL_GAP` of the width
    wide, and the exits of jobs that end together overlapped into one smudge (a
    stranger's share report)."""
    out: dict[int, int] = {}
    last: list[dict] | None = None
    for group in groups:
        if last is not None and group[0]["t"] - last[0]["t"] < _LABEL_GAP * max(duration,
                                                                                 1e-9):
            out[id(last)] += 1
            continue
        out[id(group)] = 0
        last = group
    return out


def _size_axis(ax, max_bytes: float) -> int:
    unit, factor = _size_unit(max_bytes)
    ax.set_ylim(bottom=0, top=max_bytes / factor * 1.12 if max_bytes > 0 else 1)
    ax.grid(axis="y", color="0.9", lw=0.8)
    ax.set_axisbelow(True)
    return factor


@dataclasses.dataclass(frozen=True)
class _Scale:
    """Time axis: seconds since ``t0``, shown in ``unit`` (``scale`` seconds each)."""

    t0: float
    unit: str
    scale: float

    def __call__(self, ts: list[float]) -> list[float]:
        return [(t - self.t0) / self.scale for t in ts]


_BUDGET_SCALE = 4      # a budget above this many times the peak is named, not drawn


def _draw_host(ax, data: RunData, processes: list[ProcessData], colors: dict[int, str],
               x: _Scale) -> None:
    """Anonymous RSS (solid) and file-backed RSS (dashed), one colour per process."""
    host_max = max((v for p in processes for r in p.records
                    for v in (anon(r), number(r.get("rss_file"))) if v is not None), default=0)
    key = next((k for k in _BUDGET_KEYS if number(data.start.get(k))), None)
    budget = number(data.start.get(key)) if key else None
    # A budget far above the memory would flatten it into the bottom of the plot (a
    # stranger's 288 MiB under an 8 GiB budget): it is then named, not drawn.
    off_scale = bool(budget and host_max and budget > _BUDGET_SCALE * host_max)
    top = max(host_max, 0 if off_scale else budget or 0)
    factor = _size_axis(ax, top)
    peak = (None, None, -1.0)
    for n, process in enumerate(processes):
        # the line: the process's samples (its tree's, where watch sampled the tree: an
        # in-process record measures less and would zigzag the line)
        xs = x([r["t"] for r in process.samples])
        ys = [anon(r) for r in process.samples]
        ax.plot(xs, [y / factor for y in ys], color=colors[process.pid], lw=1.8, ms=3,
                marker="o" if len(xs) < 30 else None,
                label=_pid_label(process) if n < _MAX_PIDS_IN_LEGEND else None)
        # the peak: of every record, as the report's table (summary.py) counts it
        px, py = _series(process, anon)
        if py and max(py) > peak[2]:
            i = max(range(len(py)), key=py.__getitem__)
            peak = (x(px)[i], py[i] / factor, py[i])
        fx, fy = _series(process, lambda r: number(r.get("rss_file")))
        ax.plot(x(fx), [y / factor for y in fy], color=colors[process.pid], lw=1.1, ls="--",
                alpha=0.8)
    if len(processes) > _MAX_PIDS_IN_LEGEND:
        ax.plot([], [], " ", label=f"… and {len(processes) - _MAX_PIDS_IN_LEGEND} more")
    total_only = processes and all(p.anon_is_total for p in processes)
    ax.plot([], [], color="black", lw=1.8,
            label="RSS (no anon/file split)" if total_only else "anonymous RSS")
    ax.plot([], [], color="black", lw=1.1, ls="--", label="file-backed RSS")
    if budget and off_scale:
        ax.plot([], [], " ", label=f"{_BUDGET_KEYS[key or 'budget']} {format_size(budget)} "
                                   f"(off the scale)")
    elif budget:
        ax.axhline(budget / factor, color="#d62728", lw=1, ls=":",
                   label=f"{_BUDGET_KEYS[key or 'budget']} {format_size(budget)}")
    if peak[0] is not None:
        ax.plot([peak[0]], [peak[1]], "o", ms=4, color="0.2", zorder=3)
        # the label on the side with room: left of a peak in the right half, else right
        # (a stranger's peak near the start had its label over the tick labels)
        left, right = ax.get_xlim()
        late = right > left and (peak[0] - left) / (right - left) >= 0.5
        ax.annotate(f"peak {format_size(peak[2])}", (peak[0], peak[1]),
                    xytext=(-40 if late else 40, 4), textcoords="offset points",
                    ha="right" if late else "left", va="center", fontsize=8,
                    color="0.2", arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6})
    ax.set_ylabel(f"host memory ({_size_unit(top)[0]})")
    ax.set_title(title(data), fontsize=11, loc="left")
    if not processes:
        ax.text(0.5, 0.5, "no memory samples in this log", transform=ax.transAxes,
                ha="center", va="center", color="0.4")


def _draw_device(ax, data: RunData, devices: list[tuple[int, str]], nvml_pids: list[int],
                 colors: dict[int, str], x: _Scale) -> None:
    """Allocator current (solid) and peak (dotted) per device, NVML (dashed) per process."""
    series = []
    for pid, device in devices:
        for key, style in (("current", "-"), ("peak", ":")):
            series.append((data.processes[pid], device, key, style, _gpu_value(device, key)))
    for pid in nvml_pids:
        series.append((data.processes[pid], "NVML", "", "--", lambda r: number(r.get("nvml"))))
    several = len({s[0].pid for s in series}) > 1
    top = max((y for s in series for y in _series(s[0], s[4])[1]), default=0)
    factor = _size_axis(ax, top)
    names = list(dict.fromkeys(device for _, device in devices))
    for process, device, key, style, value in series:
        xs, ys = _series(process, value)
        if several:                         # the colour of the process, as above
            color = colors[process.pid]
        elif key:
            color = _DEVICE_COLORS[names.index(device) % len(_DEVICE_COLORS)]
        else:
            color = "0.3"
        label = f"{device} allocator {key}" if key else "NVML (process)"
        if several:
            label += f", pid {process.pid}"
        ax.plot(x(xs), [y / factor for y in ys], color=color, ls=style,
                lw=1.6 if style == "-" else 1.2, label=label)
    ax.set_ylabel(f"device memory ({_size_unit(top)[0]})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)


def timeline(data: RunData, path: str | os.PathLike) -> Path:
    """Draws the memory timeline of a run as a PNG.

    Example:
        >>> from memfit.report import load, timeline
        >>> timeline(load("runs/exp1"), "timeline.png")      # doctest: +SKIP
        PosixPath('timeline.png')

    Args:
        data: a run, from :func:`memfit.report.load`.
        path: the PNG to write (replaced atomically: a temporary name, then a rename).

    Returns:
        The path written.
    """
    # imported here, so that `import memfit.report` (and every CLI command) stays light
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    path = Path(path)
    devices = _devices(data)
    nvml_pids = [p.pid for p in data.processes.values()
                 if any(number(r.get("nvml")) is not None for r in p.records)]
    has_gpu = bool(devices or nvml_pids)
    fig = Figure(figsize=(11, 6.8 if has_gpu else 5.4), dpi=100, layout="constrained")
    axes = list(fig.subplots(2, 1, sharex=True, height_ratios=(3, 2)) if has_gpu
                else [fig.subplots()])
    x = _Scale(data.first_t, *_time_unit(data.duration))
    processes = [p for p in data.processes.values() if p.samples]
    ordered = processes + [p for p in data.processes.values() if not p.samples]
    colors = {p.pid: _PID_COLORS[n % len(_PID_COLORS)] for n, p in enumerate(ordered)}
    _draw_host(axes[0], data, processes, colors, x)
    if has_gpu:
        _draw_device(axes[1], data, devices, nvml_pids, colors, x)
    _marks(data, axes, x.t0, x.scale)
    handles, labels = axes[0].get_legend_handles_labels()
    for event in MARK_EVENTS:
        if data.events(event):
            handles.append(Line2D([], [], color=_MARK_COLORS[event], lw=1.4))
            labels.append(event)
    axes[0].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
                   frameon=False)
    axes[-1].set_xlabel(f"time since start ({x.unit})")
    axes[-1].set_xlim(left=0, right=max(data.duration / x.scale, 1e-9) * 1.01)

    tmp = temporary_name(path)
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    return path
