"""The ``memfit`` command line: one small module per subcommand, each thin over the library.

A subcommand module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; adding one means adding it to ``SUBCOMMANDS``.

The commands that start TensorFlow, in their own process or in the children they start
(``QUIET_COMMANDS``: run, share, doctor, estimate, find-batch-size, calibrate), keep
TensorFlow's start-up lines off the screen (:mod:`memfit.quiet`); their ``--verbose``
shows them. ``memfit watch`` runs its command unchanged.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from memfit._version import __version__
from memfit.cli import (
    calibrate_cmd,
    doctor_cmd,
    estimate_cmd,
    find_batch_size_cmd,
    inspect_cmd,
    pack_cmd,
    report_cmd,
    run_cmd,
    share_cmd,
    verify_cmd,
    watch_cmd,
)
from memfit.cli.common import CliSpelling, Parser, cli_spelling, silence_stdout
from memfit.command_start import release_interrupts
from memfit.errors import MemfitError
from memfit.quiet import quieted
from memfit.share.jobs import JobsFileError

SUBCOMMANDS = (pack_cmd, inspect_cmd, verify_cmd, watch_cmd, run_cmd, report_cmd,
               estimate_cmd, find_batch_size_cmd, calibrate_cmd, share_cmd, doctor_cmd)
QUIET_COMMANDS = (run_cmd, share_cmd, doctor_cmd, estimate_cmd, find_batch_size_cmd,
                  calibrate_cmd)
VERBOSE_HELP = ("show TensorFlow's start-up log lines (oneDNN, CUDA drivers, cuInit...), "
                "here and in the processes memfit starts; hidden by default")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="memfit",
        description="Train Keras/TensorFlow models on data larger than RAM, near the device's "
                    "memory limit, and see where the memory went.")
    parser.add_argument("--version", action="version", version=f"memfit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        if module in QUIET_COMMANDS:
            p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
        p.set_defaults(run=module.run, hide_tensorflow_startup=module in QUIET_COMMANDS,
                       cli_options=p.option_names(), command_parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memfit`` console script."""
    release_interrupts()          # from here on a Ctrl-C is handled below
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        # a subcommand's stray option is shown with that subcommand's usage, not memfit's
        owner = getattr(args, "command_parser", None) or parser
        owner.error(f"unrecognized arguments: {' '.join(extras)}")
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    # a Python name in a message is spelled as typed, for the options the user gave
    options, given = args.cli_options, set(getattr(args, "cli_given", ()))
    before = list(logging.getLogger().handlers)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    # memfit's own INFO lines, not another library's (matplotlib's "generated new
    # fontManager" on a fresh machine, imported by Keras).
    logging.getLogger("memfit").setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:
        if handler not in before:          # the one made here, not another program's
            handler.setFormatter(CliSpelling("%(message)s", options, given))  # "--overwrite (...)"
    try:
        with quieted(args.hide_tensorflow_startup and not getattr(args, "verbose", False)):
            code = int(args.run(args) or 0)
            sys.stdout.flush()      # a closed pipe shows up here, inside the handler below
            return code
    except MemfitError as e:
        # a jobs file's problems name its keys ("restart"), not the options that share a name
        spelled = cli_spelling(str(e), None if isinstance(e, JobsFileError) else options, given)
        print(f"memfit {args.command}: error: {spelled}", file=sys.stderr)
        return e.exit_code
    except ValueError as e:
        print(f"memfit {args.command}: error: {cli_spelling(str(e), options, given)}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # what an interrupted command left, where it says so (an Interrupted from pack)
        left = f"; {cli_spelling(str(e), options, given)}" if str(e) else ""
        print(f"memfit {args.command}: interrupted{left}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`memfit inspect DIR | head -1`): stop quietly, as a
        # shell tool does, and point stdout at /dev/null so that the flush at exit does
        # not complain again.
        silence_stdout()
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
