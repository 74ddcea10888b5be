"""Every module's docstring examples run as doctests (those that need a GPU, a training
script or minutes say ``+SKIP``), each module in a fresh temporary working directory."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
# Run as programs or at a Python process's start-up: importing them does something.
NOT_IMPORTABLE = {"memfit.__main__", "memfit.estimate.child", "memfit.doctor.hook"}


def _modules() -> list[str]:
    names = []
    for path in sorted((SRC / "memfit").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name not in NOT_IMPORTABLE and ">>>" in path.read_text():
            names.append(name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
