"""Argument pieces shared by subcommands that run another command (watch, run...)."""

from __future__ import annotations

import argparse

__all__ = ["add_command_argument"]


class _Command(argparse.Action):
    """Collects everything after ``--``; an empty command is a usage error."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        command = list(values)  # type: ignore[call-overload]
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            parser.error(f"give the command to run after '--', e.g. "
                         f"{parser.prog} -- python train.py")
        setattr(namespace, self.dest, command)


def add_command_argument(p: argparse.ArgumentParser) -> None:
    """``-- CMD ...``: the command to run, as ``args.cmd``."""
    p.add_argument("cmd", nargs=argparse.REMAINDER, action=_Command, metavar="-- CMD ...",
                   help="the command to run, after '--'")

