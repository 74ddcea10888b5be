"""Issue 30's figures in one table, measured side by side in one run.

Runs four benchmarks one after another, each as a child process (this interpreter,
``TF_CPP_MIN_LOG_LEVEL=3``, ``--json`` into the scratch folder), and prints ONE markdown
table to stdout: figure | measured | goal | met?, then one line with the date, the machine
and the exact commands that ran (with how long each took). Progress goes to stderr: which
script, its elapsed time, and the script's own output (its detailed table among it).

- ``pack_sources.py``: the recipe's TFRecord files packed ÷ a plain write + fsync of as
  many bytes; peak RSS packing the large source ÷ the small one, per source kind;
- ``tfrecord_stream.py``: the packed files streamed, and the files streamed in place, ÷ the
  recipe's own ``tf.data`` pipeline;
- ``image_pack_speed.py``: ``memfit pack --images`` ÷ the decode limit (Pillow decode +
  resize of the same files on all cores);
- ``image_training.py``: ``model.fit`` from the packed images ÷ from
  ``image_dataset_from_directory`` of the same folder, same model, same batch.

The measured cell is the median and min–max of the per-round ratios where a script has
rounds; the pack figures are one run each. The defaults are the sizes docs/benchmarks.md
documents for each script; ``--quick`` uses small sizes and 2 rounds (a smoke check of the
whole chain, not figures to quote).

    .venv/bin/python benchmarks/sources_table.py > sources.md
    .venv/bin/python benchmarks/sources_table.py --quick

Scratch data goes under ``--dir`` and is removed afterwards, except the generated image
folders that image_pack_speed.py and image_training.py keep there to reuse in later runs.
The exit status is 1 when a script failed (its rows then say so).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from memfit.quiet import is_noise
from memfit.sizes import format_size, parse_size

HERE = Path(__file__).resolve().parent
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}
HEARTBEAT_S = 60


@dataclass
class Script:
    """One benchmark: its options (documented sizes, quick sizes), and what of its scratch
    folder it keeps by design."""

    name: str
    full: list[str]
    quick: list[str]
    keep: tuple[str, ...] = ()
    command: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exit: int | None = None
    figures: dict | None = None


SCRIPTS = [
    Script("pack_sources", ["--small", "256MiB", "--large", "2GiB"],
           ["--small", "32MiB", "--large", "128MiB"]),
    Script("tfrecord_stream", ["--size-mb", "200", "--files", "4", "--rounds", "5"],
           ["--size-mb", "20", "--files", "2", "--rounds", "2"]),
    Script("image_pack_speed", ["--count", "3000", "--rounds", "5"],
           ["--count", "300", "--rounds", "2"], keep=("photos",)),
    Script("image_training", ["--count", "1200", "--rounds", "5"],
           ["--count", "256", "--rounds", "2", "--no-cache"], keep=("photos",)),
]


def shown_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies under it, else as given."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(script: Script, index: int, json_path: Path) -> None:
    """Runs one script as a child, its output forwarded to stderr line by line with the
    elapsed time (TensorFlow's start-up lines left out), and a line every HEARTBEAT_S
    seconds while it is quiet; reads its JSON."""
    tag = f"[{index}/{len(SCRIPTS)} {script.name}"
    progress(f"{tag}] {shlex.join(script.command)}")
    started = time.perf_counter()
    proc = subprocess.Popen(script.command, env={**os.environ, **ENV}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            progress(f"{tag} {time.perf_counter() - started:.0f} s] still running")

    threading.Thread(target=heartbeat, daemon=True).start()
    assert proc.stdout is not None
    for line in proc.stdout:
        if not is_noise(line.rstrip()):         # TensorFlow's start-up lines, not news
            progress(f"{tag} {time.perf_counter() - started:.0f} s] {line.rstrip()}")
    script.exit = proc.wait()
    done.set()
    script.seconds = time.perf_counter() - started
    progress(f"{tag}] exit {script.exit} after {script.seconds / 60:.1f} min")
    if script.exit == 0 and json_path.exists():
        script.figures = json.loads(json_path.read_text())


def clean(script: Script, scratch: Path) -> None:
    """Removes what the script left in its scratch folder, but what it keeps by design."""
    if not scratch.is_dir():
        return
    for entry in scratch.iterdir():
        if entry.name in script.keep:
            progress(f"kept {entry} (reused by later runs of {script.name}.py)")
        elif entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if not any(scratch.iterdir()):
        scratch.rmdir()


def met(value: float, goal: str) -> bool:
    op, bound = goal.split()
    return value >= float(bound) if op == "≥" else value <= float(bound)


def ratio(value: float, goal: str | None = None) -> str:
    """Two decimals; three where two would print the goal's bound itself while the value
    misses it (1.104 against ≤ 1.1 is "1.104", not "1.10" beside a "no")."""
    text = f"{value:.2f}"
    if goal is not None and float(text) == float(goal.split()[1]) and not met(value, goal):
        text = f"{value:.3f}"
    return text


def spread(fig: dict, goal: str | None = None) -> str:
    """``median (min–max, N rounds)`` of a ``--json`` spread."""
    n = len(fig["per_round"])
    return f"{ratio(fig['median'], goal)} ({fig['min']:.2f}–{fig['max']:.2f}, {n} rounds)"


def verdict(value: float, goal: str) -> str:
    return "yes" if met(value, goal) else "**no**"


def rows(by_name: dict[str, Script]) -> list[tuple[str, str, str, str]]:
    """The table's rows, in the issue's order: (figure, measured, goal, met?)."""
    out: list[tuple[str, str, str, str]] = []

    def failed(script: Script, figure: str, goal: str) -> None:
        why = "not measured" if script.exit == 0 else f"failed (exit {script.exit})"
        out.append((figure, why, goal, "—"))

    ps, ts = by_name["pack_sources"], by_name["tfrecord_stream"]
    ips, it = by_name["image_pack_speed"], by_name["image_training"]

    figure = "pack of TFRecord files (the seed recipe) ÷ plain write + fsync of the same bytes"
    if ps.figures and "tfrecord_pack" in ps.figures:
        f = ps.figures["tfrecord_pack"]
        out.append((f"{figure} ({format_size(f['shard_bytes'])} of shards)",
                    f"{ratio(f['ratio'], '≥ 0.5')} (one run; {f['ratio_with_start']:.2f} with the "
                    f"process start)", "≥ 0.5", verdict(f["ratio"], "≥ 0.5")))
    else:
        failed(ps, figure, "≥ 0.5")

    for key, figure, goal in (
            ("packed", "streaming packed data ÷ the recipe's own pipeline", "≥ 3"),
            ("in_place", "streaming the same files in place ÷ that pipeline", "≥ 1.5")):
        if ts.figures:
            f = ts.figures
            what = (f"{f['samples']:,} samples, {format_size(f['file_bytes'])} in "
                    f"{f['files']} files")
            fig = f["ratio_to_recipe"][key]
            measured = spread(fig, goal)
            if key == "in_place" and "in_place_pass" in f["ratio_to_recipe"]:
                # the verdict stays on a fresh iterator an epoch (fit on a finite dataset)
                measured += (f"; one pass of {f.get('pass_epochs', '?')} epochs ÷ the "
                             f"recipe's .repeat() of as many: "
                             f"{spread(f['ratio_to_recipe']['in_place_pass'])}")
            out.append((f"{figure} ({what})", measured, goal, verdict(fig["median"], goal)))
        else:
            failed(ts, figure, goal)

    figure = ("image pack ÷ decode + resize of the same files with Pillow on all cores "
              "(the decode limit)")
    if ips.figures:
        f = ips.figures
        fig = f["pack_to_limit"]
        out.append((f"{figure} ({f['images']:,} images, {format_size(f['disk_bytes'])})",
                    spread(fig, "≥ 0.8"), "≥ 0.8", verdict(fig["median"], "≥ 0.8")))
    else:
        failed(ips, figure, "≥ 0.8")

    figure = ("training throughput from packed images ÷ image_dataset_from_directory on "
              "the same folder, same model, same batch")
    if it.figures:
        f = it.figures
        fig = f["memfit_to"]["keras"]
        measured = spread(fig, "≥ 2")
        if "ram" in f["memfit_to"]:
            measured += f"; memfit ÷ the same images in RAM: {f['memfit_to']['ram']['median']:.2f}"
        out.append((f"{figure} ({f['images']:,} images, batch {f['batch']})", measured,
                    "≥ 2", verdict(fig["median"], "≥ 2")))
    else:
        failed(it, figure, "≥ 2")

    kinds = ps.figures["kinds"] if ps.figures else {}
    sizes = (f"{format_size(parse_size(ps.figures['large']))} ÷ "
             f"{format_size(parse_size(ps.figures['small']))}") if ps.figures else "large ÷ small"
    for kind in ("tfrecord", "images", "parquet"):
        figure = f"peak RSS packing {sizes}, {kind}"
        if kind in kinds:
            k = kinds[kind]
            out.append((figure, f"{ratio(k['rss_ratio'], '≤ 1.1')} (anon "
                                f"{ratio(k['anon_ratio'], '≤ 1.1')}; "
                                f"{format_size(k['small']['peak_rss'])} → "
                                f"{format_size(k['large']['peak_rss'])}; one run)",
                        "≤ 1.1", verdict(k["rss_ratio"], "≤ 1.1")))
        else:
            failed(ps, figure, "≤ 1.1")
    return out


def machine() -> str:
    """The CPU model, the cores and the memory of this machine."""
    model, mem = "unknown CPU", ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        mem = f", {format_size(kib * 1024)} RAM"
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores{mem}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, 2 rounds: a smoke check of the whole chain")
    ap.add_argument("--dir", default="/tmp/memfit-sources-table",
                    help="scratch data (removed afterwards but the kept image folders)")
    args = ap.parse_args()

    root = Path(args.dir)
    suffix = "-quick" if args.quick else ""
    started = time.perf_counter()
    for i, script in enumerate(SCRIPTS, 1):
        scratch = root / f"{script.name}{suffix}"
        json_path = root / f"{script.name}{suffix}.json"
        scratch.mkdir(parents=True, exist_ok=True)
        json_path.unlink(missing_ok=True)
        prefix = [shown_path(sys.executable), shown_path(HERE / f"{script.name}.py")]
        script.command = [*prefix, *(script.quick if args.quick else script.full),
                          "--dir", str(scratch), "--json", str(json_path)]
        try:
            run(script, i, json_path)
        finally:
            json_path.unlink(missing_ok=True)
            clean(script, scratch)
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    progress(f"all done in {(time.perf_counter() - started) / 60:.1f} min")

    by_name = {s.name: s for s in SCRIPTS}
    print("| figure | measured: median (min–max over rounds) | goal | met? |")
    print("|---|---|---|---|")
    for row in rows(by_name):
        print("| " + " | ".join(row) + " |")
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    if os.environ.get("PYTHONPATH"):
        env = f"PYTHONPATH={os.environ['PYTHONPATH']} {env}"
    commands = "; ".join(f"`{env} {shlex.join(s.command)}` ({s.seconds / 60:.1f} min)"
                         for s in SCRIPTS)
    quick = " with --quick (small sizes, 2 rounds: a smoke check, not figures to quote)" \
        if args.quick else ""
    print(f"\nMeasured {date.today().isoformat()}{quick} on {machine()}, load "
          f"{os.getloadavg()[0]:.1f} at the end; commands: {commands}")
    if any(s.figures is None for s in SCRIPTS):
        sys.exit(1)


if __name__ == "__main__":
    main()
