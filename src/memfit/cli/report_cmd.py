"""memfit report (being written)."""

import argparse

NAME = "report"
HELP = "(being written)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError
