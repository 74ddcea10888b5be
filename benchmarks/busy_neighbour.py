"""Runs tests with a busy neighbour: a CPU hog pinned to the same core as the tests.

A test that depends on timing must pass with a busy process beside it (issue 24: on a fresh
clone, with a second process busy, `memfit watch` called the seed story a leak). This
script starts one hog process (a `while True: pass` loop) per CPU it pins to, runs pytest
on the tests given, round after round, and prints a markdown table: rounds passed, and how
long each round took, against one round without the hog.

Pinning (``--pin``):

- ``same`` (default): pytest, everything it starts, and the hog share the same single
  CPU (``os.sched_setaffinity``). The tests get about half a core, on any machine: a hog
  on "another core" of a 64-core CI runner would leave the tests alone.
- ``beside``: the hog is pinned to one CPU, the tests run where the scheduler puts them
  (the busy neighbour of the failed CI run).

The hog never outlives this script: it stops when its parent is gone, and after
``--max-seconds`` in any case.

Example:
    .venv/bin/python benchmarks/busy_neighbour.py --rounds 5 -- tests/story \\
        tests/memory/test_watch.py

Args (command line):
    --rounds N: rounds under the hog (default 5).
    --pin same|beside: see above.
    --baseline: also run one round without the hog first, for the time ratio.
    --max-seconds S: the hog's own deadline (default 3600).
    after ``--``: what to give pytest (default: the story and watch tests).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = ["tests/story", "tests/memory/test_watch.py"]

# Spins until its parent is gone (this script killed, even by SIGKILL) or the deadline.
HOG = ("import os, sys, time\n"
       "parent, end = os.getppid(), time.monotonic() + float(sys.argv[1])\n"
       "while os.getppid() == parent and time.monotonic() < end:\n"
       "    for _ in range(200_000):\n"
       "        pass\n")


def _cpu() -> int:
    """The CPU to pin to: the last one this process may run on."""
    return max(os.sched_getaffinity(0))


def start_hog(cpu: int, max_seconds: float) -> subprocess.Popen:
    """A busy process pinned to ``cpu``."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(max_seconds)])
    os.sched_setaffinity(hog.pid, {cpu})
    return hog


def stop(hog: subprocess.Popen) -> None:
    if hog.poll() is None:
        hog.kill()
    hog.wait()


def run_round(tests: list[str], cpus: set[int] | None) -> tuple[int, float, str]:
    """pytest on ``tests`` (pinned to ``cpus`` when given): exit code, seconds, summary."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    started = time.monotonic()
    # its own session, so that everything it started can be ended with it
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             *tests], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=pin,
                            start_new_session=True)
    try:
        out, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - started
    lines = [x for x in out.splitlines() if x.strip()]
    summary = lines[-1].strip("= ") if lines else "no output"
    if proc.returncode != 0:
        print(out[-8000:], file=sys.stderr)
    return proc.returncode, seconds, summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tests = DEFAULT_TESTS
    if "--" in argv:
        i = argv.index("--")
        argv, tests = argv[:i], argv[i + 1:] or DEFAULT_TESTS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pin", choices=("same", "beside"), default="same")
    p.add_argument("--baseline", action="store_true")
    p.add_argument("--max-seconds", type=float, default=3600.0)
    args = p.parse_args(argv)
    # SIGTERM ends the rounds like Ctrl-C: the finally blocks stop pytest and the hog
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1. Received: --rounds={args.rounds}")
    cpu = _cpu()
    rows = []
    if args.baseline:
        rc, seconds, summary = run_round(tests, None)
        rows.append(("no hog", rc, seconds, summary))
        print(f"no hog: {summary} in {seconds:.0f} s", file=sys.stderr, flush=True)
    for i in range(args.rounds):
        hog = start_hog(cpu, args.max_seconds)
        try:
            rc, seconds, summary = run_round(tests, {cpu} if args.pin == "same" else None)
        finally:
            stop(hog)
        rows.append((f"hog {i + 1} ({args.pin} CPU)", rc, seconds, summary))
        print(f"round {i + 1}: {summary} in {seconds:.0f} s", file=sys.stderr, flush=True)
    passed = sum(rc == 0 for name, rc, _, _ in rows if name.startswith("hog"))
    print(f"\npytest {' '.join(tests)}, a CPU hog pinned to CPU {cpu} "
          f"({'with the tests' if args.pin == 'same' else 'tests unpinned'})\n")
    print("| round | result | seconds |\n| --- | --- | --- |")
    for name, _rc, seconds, summary in rows:
        print(f"| {name} | {summary} | {seconds:.0f} |")
    print(f"\n**{passed} / {args.rounds}** rounds passed under the hog")
    return 0 if passed == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
