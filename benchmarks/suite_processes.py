"""Where the test suite's time goes: every Python process it starts, what it imported and
the CPU it used (issue 28's `make test` ≤ 10 min).

    .venv/bin/python benchmarks/suite_processes.py                 # the whole suite (~15 min)
    .venv/bin/python benchmarks/suite_processes.py -- tests/story  # pytest arguments
    .venv/bin/python benchmarks/suite_processes.py --report-only   # the last run's records

For the length of the run, a ``.pth`` file in this interpreter's ``site-packages`` makes
every process of this virtual environment (pytest's workers, each test's children and
theirs) write, when it exits, its arguments, its CPU time, its wall time and whether it
imported TensorFlow, JAX or Keras. A process killed on purpose (the fault campaigns'
SIGKILLs) or leaving by ``os._exit`` (a warm parent's forks, Ray's workers) writes
nothing, so the totals are a floor. The ``.pth`` file is removed at the end, also on
Ctrl-C. Prints markdown: the totals, then the test files by the CPU of their children.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK = "_memfit_suite_audit"
RECORDS = Path(tempfile.gettempdir()) / "memfit-suite-processes"

HOOK_CODE = '''
import atexit, json, os, resource, sys, time
_T0, _PID = time.time(), os.getpid()
def _dump():
    if os.getpid() != _PID:
        return
    try:
        r = resource.getrusage(resource.RUSAGE_SELF)
        m = sys.modules
        rec = {"pid": _PID, "argv": sys.argv[:4], "cwd": os.getcwd(),
               "tf": "tensorflow" in m, "jax": "jax" in m, "keras": "keras" in m,
               "cpu": r.ru_utime + r.ru_stime, "wall": time.time() - _T0,
               "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
        with open(os.path.join(RECORDS, "%d.json" % _PID), "w") as f:
            json.dump(rec, f)
    except Exception:
        pass
atexit.register(_dump)
'''.replace("RECORDS", repr(str(RECORDS)))


def where(rec: dict) -> str:
    """The test file a process belongs to: from the environment pytest gives its test,
    else from the test's temporary directory in its working directory."""
    if rec["test"]:
        return rec["test"].split("::")[0]
    cwd = rec["cwd"]
    if "/pytest-of-" in cwd:
        return "(a test's directory: " + cwd.rsplit("/", 1)[-1] + ")"
    if cwd != str(ROOT):
        return "(elsewhere)"
    script = Path(rec["argv"][0]).name if rec["argv"] and rec["argv"][0] else ""
    return f"(in the repository: {script or 'python -c'})"


def report(records: list[dict], wall: float | None, rusage_cpu: float | None) -> str:
    def kind(r: dict) -> str:
        return "TensorFlow" if r["tf"] else "JAX" if r["jax"] else "neither"

    lines = ["| processes that exited normally | CPU s | of them importing | count | CPU s |",
             "|---:|---:|---|---:|---:|"]
    by_kind = collections.defaultdict(list)
    for r in records:
        by_kind[kind(r)].append(r)
    total = sum(r["cpu"] for r in records)
    for i, k in enumerate(("TensorFlow", "JAX", "neither")):
        rs = by_kind.get(k, [])
        head = (f"| {len(records)} | {total:.0f} " if i == 0 else "| | ")
        lines.append(head + f"| {k} | {len(rs)} | {sum(r['cpu'] for r in rs):.0f} |")
    if wall is not None and rusage_cpu is not None:
        lines += ["", f"Suite: {wall:.0f} s wall; CPU of pytest and every process it waited "
                  f"for {rusage_cpu:.0f} s ({rusage_cpu / wall:.2f} cores busy on average)."]
    per: dict[str, list] = collections.defaultdict(lambda: [0, 0, 0.0])
    for r in records:
        row = per[where(r)]
        row[0] += 1
        row[1] += r["tf"] or r["jax"]
        row[2] += r["cpu"]
    lines += ["", "| where | processes | importing TF or JAX | CPU s |", "|---|---:|---:|---:|"]
    for name, (n, fw, cpu) in sorted(per.items(), key=lambda kv: -kv[1][2])[:30]:
        lines.append(f"| {name} | {n} | {fw} | {cpu:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report-only", action="store_true", help="report the last run's records")
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments "
                   "(default: the suite as make test runs it)")
    args = p.parse_args(argv)
    wall = cpu = None
    if not args.report_only:
        site = Path(sysconfig.get_paths()["purelib"])
        if not os.access(site, os.W_OK):
            print(f"error: cannot write to {site}: run this with the project's .venv",
                  file=sys.stderr)
            return 2
        shutil.rmtree(RECORDS, ignore_errors=True)
        RECORDS.mkdir(parents=True)
        module, pth = site / f"{HOOK}.py", site / f"zz{HOOK}.pth"
        module.write_text(HOOK_CODE)
        pth.write_text(f"import {HOOK}\n")
        pytest_args = args.pytest_args or ["-q", "-n", "2", "--dist", "loadfile", "tests"]
        start, before = time.time(), os.times()
        try:
            subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, check=False)
        finally:
            pth.unlink(missing_ok=True)
            module.unlink(missing_ok=True)
        after = os.times()
        wall = time.time() - start
        cpu = (after.children_user - before.children_user
               + after.children_system - before.children_system)
    records = [json.loads(f.read_text()) for f in sorted(RECORDS.glob("*.json"))]
    if not records:
        print(f"error: no records in {RECORDS}: run without --report-only first",
              file=sys.stderr)
        return 2
    print(report(records, wall, cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
