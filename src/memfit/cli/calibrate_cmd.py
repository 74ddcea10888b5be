"""Measure the framework baseline of this machine and cache it for `memfit estimate`.

The baseline is the memory a training process holds before it has a model: on the CPU,
the anonymous RSS of a fresh Python after `import tensorflow, keras` and one op; on a
GPU (--device gpu:0), the device memory the driver charges to such a process (CUDA
context, libraries, TensorFlow's first region), which a per-process cap does not cover.
It is measured in fresh child processes (the median of --runs) and cached in
$XDG_CACHE_HOME/memfit/calibration.json (default ~/.cache/memfit/).

examples:
  memfit calibrate
  memfit calibrate --device gpu:0 --json
  memfit calibrate --show
"""

from __future__ import annotations

import argparse
import json

NAME = "calibrate"
HELP = "measure and cache the framework's memory baseline on this machine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--device", default="cpu", help="cpu or gpu:N (default: cpu)")
    p.add_argument("--runs", type=int, default=3, help="child processes to measure (median)")
    p.add_argument("--show", action="store_true",
                   help="print the cached calibration without measuring")
    p.add_argument("--json", action="store_true", help="print JSON for tools")


def run(args: argparse.Namespace) -> int:
    from memfit.estimate.baseline import cache_path, calibrate, check_device, load_calibration

    device = check_device(args.device)
    if args.show:
        c = load_calibration(device)
        if c is None:
            print(json.dumps(None) if args.json else
                  f"no calibration cached for {device} in {cache_path()}: run memfit calibrate")
            return 1
    else:
        c = calibrate(device, runs=args.runs)
    if args.json:
        print(json.dumps({**c.to_json(), "cache": str(cache_path())}, indent=1))
    else:
        print(c)
        print(f"cached in {cache_path()}")
    return 0
