"""Restarts that skip the import: a warm parent that forks each training process.

A restart under ``memfit run`` used to pay a new interpreter and ``import tensorflow``
(3-6 s on a 2-core machine) before it could load a checkpoint. With a warm start,
``memfit run`` first starts a small *warm parent*: the command's own Python, which
imports the frameworks the script imports (``keras``, ``tensorflow``, ``jax``; no op
run, no model built), then waits. Each training process is a ``fork`` of it that runs
the script as ``python train.py`` would, so a restart pays only the model build, the
checkpoint load and the first step's trace.

The warm parent itself, and when its fork is safe, is :mod:`memfit.memory.warm`.
:func:`plan` starts warm only where the script cannot change what the parent imported:

- the command is ``python [-u] script.py args...`` (a script, not ``-m`` or ``-c``);
- the script imports ``keras``, ``tensorflow`` or ``jax`` (else nothing is worth
  keeping warm).

A script may still set a variable the frameworks read when imported (``KERAS_BACKEND``,
``TF_*``...) before it imports them: the forked process then stops with
``memfit.exitcodes.START_COLD`` (76), the supervisor starts it again as a new
interpreter, and every later one so. Where any condition fails the plain restart stays,
and ``memfit run`` says which one ran and why.

Example:
    >>> plan(["python", "-c", "pass"])
    'the command is not `python script.py ...` (a warm start runs a script file)'
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Plan", "plan", "FRAMEWORKS"]

FRAMEWORKS = ("keras", "tensorflow", "jax")     # what a warm parent imports, if the script does
_FLAGS = ("-u", "-B")                           # interpreter options a warm start keeps


@dataclasses.dataclass(frozen=True)
class Plan:
    """How to start a command warm.

    Attributes:
        python: the interpreter (the command's first word).
        flags: its options that the warm parent takes too (``-u``, ``-B``).
        script: the script's absolute path.
        argv: ``sys.argv`` for the script (its path as given, then its arguments).
        modules: what the warm parent imports, in order.
    """

    python: str
    flags: tuple[str, ...]
    script: str
    argv: tuple[str, ...]
    modules: tuple[str, ...]


def plan(command: Sequence[str]) -> Plan | str:
    """How ``command`` can start warm, or why it cannot (one line).

    Args:
        command: the checked command (``["python", "train.py", "--epochs", "3"]``).

    Example:
        >>> plan(["bash", "train.sh"])
        'bash is not a Python interpreter'
    """
    program = shutil.which(command[0]) or command[0]
    name = os.path.basename(program)
    if not (name.startswith("python") or _same_file(program, sys.executable)):
        return f"{command[0]} is not a Python interpreter"
    rest = list(command[1:])
    flags: list[str] = []
    while rest and rest[0] in _FLAGS:
        flags.append(rest.pop(0))
    if not rest or rest[0].startswith("-") or not os.path.isfile(rest[0]):
        return "the command is not `python script.py ...` (a warm start runs a script file)"
    script = rest[0]
    try:
        tree = ast.parse(Path(script).read_bytes(), filename=script)
    except (OSError, SyntaxError, ValueError) as e:
        return f"{script} could not be read ahead ({type(e).__name__})"
    # What the script imports whatever it is given; else Keras where it is imported
    # later (a function, a branch), which brings the backend the environment names.
    modules = tuple(m for m in FRAMEWORKS if m in _imported_roots(tree, top=True)) or \
        tuple(m for m in FRAMEWORKS[:1] if m in _imported_roots(tree, top=False))
    if not modules:
        return f"{script} imports none of {', '.join(FRAMEWORKS)}: nothing to keep warm"
    return Plan(python=command[0], flags=tuple(flags), script=os.path.abspath(script),
                argv=tuple(rest), modules=modules)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _imported_roots(tree: ast.Module, top: bool) -> set[str]:
    """The top packages imported anywhere (``top``: unconditionally, by the module's own
    statements or a ``try`` among them)."""
    nodes: list[ast.AST] = []
    if top:
        for statement in tree.body:
            nodes += statement.body if isinstance(statement, ast.Try) else [statement]
    else:
        nodes = list(ast.walk(tree))
    roots = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots
