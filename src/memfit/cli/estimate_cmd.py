"""Estimate a Keras model's training memory before running it.

MODEL is a .keras file or module:function returning a model (keras.applications
functions are called with weights=None). memfit builds the model, traces one training
step and plays its tensors' lifetimes: weights, optimizer slots, gradients and
activations at the step's peak, the input batch, the runtime and the framework
baseline (from `memfit calibrate`), and the range the estimate carries under the
allocator policy (low - high: how far it was off on model families it was not fitted
on, docs/estimate.md). With --budget it answers "fits" only when the high end fits,
"does not fit" when not even the low end does, and otherwise "uncertain: run memfit
find-batch-size"; it gives the largest batch size whose high end fits, and what to
change. --measure also runs a few real training steps in a child process and prints
predicted vs measured.

Exit status: 0 (without --budget, or it fits); 1 when the batch does not fit; 3 when it
is uncertain (the budget is inside the range: a script that trains on exit 0 does not
start a training the estimate cannot vouch for); 2 on bad input.

examples:
  memfit estimate model.keras --batch-size 64
  memfit estimate keras.applications:ResNet50 --input-shape 224,224,3 --batch-size 32 \\
      --dtype-policy mixed_float16 --optimizer sgd+momentum --budget 8GiB
  memfit estimate mymodels:make_cnn --batch-size 128 --measure
  memfit estimate mymodels:make_cnn --json > estimate.json
"""

from __future__ import annotations

import argparse
import json
import sys

from memfit.estimate.band import DOES_NOT_FIT, FITS, UNCERTAIN
from memfit.estimate.optimizers import OPTIMIZERS
from memfit.sizes import format_count, format_size

NAME = "estimate"
#: The exit status for each answer to --budget (``None``: no budget given).
EXIT_STATUS = {None: 0, FITS: 0, DOES_NOT_FIT: 1, UNCERTAIN: 3}
HELP = "estimate a Keras model's training memory (and the largest batch that fits)"


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL, --dtype-policy, --optimizer, --input-shape: shared with find-batch-size."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("model", metavar="MODEL", help="a .keras file or module:function")
    p.add_argument("--dtype-policy", metavar="P", default=None,
                   help="Keras dtype policy: float32, mixed_float16, mixed_bfloat16... "
                        "(default: the model's own)")
    p.add_argument("--optimizer", metavar="O", default=None,
                   help=f"one of {', '.join(OPTIMIZERS)} (default: the optimizer a "
                        f"MODULE:FUNCTION model is compiled with, else adam; a .keras file "
                        f"is read without its compile settings: name its optimizer here)")
    p.add_argument("--input-shape", metavar="SHAPE", default=None,
                   help="shape of one sample without the batch dimension, for models that "
                        "do not know it: 224,224,3 (several inputs: '32,32,3;10')")
    p.add_argument("--device", default="cpu", help="cpu or gpu:N (default: cpu)")
    p.add_argument("--allocator", choices=("default", "fixed"), default="default",
                   help="allocator policy of the training process: default (glibc as it "
                        "comes) or fixed (MALLOC_MMAP_THRESHOLD_=131072: less memory, "
                        "predicted more tightly, slower steps); measuring children run "
                        "under it too (default: default)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--batch-size", "-b", type=int, default=32, metavar="B",
                   help="samples per training step (default: 32)")
    p.add_argument("--budget", metavar="SIZE", default=None,
                   help="memory available to the training process (512MiB, 8GiB...)")
    p.add_argument("--dataset-budget", metavar="SIZE", default=None,
                   help="input pipeline buffers to count (a memfit.dataset memory_budget)")
    p.add_argument("--measure", action="store_true",
                   help="also run real training steps in a child process and compare")
    p.add_argument("--steps", type=int, default=4,
                   help="training steps for --measure (default: 4)")
    p.add_argument("--json", action="store_true", help="print JSON for tools")


def run(args: argparse.Namespace) -> int:
    from memfit.estimate.estimator import estimate
    from memfit.estimate.measure import measure_training

    e = estimate(args.model, args.batch_size, optimizer=args.optimizer,
                 dtype_policy=args.dtype_policy, input_shape=args.input_shape,
                 dataset_budget=args.dataset_budget, budget=args.budget, device=args.device,
                 allocator=args.allocator)
    measured = None
    if args.measure:
        print(f"measuring {args.steps} training steps of batch {args.batch_size} in a "
              f"child process...", file=sys.stderr)
        r = measure_training(args.model, args.batch_size, dtype_policy=args.dtype_policy,
                             optimizer=args.optimizer, input_shape=args.input_shape,
                             steps=args.steps, device=args.device,
                             allocator=args.allocator)
        measured = {"status": r.status, "measured": r.measured, "peak": r.peak,
                    "baseline": r.baseline, "message": r.message}
        if r.status == "ok" and r.measured:
            measured["predicted"] = e.model_bytes
            measured["relative_error"] = (e.model_bytes - r.measured) / r.measured
    if args.json:
        out = e.to_json()
        if measured is not None:
            out["measure"] = measured
        print(json.dumps(out, indent=1))
    else:
        print(e)
        if measured is not None:
            _print_measure(measured, e.model_bytes, args.steps)
    return EXIT_STATUS[e.verdict]


def _print_measure(measured: dict, predicted: int, steps: int) -> None:
    """``--measure``'s lines under the table: predicted vs measured."""
    print()
    if measured["status"] != "ok":
        print(f"measure: the child failed ({measured['status']}): {measured['message']}")
        return
    print(f"measure (model memory over the framework baseline, peak of "
          f"{format_count(steps, 'step')}):")
    print(f"  predicted {format_size(predicted):>10}")
    print(f"  measured  {format_size(measured['measured']):>10}   "
          f"(process peak {format_size(measured['peak'])}, baseline "
          f"{format_size(measured['baseline'])})")
    print(f"  error     {measured['relative_error'] * 100:+9.1f} %")
