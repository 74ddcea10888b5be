"""Run a command and watch the memory of its whole process tree from outside.

The command runs unchanged (same terminal, same environment). Every --interval seconds
its process tree is sampled (anonymous and file-backed RSS apart) into WORKDIR/memory.jsonl;
on a terminal a status line shows anonymous RSS, peak and slope. At exit memfit prints the
peak, the growth and a verdict (stable, warm-up, leak...) and exits with the command's
exit code. Ctrl-C and SIGTERM reach the command; the verdict is still written.

examples:
  memfit watch -- python train.py --epochs 20
  memfit watch --workdir runs/leak -- python examples/leaky_script.py
  memfit report runs/leak
  memfit watch --report --workdir runs/exp -- python train.py
"""

from __future__ import annotations

import argparse
import sys

from memfit.cli.common import (
    add_command_argument,
    add_report_argument,
    seconds,
    write_report_if_asked,
)
from memfit.memory.watch import watch

NAME = "watch"
HELP = "run a command and watch its memory (process tree) from outside"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--interval", type=seconds, default=0.5, metavar="SECONDS",
                   help="seconds between samples (default: 0.5)")
    p.add_argument("--workdir", default="memfit-watch", metavar="DIR",
                   help="where the log memory.jsonl goes (default: memfit-watch)")
    add_report_argument(p)
    add_command_argument(p)


def run(args: argparse.Namespace) -> int:
    result = watch(args.cmd, interval=args.interval, workdir=args.workdir)
    print(result, file=sys.stderr)
    write_report_if_asked(args)
    return result.exit_code
