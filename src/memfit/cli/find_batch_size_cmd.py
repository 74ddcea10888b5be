"""Find the largest batch size that trains within a memory budget, OOM-safely.

Each attempt runs a few real training steps in a child process; memfit watches the
child's memory and kills it when it passes --budget (that batch size "does not fit"),
so this command never runs out of memory itself. The search starts from the estimate
(`memfit estimate`): its safe end first, then where the measured peaks say the budget is
reached, then one trial just past the answer to prove it (3 trials when the estimate is
close); where that stalls, it bisects. The output lists the trials against the estimate's
range.

Exit status: 0 when a batch size fits; 1 when none does; 2 on bad input.

examples:
  memfit find-batch-size model.keras --budget 4GiB
  memfit find-batch-size mymodels:make_cnn --budget 2GiB --dtype-policy mixed_float16
  memfit find-batch-size keras.applications:MobileNetV2 --input-shape 96,96,3 \\
      --budget 3GiB --precision 0.05 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from memfit.cli.estimate_cmd import add_model_arguments

NAME = "find-batch-size"
HELP = "find the largest batch size that fits a memory budget (real steps, in children)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--budget", required=True, metavar="SIZE",
                   help="memory the training process may use (2GiB, 512MiB...)")
    p.add_argument("--steps", type=int, default=2, help="training steps per attempt")
    p.add_argument("--precision", type=float, default=0.03,
                   help="stop when the answer is known within this fraction (default: "
                        "0.03; 0: exact, to one sample)")
    p.add_argument("--max-trials", type=int, default=10, help="most attempts (default: 10)")
    p.add_argument("--start", type=int, default=None,
                   help="first batch size to try (default: the estimate's)")
    p.add_argument("--prove", action="store_true",
                   help="run the batch size just past the answer even where the measured "
                        "peaks already put it over the budget (one child more; by default "
                        "the search stops there and says so)")
    p.add_argument("--cold", action="store_true",
                   help="start each child as a new interpreter (by default, on the CPU, "
                        "each is forked from a parent that imported the frameworks once)")
    p.add_argument("--json", action="store_true", help="print JSON for tools")


def run(args: argparse.Namespace) -> int:
    from memfit.estimate.search import Trial, find_batch_size
    from memfit.sizes import format_size

    def progress(trial: Trial) -> None:
        peak = format_size(trial.peak) if trial.peak is not None else "n/a"
        print(f"  batch {trial.batch_size}: {trial.status} (peak {peak})", file=sys.stderr)

    r = find_batch_size(args.model, args.budget, dtype_policy=args.dtype_policy,
                        optimizer=args.optimizer, input_shape=args.input_shape,
                        steps=args.steps, device=args.device, precision=args.precision,
                        max_trials=args.max_trials, start=args.start,
                        allocator=args.allocator, prove=args.prove, warm=not args.cold,
                        on_trial=None if args.json else progress)
    print(json.dumps(r.to_json(), indent=1) if args.json else r)
    return 0 if r.batch_size else 1
