"""Print a packed dataset's schema, splits, counts and sizes from its manifest (TFRecord
or arrays format), or the arrays of a directory of .npy files.

examples:
  memfit inspect data/train
  memfit inspect data/arrays
"""

from __future__ import annotations

import argparse

from memfit.cli.common import CLOSED_PIPE, print_output
from memfit.data.verification import inspect

NAME = "inspect"
HELP = "print a packed dataset's schema, counts and sizes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("path", help="dataset directory (written by memfit pack), or a directory "
                                "of .npy files")


def run(args: argparse.Namespace) -> int:
    return 0 if print_output(inspect(args.path)) else CLOSED_PIPE
