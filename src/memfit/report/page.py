"""The self-contained HTML report: one file, the timeline embedded, inline CSS, no assets.

Everything that comes from the log (commands, reasons, paths, verdict texts) is escaped.

Example:
    >>> from memfit.report import load
    >>> from memfit.report.page import render
    >>> page = render(load("runs/exp1"), png=b"...")              # doctest: +SKIP
    >>> page.startswith("<!DOCTYPE html>")                         # doctest: +SKIP
    True
"""

from __future__ import annotations

import base64
import datetime
from html import escape

from memfit._version import __version__
from memfit.memory.log import Event
from memfit.report.data import MARK_EVENTS, MEMORY_FIELDS, RunData, number
from memfit.report.summary import ProcessSummary, VerdictSummary, summarize, verdicts
from memfit.report.timeline_plot import event_label, format_duration
from memfit.sizes import format_count, format_size

__all__ = ["render"]

_KIND_COLORS = {"leak": "#c62828", "allocator-retention": "#ef6c00", "warm-up": "#1565c0",
                "stable": "#2e7d32", "too-short": "#616161"}

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       max-width: 1180px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: #555; margin: 0 0 16px; } .meta code { color: #333; }
.verdict { border-left: 6px solid var(--c); background: #fafafa; padding: 10px 14px;
           margin: 10px 0; }
.verdict .kind { color: var(--c); font-weight: 700; text-transform: uppercase;
                 letter-spacing: .04em; margin-right: 8px; }
.verdict p { margin: 6px 0 0; } .origin { color: #777; font-size: 12px; }
img { max-width: 100%; border: 1px solid #e5e5e5; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e5e5e5;
         vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; } td.n { text-align: right; white-space: nowrap; }
td.cmd { font-family: ui-monospace, Menlo, Consolas, monospace; word-break: break-all; }
.src { font-family: system-ui, sans-serif; color: #777; background: #f0f0f0;
       border-radius: 3px; padding: 0 4px; font-size: 11px; }
.note { color: #666; font-size: 12px; } footer { color: #888; font-size: 12px; margin-top: 32px; }
"""


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _verdict_html(v: VerdictSummary) -> str:
    origin = {"log": "from the log's last verdict event",
              "computed": "classified from the anonymous RSS at each epoch end",
              "too-few-epochs": "not enough epoch ends to classify"}[v.origin]
    who = f"pid {v.pid}, " if v.pid is not None else ""
    color = _KIND_COLORS.get(v.kind, "#616161")
    # the kind is the label already
    headline = v.headline.removeprefix(f"{v.kind}: ").removeprefix("too short to judge: ")
    return (f'<div class="verdict" style="--c: {color}"><span class="kind">{escape(v.kind)}'
            f'</span>{escape(headline)} <span class="origin">({escape(who + origin)})</span>'
            f"<p>{escape(v.explanation)}</p>"
            + (f"<p>{escape(v.note)}</p>" if v.note else "")
            + f"<p><b>Fix:</b> {escape(v.fix)}</p></div>")


def _process_rows(summaries: tuple[ProcessSummary, ...]) -> str:
    rows = []
    for s in summaries:
        mark = "*" if s.anon_is_total else ""
        source = f' <span class="src">{escape(s.source)}</span>' if s.source else ""
        cells = [f'<td class="n">{s.pid}</td>',
                 f'<td class="cmd">{escape(s.command) or "—"}{source}</td>',
                 f'<td class="n">{format_duration(s.duration)}</td>',
                 f'<td class="n">{s.samples}</td>',
                 f'<td class="n">{format_size(s.peak_anon)}{mark}</td>',
                 f'<td class="n">{format_size(s.final_anon)}{mark}</td>',
                 f'<td class="n">{format_size(s.growth, signed=True)}{mark}</td>',
                 f'<td class="n">{format_size(s.peak_rss)}</td>',
                 f'<td class="n">{s.epochs}</td>']
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(rows)


# Event fields that hold bytes or seconds: shown as sizes (IEC) and durations, not raw
# numbers (``peak_rss=344.7 MiB``, not ``peak_rss=361476096``).
_SIZE_FIELDS = frozenset(MEMORY_FIELDS) | {"peak", "peak_rss", "host_peak", "rss_peak",
                                           "peak_anon", "max_rss", "hard_rss", "budget",
                                           "memory_budget", "limit", "share", "freed",
                                           "trimmed"}
_SECONDS_FIELDS = frozenset({"seconds", "duration", "delay", "elapsed"})


def _detail(key: str, value: object) -> str:
    """One ``key=value`` of an event's details, as a person reads it."""
    n = number(value)
    if n is not None and (key in _SIZE_FIELDS or key.endswith(("_rss", "_bytes"))):
        return f"{key}={format_size(n)}"
    if n is not None and key in _SECONDS_FIELDS:
        return f"{key}={format_duration(n)}"
    return f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"


def _event_rows(data: RunData) -> str:
    rows = []
    for r in data.events(*MARK_EVENTS):
        extra = {k: v for k, v in r.items()
                 if k not in ("t", "pid", "event", "reason", "code", "why", "message")}
        details = ", ".join(_detail(k, v) for k, v in extra.items())
        rows.append(f'<tr><td class="n">+{r["t"] - data.first_t:.1f} s</td>'
                    f'<td class="n">{r["pid"]}</td><td>{escape(event_label(r))}</td>'
                    f"<td>{escape(details)}</td></tr>")
    return "\n".join(rows)


def render(data: RunData, png: bytes, *, summaries: tuple[ProcessSummary, ...] | None = None,
           judged: tuple[VerdictSummary, ...] | None = None) -> str:
    """The report page as a string.

    Args:
        data: the run, from :func:`memfit.report.load`.
        png: the timeline's PNG bytes, embedded as a ``data:`` URI.
        summaries: per-process summaries (computed from ``data`` when omitted).
        judged: the verdicts (computed from ``data`` when omitted).
    """
    summaries = summarize(data) if summaries is None else summaries
    judged = verdicts(data) if judged is None else judged
    start = data.start
    writer = f"{start.get('source', '?')}, memfit {start.get('memfit', '?')}"
    image = base64.b64encode(png).decode("ascii")
    events = _event_rows(data)
    note = ('<p class="note">* no anonymous/file split in the log: total RSS shown.</p>'
            if any(s.anon_is_total for s in summaries) else "")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>memfit report — {escape(str(data.source))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>memfit report</h1>",
        f'<p class="meta"><code>{escape(str(data.log))}</code> · written by {escape(writer)}'
        f" · {_when(data.first_t)} → {_when(data.last_t)} ({format_duration(data.duration)})"
        f" · {format_count(len(summaries), 'process', 'processes')}"
        f" · {format_count(len(data.records), 'record')}</p>",
        "<h2>Verdict</h2>", *(_verdict_html(v) for v in judged),
        "<h2>Timeline</h2>",
        f'<img alt="memory timeline" src="data:image/png;base64,{image}">',
        '<p class="note">Anonymous RSS (solid) is what running out of memory is about; '
        "file-backed RSS (dashed) is page cache the kernel can drop."
        + (" Dotted grey lines are epoch ends." if data.events(Event.EPOCH_END) else "") + "</p>",
        "<h2>Processes</h2>",
        "<table><thead><tr><th>pid</th><th>command / source</th><th>duration</th>"
        "<th>samples</th><th>peak anon RSS</th><th>final anon RSS</th>"
        "<th>growth first→last</th><th>peak total RSS</th><th>epochs</th></tr></thead>",
        f"<tbody>{_process_rows(summaries)}</tbody></table>", note,
        "<h2>Restarts and exits</h2>",
        ("<table><thead><tr><th>time</th><th>pid</th><th>event</th><th>details</th></tr>"
         f"</thead><tbody>{events}</tbody></table>" if events
         else "<p>None: no restart, exit or stop events in this log.</p>"),
        f"<footer>Generated by memfit {escape(__version__)} on "
        f"{_when(datetime.datetime.now().timestamp())}.</footer>",
        "</body></html>", ""]
    return "\n".join(parts)
