"""Run a training command for a few steps and say what to change about its memory.

The command runs unchanged; memfit watches its process tree from outside and, in its
Python processes that import Keras, a probe (put in through $PYTHONPATH: no edit of the
script) watches model.fit step by step and ends the training after --epochs epochs (by
default 3 epochs or 120 s, whichever comes first: long enough to see what repeats every
epoch), --steps steps or --seconds seconds, then measures: the NumPy arrays (and Python
lists of them) and tf.data buffers held, the memory per step (leak, allocator retention,
warm-up), what a del + gc.collect() between fit() calls leaves and what a malloc_trim
gives back, the model's training step (memfit estimate) and, on a GPU, its memory
settings and who else uses the device. It then prints a ranked list of findings, each
with the numbers measured, why they matter and the memfit command or code change that
fixes it. A finding that does not apply is not shown. Everything goes to WORKDIR:
memory.jsonl (`memfit report WORKDIR` draws it) and doctor.json (what --json prints).

Exit code: the command's (0 when the doctor stopped it), 127 when it does not exist,
2 on bad arguments.

examples:
  memfit doctor -- python train.py --epochs 50
  memfit doctor --epochs 5 -- python train.py
  memfit doctor --steps 200 --workdir runs/doctor -- python train.py
  memfit doctor --seconds 120 -- python train.py
  memfit doctor --json -- python train.py > findings.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

from memfit.cli.common import add_command_argument, count, seconds

NAME = "doctor"
HELP = "run a training command for a few steps and say what to change about its memory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memfit.doctor.checkup import (
        DEFAULT_EPOCHS,
        DEFAULT_INTERVAL,
        DEFAULT_SECONDS,
        DEFAULT_WORKDIR,
    )

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--epochs", type=count, metavar="N",
                   help=f"epochs to run, over all fit() calls (default: {DEFAULT_EPOCHS}, or "
                        f"{DEFAULT_SECONDS:.0f} s, whichever comes first)")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--steps", type=count, metavar="N",
                       help="or training steps to run, over all fit() calls")
    bound.add_argument("--seconds", type=seconds, metavar="S",
                       help="or seconds to run, from the start of the command (with "
                            "--epochs: whichever comes first)")
    p.add_argument("--json", action="store_true",
                   help="print the findings as JSON on stdout (the command's own output goes "
                        "to stderr)")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, metavar="DIR",
                   help=f"where memory.jsonl and doctor.json go (default: {DEFAULT_WORKDIR})")
    p.add_argument("--interval", type=seconds, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"seconds between samples of the process tree (default: "
                        f"{DEFAULT_INTERVAL})")
    add_command_argument(p)


@contextlib.contextmanager
def _stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """With --json, the command's stdout goes to stderr, so that stdout is JSON only."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    from memfit.doctor.checkup import doctor

    with _stdout_to_stderr(args.json):
        if args.steps is not None and args.epochs is not None:
            print("memfit doctor: error: give --steps or --epochs, not both. Received: "
                  f"--steps {args.steps} --epochs {args.epochs}", file=sys.stderr)
            return 2
        result = doctor(args.cmd, steps=args.steps, seconds=args.seconds,
                        epochs=args.epochs, workdir=args.workdir, interval=args.interval)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(result)
    return result.exit_code
