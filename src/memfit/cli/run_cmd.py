"""Run a training command and restart it from its checkpoints until it finishes.

The command (a Keras script using memfit.session()) runs unchanged; its output streams
through. memfit samples its process tree (anonymous RSS; memory-mapped data does not
count) and starts it again from its last checkpoint: every --restart-every epochs; when
it reaches --max-rss (it is asked to checkpoint after its current step and exit); when it
reaches --hard-rss or does not answer within --grace seconds (it is killed); after a
crash or an OOM kill (with backoff). SIGTERM (a preemption) is passed on: the command
checkpoints after its current step and exits, the run stops, and running the same
command again resumes with no step redone. The same failure at the same checkpoint twice in a
row stops the run, as do more than --max-restarts unplanned restarts. Everything goes to
WORKDIR/memory.jsonl: `memfit report WORKDIR` shows the restarts on the timeline.
Exit code: 0 when the training finished, else the last process's exit code.

examples:
  memfit run --restart-every 1 -- python train.py
  memfit run --workdir runs/exp1 --max-rss 6GiB --hard-rss 8GiB -- python train.py
  memfit report runs/exp1
"""

from __future__ import annotations

import argparse

from memfit.cli.common import add_command_argument, add_report_argument, write_report_if_asked
from memfit.supervise import restart_protocol
from memfit.supervise.supervisor import run as supervise

NAME = "run"
HELP = "run a training command, restarting it from checkpoints (every N epochs, by memory, " \
       "after a crash)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--workdir", default=restart_protocol.DEFAULT_WORKDIR, metavar="DIR",
                   help=f"log and checkpoints; given to the command as $MEMFIT_WORKDIR "
                        f"(default: {restart_protocol.DEFAULT_WORKDIR})")
    p.add_argument("--restart-every", type=int, metavar="N",
                   help="start a new process every N epochs")
    p.add_argument("--max-rss", metavar="SIZE",
                   help="anonymous RSS (e.g. 6GiB) at which the command checkpoints after its "
                        "current step and is restarted")
    p.add_argument("--hard-rss", metavar="SIZE",
                   help="anonymous RSS at which the command is killed and resumed from its last "
                        "checkpoint (above --max-rss)")
    p.add_argument("--max-restarts", type=int, default=10, metavar="K",
                   help="restarts not asked by --restart-every before giving up (default: 10)")
    p.add_argument("--grace", type=float, default=60.0, metavar="SECONDS",
                   help="time to answer a --max-rss request before a kill (default: 60)")
    p.add_argument("--stop-grace", type=float, default=30.0, metavar="SECONDS",
                   help="after a SIGTERM (a preemption), time the command has to checkpoint "
                        "and exit before it is killed (default: 30)")
    p.add_argument("--start", choices=("auto", "warm", "cold"), default="auto",
                   help="warm: fork each process from a parent that imported the frameworks "
                        "once (a restart skips the import; falls back to cold where unsafe, "
                        "saying why); cold: a new interpreter each time; auto (default): "
                        "warm when restarts are planned (--restart-every, --max-rss)")
    p.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                   help="seconds between memory samples (default: 0.5)")
    add_report_argument(p)
    add_command_argument(p)


def run(args: argparse.Namespace) -> int:
    result = supervise(args.cmd, workdir=args.workdir, restart_every=args.restart_every,
                       max_rss=args.max_rss, hard_rss=args.hard_rss,
                       max_restarts=args.max_restarts, grace=args.grace,
                       interval=args.interval, stop_grace=args.stop_grace, start=args.start)
    write_report_if_asked(args)
    return result.exit_code
