"""Check every shard's sha256 and every record's CRC32C; exit 1 if anything is damaged.
An arrays dataset (memfit pack --format arrays) gets every .npy file's sha256 and header
checked; a plain directory of .npy files its headers, sizes and lengths.

examples:
  memfit verify data/train
  memfit verify data/arrays
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from memfit.cli.common import CLOSED_PIPE, print_output
from memfit.data.verification import total_bytes, verify

NAME = "verify"
HELP = "check every shard's sha256 and record CRC; exit 1 on damage"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("path", help="dataset directory (written by memfit pack), or a directory "
                                "of .npy files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    total = total_bytes(args.path)
    # A bar only on a terminal: in a log (CI, a pipe) its redraws are noise.
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="verify",
              disable=args.quiet or not sys.stderr.isatty(), leave=False) as bar:
        report = verify(args.path, progress=bar.update)
    if not print_output(str(report)):
        return CLOSED_PIPE
    return 0 if report.ok else 1
