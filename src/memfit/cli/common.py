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
from collections.abc import Callable, Collection, Sequence
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
        ns, extras = super().parse_known_args(args, namespace)
        if self._subparsers is None:        # a command's: the options the user gave
            ns.cli_given = [a.dest for a in self._actions if a.option_strings
                            and getattr(ns, a.dest, a.default) != a.default]
        return ns, extras

    def option_names(self) -> dict[str, str]:
        """This command's options by their Python name: ``{"batch_size": "--batch-size"}``
        (the long spelling), for :func:`cli_spelling`."""
        return {a.dest: max(a.option_strings, key=len) for a in self._actions
                if a.option_strings and a.dest not in ("help", "version")}

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
# "samples_per_record (--samples-per-record)", "images='photos/', image_size=(128, 128)
# (--images photos/ --image-size 128,128)". A Python spelling has '_' or '='.
_VALUE = r"(?:'[^']*'|\"[^\"]*\"|\([^()]*\)|\[[^\[\]]*\]|\{[^{}]*\}|[\w.+-]+(?![\w/\\]))"
_ASSIGN = rf"[a-z][a-z0-9]*(?:_[a-z0-9]+)*(?:={_VALUE})?"
_BOTH = re.compile(rf"\b(?P<py>{_ASSIGN}(?:, {_ASSIGN})*) "
                   r"\((?P<cli>--[a-z][a-z0-9-]*(?: [\w.:,'/-]+)*)\)")
# What cli_spelling leaves alone: the Python spelling it has already put in parentheses.
_IN_PYTHON = re.compile(r"(\((?:[^()]|\([^()]*\))* in Python\))")
# Sentence openings that name the option as the subject: "seed must be", "label applies".
_SUBJECT_VERBS = r"(?:must|applies|apply|needs|names|is|has|and|or|go|goes|cannot|takes)"


def _cli_value(name: str, value: str, options: dict[str, str]) -> str:
    """``name=value`` as it is typed: ``--opt value``; ``--opt`` for True; ``no --opt``
    for None or False (the option was not given)."""
    opt = options[name]
    if value == "True":
        return opt
    if value in ("None", "False"):
        return f"no {opt}"
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        inner = value[1:-1]
        if inner and not re.search(r"[\s'\"$*?;&|<>()]", inner):
            value = inner               # shell-plain: --split train=2, --label target
    return f"{opt} {value}"


def _in_call(text: str, at: int) -> bool:
    """Whether ``text[at]`` lies inside a call the message quotes, Python for Python
    users: ``memfit.dataset("d", 128, split="train")``."""
    depth = 0
    for i in range(at - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            if depth == 0:
                return i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_.")
            depth -= 1
    return False


def _spell_options(text: str, options: dict[str, str], names: Collection[str]) -> str:
    """``text`` with the Python ``names`` of the command's ``options`` spelled as typed:
    after ``Received:`` (what the user gave) ``name=value``; before it, only a quoted,
    True, False or None value (advice such as ``format='tfrecord'``, not a user's feature
    ``seed=7``); identifiers with '_' that stand alone; a plain word as a subject."""
    alt = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    edge = r"(?<![\w.'\"/\\-])"             # not inside a word, a quote, a path, an --option
    head, said, tail = text.rpartition("Received: ")
    if not said:
        head, tail = text, ""
    spelled = [re.sub(rf"{edge}(?P<name>{alt})=(?P<value>{value})",
                      lambda m: m[0] if _in_call(m.string, m.start()) else
                      _cli_value(m["name"], m["value"], options), part)
               for part, value in ((head, r"(?:'[^']*'|\"[^\"]*\"|(?:True|False|None)\b)"),
                                   (tail, _VALUE))]
    text = spelled[0] + said + spelled[1]
    # identifiers (a '_' in them) wherever they stand alone: "shard_size must be positive"
    bare = "|".join(re.escape(n) for n in names if "_" in n)
    if bare:
        text = re.sub(rf"{edge}({bare})(?![\w(=/\\])",
                      lambda m: m[0] if _in_call(m.string, m.start()) else options[m[1]], text)
    # plain words only as the subject of a sentence: "seed must be", "label applies"
    words = "|".join(re.escape(n) for n in names if "_" not in n)
    if not words:
        return text
    return re.sub(rf"(^|: |\. )({words})(?= {_SUBJECT_VERBS}\b)",
                  lambda m: m[1] + options[m[2]], text)


def cli_spelling(text: str, options: dict[str, str] | None = None,
                 given: Collection[str] | None = None) -> str:
    """``text`` with each option the library names as ``python (--cli)`` named the
    command line's way first: ``--cli (python in Python)``; and, given the command's
    ``options`` (Python name → option, :meth:`Parser.option_names`) and which of them
    the user ``given`` (default: all), the Python names of those spelled as typed.

    Example:
        >>> cli_spelling("Choose another directory, or pass overwrite=True (--overwrite).")
        'Choose another directory, or pass --overwrite (overwrite=True in Python).'
        >>> cli_spelling("or pack with on_corrupt='skip' (--on-corrupt skip) to leave it")
        "or pack with --on-corrupt skip (on_corrupt='skip' in Python) to leave it"
        >>> cli_spelling("mixed precision (--dtype-policy mixed_float16)")   # no Python name
        'mixed precision (--dtype-policy mixed_float16)'
        >>> opts = {"shard_size": "--shard-size", "seed": "--seed", "images": "--images"}
        >>> cli_spelling("shard_size must be positive. Received: shard_size='0'", opts)
        '--shard-size must be positive. Received: --shard-size 0'
        >>> cli_spelling("seed must be an integer >= 0. Received: seed=-1, images=None", opts)
        '--seed must be an integer >= 0. Received: --seed -1, no --images'
        >>> cli_spelling("unknown key 'seed'. Received: seed=3", opts, given=["images"])
        "unknown key 'seed'. Received: seed=3"
        >>> cli_spelling("No file 'data/shard_size/x.npy'. Received: shard_size=3", opts)
        "No file 'data/shard_size/x.npy'. Received: --shard-size 3"
        >>> cli_spelling("Features differ in length: x=10, seed=7", opts)   # a feature
        'Features differ in length: x=10, seed=7'
        >>> cli_spelling("It takes format='tfrecord'", {"format": "--format"})
        'It takes --format tfrecord'
        >>> cli_spelling("start must be an integer >= 1 (or None), such as 3. Received: "
        ...              "start=0", {"start": "--start"})
        '--start must be an integer >= 1, such as 3. Received: --start 0'
    """
    def one(m: re.Match) -> str:
        py = m["py"]
        if "_" not in py and "=" not in py:
            return m[0]
        return f"{m['cli']} ({py} in Python)"
    text = _BOTH.sub(one, text)
    if not options:
        return text
    parts = _IN_PYTHON.split(text)
    # the options the user gave; one said to be None is the command's, not a TOML key
    none = re.findall(rf"(?<![\w.'\"/\\-])({'|'.join(map(re.escape, options))})=None\b", text)
    names = [n for n in options if given is None or n in given or n in none]
    if not names:
        return text
    out = "".join(part if i % 2 else _spell_options(part, options, names)
                  for i, part in enumerate(parts))
    # "(or None)" is Python's way to leave a value out; on the command line the option is
    # left out (a stranger read "--start must be an integer >= 1 (or None)")
    return out.replace(" (or None)", "") if out != text else out


class CliSpelling(logging.Formatter):
    """A logging formatter that words the library's lines (warnings, notes) the command
    line's way (:func:`cli_spelling`), for the handler ``memfit`` logs with. A formatter,
    not a filter: the record itself is left as the library wrote it, for other handlers.

    Args:
        fmt: the format, as :class:`logging.Formatter` takes it.
        options, given: the command's options and those the user gave, as
            :func:`cli_spelling` takes them.
    """

    def __init__(self, fmt: str | None = None, options: dict[str, str] | None = None,
                 given: Collection[str] | None = None):
        super().__init__(fmt)
        self.options, self.given = options, given

    def format(self, record: logging.LogRecord) -> str:
        return cli_spelling(super().format(record), self.options, self.given)


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
