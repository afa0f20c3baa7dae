"""The reference page is complete: every option, ini key and fixture the plugin defines and every B70LAB_
variable the package reads has a row in docs/reference.md; the README stays a door, and its links lead
somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_b70lab import plugin

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference.md"


def plugin_options() -> tuple[list[str], list[str]]:
    """The options and ini keys the plugin's own hook registers, read from pytest's parser."""
    parser = pytest.Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    options = [name for opt in parser.getgroup("b70lab").options for name in opt.names()]
    return options, [name for name in parser._inidict if name.startswith("b70")]


def package_variables(root: Path = REPO / "pytest_b70lab") -> set[str]:
    return {v for p in root.rglob("*.py") for v in re.findall(r"\bB70LAB_[A-Z0-9_]+\b", p.read_text())}


def rows(text: str) -> set[str]:
    """The names in the first column of every table row, between backticks."""
    return {
        n for line in text.splitlines() if line.startswith("| `") for n in re.findall(r"`([^`]+)`", line.split("|")[1])
    }


def missing(text: str) -> list[str]:
    options, ini = plugin_options()
    wanted = [*options, *ini, *plugin.__all__, *sorted(package_variables())]
    listed = rows(text)
    return [name for name in wanted if name not in listed]


def test_every_option_key_fixture_and_variable_has_a_row() -> None:
    assert missing(REFERENCE.read_text()) == []


def test_a_new_option_without_a_row_fails(tmp_path: Path) -> None:
    """The check has teeth: the page without the --b70-prompts row, and a package with a new variable."""
    text = "\n".join(line for line in REFERENCE.read_text().splitlines() if not line.startswith("| `--b70-prompts`"))
    assert missing(text) == ["--b70-prompts"]
    (tmp_path / "new.py").write_text('ENV = "B70LAB_SOMETHING_NEW"\n')
    assert package_variables(tmp_path) == {"B70LAB_SOMETHING_NEW"}


def test_the_readme_is_a_door_whose_links_lead_somewhere() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#]+)", readme)
    for page in (REPO / "docs").glob("*.md"):
        targets += [str((page.parent / t).relative_to(REPO)) for t in re.findall(r"\]\(([^)#:]+)", page.read_text())]
    broken = sorted({t for t in targets if not t.startswith("http") and not (REPO / t).resolve().exists()})
    assert broken == []


def test_the_command_line_says_its_version_and_shows_examples_that_parse(capsys: pytest.CaptureFixture) -> None:
    import importlib.metadata as md
    import shlex

    from pytest_b70lab import cli

    with pytest.raises(SystemExit) as done:
        cli.build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"b70lab {md.version('pytest-b70lab')}\n"
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(cli.EXAMPLES) == {"b70lab", *commands}, "every command has examples, and no example is orphaned"
    for name, command in [("b70lab", parser), *commands.items()]:
        assert "examples:\n  b70lab " in command.format_help(), name
    for line in (example for examples in cli.EXAMPLES.values() for example in examples):
        args, rest = parser.parse_known_args(shlex.split(line)[1:])  # an example that no longer parses exits here
        assert rest == [] and args.func is not None, line
