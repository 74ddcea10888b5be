"""Pieces shared by the subcommands: the command after ``--``, one argparse type per kind
of value, and printing to a reader that may go away.

Every subcommand reads a count (``--steps 50``), a number of seconds (``--interval 0.5``)
or a size (``--max-rss 6GiB``) with the same type, so the same mistake gets the same
message everywhere; argparse prefixes it with the option's name and exits with code 2::

    memfit doctor: error: argument --steps: must be an integer >= 1, such as 3. Received: '0'

Example:
    >>> count("50"), seconds("0.5"), size("1KiB")
    (50, 0.5, 1024)
    >>> count("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be an integer >= 1, such as 3. Received: '0'
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from memfit.sizes import parse_size

__all__ = ["Parser", "add_command_argument", "count", "seconds", "size", "print_output",
           "silence_stdout", "cli_spelling", "CliSpelling", "CLOSED_PIPE"]

# The exit status of a command whose reader went away, as a shell reports SIGPIPE.
CLOSED_PIPE = 128 + signal.SIGPIPE


# argparse's message for an option whose value it did not find ("argument --image-size:
# expected one argument"): the option's names, joined by '/'.
_NO_VALUE = re.compile(r"^argument (\S+): expected (?:one argument|at least one argument)$")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose "expected one argument" says why when the value was there
    but begins with '-' (``--image-size -3,32``: argparse reads ``-3,32`` as an option),
    and how to give it (``--image-size=-3,32``). ``memfit`` and each subcommand use it."""

    _given: Sequence[str] = ()

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        super().error(message + self._dash_value(message))

    def _dash_value(self, message: str) -> str:
        """What to add to argparse's message: the value that begins with '-', and the
        ``--option=VALUE`` form that gives it; nothing when that is not the case."""
        found = _NO_VALUE.match(message)
        if found is None:
            return ""
        names = found[1].split("/")
        given = list(self._given)
        for i, token in enumerate(given[:-1]):
            named = token in names or (token.startswith("--") and len(token) > 2 and any(
                n.startswith(token) for n in names))
            value = given[i + 1]
            if not named or not value.startswith("-") or value == "--":
                continue
            if value.split("=")[0] in self._option_string_actions:
                return ""       # a real option: the value was left out
            return (f" ({value!r} begins with '-', so it reads as an option: give it as "
                    f"{names[0]}={value})")
        return ""


# The library's messages name an option in Python, then on the command line:
# "overwrite=True (--overwrite)", "on_corrupt='skip' (--on-corrupt skip)",
# "samples_per_record (--samples-per-record)". A Python spelling has '_' or '='.
_BOTH = re.compile(r"\b(?P<py>[a-z][a-z0-9]*(?:_[a-z0-9]+)*(?:=(?:'[^']*'|[\w.]+))?) "
                   r"\((?P<cli>--[a-z][a-z0-9-]*(?: [\w.:,'-]+)?)\)")


def cli_spelling(text: str) -> str:
    """``text`` with each option the library names as ``python (--cli)`` named the
    command line's way first: ``--cli (python in Python)``.

    Example:
        >>> cli_spelling("Choose another directory, or pass overwrite=True (--overwrite).")
        'Choose another directory, or pass --overwrite (overwrite=True in Python).'
        >>> cli_spelling("or pack with on_corrupt='skip' (--on-corrupt skip) to leave it")
        "or pack with --on-corrupt skip (on_corrupt='skip' in Python) to leave it"
        >>> cli_spelling("mixed precision (--dtype-policy mixed_float16)")   # no Python name
        'mixed precision (--dtype-policy mixed_float16)'
    """
    def one(m: re.Match) -> str:
        py = m["py"]
        if "_" not in py and "=" not in py:
            return m[0]
        return f"{m['cli']} ({py} in Python)"
    return _BOTH.sub(one, text)


class CliSpelling(logging.Formatter):
    """A logging formatter that words the library's lines (warnings, notes) the command
    line's way (:func:`cli_spelling`), for the handler ``memfit`` logs with. A formatter,
    not a filter: the record itself is left as the library wrote it, for other handlers."""

    def format(self, record: logging.LogRecord) -> str:
        return cli_spelling(super().format(record))


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


def _parsed(value: str, parse: Callable[[str], Any], ok: Callable[[Any], bool],
            wanted: str) -> Any:
    """``parse(value)`` when it parses and is ``ok``, else argparse's usage error."""
    try:
        parsed = parse(value)
    except ValueError:
        parsed = None
    if parsed is None or not ok(parsed):
        raise argparse.ArgumentTypeError(f"must be {wanted}. Received: {value!r}")
    return parsed


def count(value: str) -> int:
    """An argparse type: an integer >= 1 (``--steps``, ``--epochs``, ``--workers``...).

    Args:
        value: the option's text.
    """
    return _parsed(value, int, lambda n: n >= 1, "an integer >= 1, such as 3")


def seconds(value: str) -> float:
    """An argparse type: a positive, finite number of seconds (``--interval``...).

    Args:
        value: the option's text.
    """
    return _parsed(value, float, lambda s: math.isfinite(s) and s > 0,
                   "a positive number of seconds, such as 0.5")


def size(value: str) -> int:
    """An argparse type: a size in bytes, such as ``512MiB``, ``2GB`` or ``4096``
    (:func:`memfit.sizes.parse_size`).

    Args:
        value: the option's text.
    """
    return _parsed(value, parse_size, lambda n: True,
                   "a size such as 512MiB, 2GB or a number of bytes")


def silence_stdout() -> None:
    """Points stdout at /dev/null: its reader has gone (``memfit inspect DIR | head -1``),
    and the flush at exit must not complain again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_output(text: str) -> bool:
    """Prints ``text`` on stdout; ``False`` when its reader has gone (stdout is then
    silenced, see :func:`silence_stdout`): the caller returns :data:`CLOSED_PIPE`.

    Args:
        text: what to print (a newline is added).
    """
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        silence_stdout()
        return False


def add_report_argument(p: argparse.ArgumentParser) -> None:
    """``--report``: the run's report written at the end (``watch``, ``run``, ``share``)."""
    p.add_argument("--report", action="store_true",
                   help="write WORKDIR/report.html and timeline.png at the end")


def write_report_if_asked(args: argparse.Namespace) -> None:
    """Writes ``args.workdir``'s report when ``--report`` was given, and says where."""
    if args.report:
        from memfit.report import write_report

        report = write_report(args.workdir)
        print(f"report: {report.html}", file=sys.stderr)
