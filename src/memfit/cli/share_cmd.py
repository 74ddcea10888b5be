"""Run several trainings on one device, never charging more than a memory budget at once.

JOBS.toml lists the jobs, one [[job]] table each: a command, an optional name, and an
optional need (a size; "auto" to estimate it for a Keras model and batch size; left out
to learn it from the job's peak in a previous run in the workdir). Every job is charged
its need plus the per-process overhead of the device (the framework baseline measured
by `memfit calibrate`: on the CPU the RSS of a process with TensorFlow started; on a GPU
the memory above the cap). Jobs are packed on the budget largest first, the rest queue
and start as others end. Each job's process tree is watched with the one probe: a job
that goes above its share is stopped (with --restart: supervised by `memfit run`, which
restarts it from its checkpoints) while the others keep running. On a GPU each job is
capped at its need (the job calls memfit.configure_device()). The whole file is checked
before anything starts. Output: WORKDIR/jobs/NAME/{stdout,stderr}.log; one log,
WORKDIR/memory.jsonl, that `memfit report WORKDIR` draws. With --ray the same jobs run
on a Ray cluster: each declares its charge to Ray as memory, is held to its share on its
node, and resumes exactly on another node if its node dies (docs/scale-out.md). Exit
code: 0 when every job finished, 1 when one failed or was stopped, 2 for a bad jobs file
(or a job that fits no node), 130 on Ctrl-C.

example JOBS.toml:
  budget = "2GiB"                 # optional (--budget wins)

  [[job]]
  name = "mlp"
  command = ["python", "train.py", "--width", "256"]
  need = "400MiB"

  [[job]]
  name = "cnn"
  command = "python train_cnn.py --batch 64"
  need = "auto"
  model = "mymodels:make_cnn"
  batch_size = 64

examples:
  memfit share examples/jobs.toml --budget 2GiB --workdir runs/share
  memfit share jobs.toml --dry-run                  # the plan: needs, charges, first wave
  memfit share jobs.toml --device gpu:0 --budget 40GiB --restart
  memfit share jobs.toml --ray                      # a local Ray instance ($RAY_ADDRESS: join it)
  memfit share jobs.toml --ray 10.0.0.5:6379 --workdir /shared/runs/share
  memfit report runs/share                          # every job on one timeline
"""

from __future__ import annotations

import argparse

from memfit.cli.common import add_report_argument, seconds, write_report_if_asked

NAME = "share"
HELP = "run several trainings on one device within a memory budget"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memfit.share.layout import DEFAULT_WORKDIR

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("jobs", metavar="JOBS.toml", help="the jobs file (TOML, [[job]] tables)")
    p.add_argument("--budget", metavar="SIZE",
                   help="memory all running jobs may hold together, e.g. 12GiB (default: the "
                        "file's budget, else memory available now / the GPU's free memory)")
    p.add_argument("--device", metavar="DEVICE",
                   help="cpu or gpu:N (default: the file's, else gpu:0 when a GPU is "
                        "visible, else cpu)")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, metavar="DIR",
                   help=f"shared log and per-job output in DIR/jobs/NAME "
                        f"(default: {DEFAULT_WORKDIR})")
    p.add_argument("--restart", action="store_true",
                   help="supervise each job with memfit run: restart it from its checkpoints "
                        "when it goes over its share, instead of stopping it")
    p.add_argument("--overhead", metavar="SIZE",
                   help="per-process overhead charged to every job (default: the calibrated "
                        "framework baseline; e.g. 16MiB for jobs that are not TensorFlow)")
    p.add_argument("--interval", type=seconds, default=0.5, metavar="SECONDS",
                   help="seconds between samples of every job (default: 0.5)")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="run the jobs on a Ray cluster, each placed by its charge and held to "
                        "it on its node: join ADDRESS (host:port), else $RAY_ADDRESS, else "
                        "start a local Ray instance; needs pip install 'memfit[ray]' (see "
                        "docs/scale-out.md)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the jobs file and print the plan; start nothing")
    add_report_argument(p)


def run(args: argparse.Namespace) -> int:
    from memfit.share import plan, share

    if args.ray is not None and args.dry_run:
        raise ValueError("--dry-run plans the jobs on one machine's budget; with --ray the "
                         "nodes place them, so there is no plan to print before Ray is asked. "
                         "Leave out --ray to see the needs and charges, or --dry-run to run "
                         "the jobs on Ray")
    if args.ray == "":
        raise ValueError("--ray got an empty address: give a cluster's host:port, or --ray "
                         "alone for $RAY_ADDRESS or a local Ray instance. Received: --ray ''")
    if args.ray is not None:
        result = share(args.jobs, budget=args.budget, device=args.device,
                       overhead=args.overhead, workdir=args.workdir, restart=args.restart,
                       interval=args.interval, ray=args.ray)
    else:
        planned = plan(args.jobs, budget=args.budget, device=args.device,
                       overhead=args.overhead, workdir=args.workdir, restart=args.restart)
        if args.dry_run:
            print(planned)
            return 0
        result = share(planned, interval=args.interval)   # prints the plan, then the status
    write_report_if_asked(args)
    return result.exit_code
