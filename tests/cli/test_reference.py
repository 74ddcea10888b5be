"""docs/cli.md is the parser's --help: this fails when a subcommand or an option changes
and the page was not regenerated (the message says how)."""

from pathlib import Path

from memfit.cli import SUBCOMMANDS
from memfit.cli.reference import REGENERATE, check, main, render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_in_step_with_the_parser():
    problem = check(PAGE)
    assert problem is None, problem


def test_every_subcommand_has_a_section_with_its_help():
    text = render()
    for module in SUBCOMMANDS:
        assert f"## memfit {module.NAME}\n" in text, module.NAME
        assert f"usage: memfit {module.NAME}" in text, module.NAME


def test_check_says_how_to_regenerate(tmp_path, capsys):
    stale = tmp_path / "cli.md"
    stale.write_text(render().replace("## memfit doctor", "## memfit doctr"))
    assert main(["--check", str(stale)]) == 1
    err = capsys.readouterr().err
    assert REGENERATE in err and "-## memfit doctr" in err
    assert main(["-o", str(stale)]) == 0 and main(["--check", str(stale)]) == 0
    assert "does not exist" in check(tmp_path / "missing.md")
