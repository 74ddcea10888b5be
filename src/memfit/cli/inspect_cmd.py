"""Print a packed dataset's schema, splits, counts and sizes from its manifest (TFRecord
or arrays format), the arrays of a directory of .npy files, or the feature spec memfit
infers from TFRecord files of tf.train.Example records (every record read and checked).

examples:
  memfit inspect data/train
  memfit inspect data/arrays
  memfit inspect 'data/path*.tfrecords'
"""

from __future__ import annotations

import argparse
import glob
import os

from memfit.cli.common import CLOSED_PIPE, print_output
from memfit.data.sources.tfrecord_source import describe_tfrecords
from memfit.data.verification import inspect

NAME = "inspect"
HELP = "print a packed dataset's schema, counts and sizes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("path", help="dataset directory (written by memfit pack), a directory "
                                "of .npy files, or TFRecord files (a file or a quoted glob)")


def _tfrecord_files(path: str) -> bool:
    """Whether ``path`` names TFRecord files rather than a dataset: a glob, or a file
    that is not a manifest or an .npy file."""
    if glob.has_magic(path) and not os.path.exists(path):
        return True
    return os.path.isfile(path) and not path.endswith((".json", ".npy"))


def run(args: argparse.Namespace) -> int:
    text = describe_tfrecords(args.path) if _tfrecord_files(args.path) else inspect(args.path)
    return 0 if print_output(text) else CLOSED_PIPE
