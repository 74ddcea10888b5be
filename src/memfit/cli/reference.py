"""The CLI reference, ``docs/cli.md``, generated from every subcommand's ``--help``.

The page is the parser's own help text, so it cannot say anything the command does not;
``tests/cli/test_reference.py`` fails when the page and the parser differ. Help is
rendered at a fixed width (``WIDTH`` columns), whatever the terminal.

    python -m memfit.cli.reference > docs/cli.md          # regenerate
    python -m memfit.cli.reference -o docs/cli.md         # the same, written atomically
    python -m memfit.cli.reference --check docs/cli.md    # exit 1 when out of step

Example:
    >>> text = render()
    >>> text.startswith("# memfit command line reference")
    True
    >>> "## memfit doctor" in text
    True
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["render", "check", "main", "WIDTH", "REGENERATE"]

WIDTH = 100
REGENERATE = ".venv/bin/python -m memfit.cli.reference -o docs/cli.md"


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse wraps help to ``$COLUMNS``: fix it while rendering."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def render() -> str:
    """The reference page: a table of the subcommands, then each one's ``--help``."""
    from memfit.cli import SUBCOMMANDS, build_parser

    with _columns(WIDTH):
        parser = build_parser()
        top = parser.format_help()
        subs = {name: p.format_help() for name, p in _subparsers(parser).items()}
    helps = {m.NAME: m.HELP for m in SUBCOMMANDS}
    lines = ["# memfit command line reference", "",
             f"<!-- Generated from each subcommand's --help by `{REGENERATE}`. Do not edit: "
             "tests/cli/test_reference.py fails when this page and the parser differ. -->",
             "", "| command | what it does |", "| --- | --- |"]
    lines += [f"| [`memfit {name}`](#memfit-{name}) | {helps.get(name, '')} |" for name in subs]
    lines += ["", "## memfit", "", "```text", top.rstrip(), "```"]
    for name, text in subs.items():
        lines += ["", f"## memfit {name}", "", helps.get(name, ""), "", "```text",
                  text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def check(path: str | os.PathLike) -> str | None:
    """``None`` when ``path`` holds the current reference, else what differs and how to
    regenerate it."""
    path = Path(path)
    expected = render()
    try:
        actual = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{str(path)!r} does not exist. Generate it with: {REGENERATE}"
    if actual == expected:
        return None
    diff = "".join(list(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True),
                                             str(path), "the parser's --help"))[:60])
    return (f"{str(path)!r} is out of step with the command line's --help. Regenerate it "
            f"with: {REGENERATE}\n{diff}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memfit.cli.reference [-o PATH | --check PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m memfit.cli.reference",
                                     description="Write the CLI reference (docs/cli.md).")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-o", "--output", metavar="PATH", help="write it to PATH (default: "
                                                              "stdout)")
    group.add_argument("--check", metavar="PATH",
                       help="exit 1 (saying what differs) when PATH is not the current page")
    args = parser.parse_args(argv)
    if args.check:
        problem = check(args.check)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    text = render()
    if args.output:
        from memfit.atomic import write_text_atomic

        write_text_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
