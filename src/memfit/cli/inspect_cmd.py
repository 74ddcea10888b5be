"""Print a packed dataset's schema, splits, counts and sizes from its manifest (TFRecord
or arrays format), or the arrays of a directory of .npy files.

examples:
  memfit inspect data/train
  memfit inspect data/arrays
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from memfit.data.verify import inspect

NAME = "inspect"
HELP = "print a packed dataset's schema, counts and sizes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("path", help="dataset directory (written by memfit pack), or a directory "
                                "of .npy files")


# The exit status of a command whose reader went away, as a shell reports SIGPIPE.
CLOSED_PIPE = 128 + signal.SIGPIPE


def print_output(text: str) -> bool:
    """Prints ``text`` on stdout; ``False`` when its reader has gone (``memfit inspect DIR
    | head -1``): stdout then points at /dev/null, so that the flush at exit is quiet."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False


def run(args: argparse.Namespace) -> int:
    return 0 if print_output(inspect(args.path)) else CLOSED_PIPE
