"""The reference page is complete: every option, ini key, marker, hook and fixture the plugin defines, every
B70LAB_ variable the package reads, every `b70lab` command and every runtime fix of the registry has a row in
docs/reference.md; the README stays a door, and its links lead somewhere; the pages speak of the tool, not of
its history."""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path

import pytest

from pytest_b70lab import cli, plugin
from pytest_b70lab.in_engine import dflash_fix
from pytest_b70lab.in_engine.fixes import FIX_NAMES
from pytest_b70lab.plugin import hookspecs

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


def commands(parser: argparse.ArgumentParser | None = None, prefix: str = "b70lab") -> list[str]:
    """Every command and subcommand of `b70lab`, as typed (`b70lab records verify`), read from argparse."""
    found: list[str] = []
    for action in (parser or cli.build_parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = commands(sub, f"{prefix} {name}")
                found += nested or [f"{prefix} {name}"]
                if nested and sub.get_default("func") is not None:
                    found.append(f"{prefix} {name}")  # a group that also runs by itself (`b70lab records`)
    return found


def hooks() -> list[str]:
    """The hookspecs, as the reference writes them: `pytest_b70lab_gates(config)`."""
    import inspect

    return [
        f"{name}({', '.join(inspect.signature(fn).parameters)})"
        for name, fn in vars(hookspecs).items()
        if name.startswith("pytest_b70lab_") and callable(fn)
    ]


def missing(text: str) -> list[str]:
    options, ini = plugin_options()
    wanted = [
        *options,
        *ini,
        *plugin.MARKERS,
        *hooks(),
        *plugin.__all__,
        *sorted(package_variables()),
        *commands(),
        *FIX_NAMES,
        dflash_fix.FIX_NAME,
    ]
    listed = rows(text)
    return [name for name in wanted if name not in listed]


def test_every_option_key_fixture_and_variable_has_a_row() -> None:
    assert missing(REFERENCE.read_text()) == []


def test_a_new_option_without_a_row_fails(tmp_path: Path) -> None:
    """The check has teeth: the page without one row of each kind, and a package with a new variable."""
    gone = ("`--b70-prompts`", "`bench`", "`pytest_b70lab_verdict(", "`b70lab records verify`", "`shm_reader_spin`")
    text = "\n".join(
        line for line in REFERENCE.read_text().splitlines() if not line.startswith(tuple(f"| {g}" for g in gone))
    )
    assert missing(text) == [
        "--b70-prompts",
        "bench",
        "pytest_b70lab_verdict(config, decision, quality, run_dir)",
        "b70lab records verify",
        "shm_reader_spin",
    ]
    (tmp_path / "new.py").write_text('ENV = "B70LAB_SOMETHING_NEW"\n')
    assert package_variables(tmp_path) == {"B70LAB_SOMETHING_NEW"}


def test_the_readme_is_a_door_whose_links_lead_somewhere() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 60
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


# What a manual page never says (issue 49): a date, "here" or "this machine" (history and one machine's view belong
# in CHANGELOG.md and notes/), or a link into notes/; only docs/performance.md keeps measured figures and their notes.
NOTEBOOK = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\bhere\b|\bthis machine\b|\]\([^)]*notes/", re.I)


def notebook_lines(folder: Path = REPO / "docs") -> list[str]:
    return [
        f"{page.name}:{number}: {line.strip()}"
        for page in sorted(folder.glob("*.md"))
        if page.name != "performance.md"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if NOTEBOOK.search(line)
    ]


def test_the_pages_speak_of_the_tool_not_of_its_history(tmp_path: Path) -> None:
    assert notebook_lines() == []
    (tmp_path / "page.md").write_text("# Page\n\nSince 2026-12-04 it runs here ([why](../notes/x.md)).\n")
    (tmp_path / "performance.md").write_text("# Figures\n\n1.02 on 2026-12-04 ([note](../notes/x.md)).\n")
    assert notebook_lines(tmp_path) == ["page.md:3: Since 2026-12-04 it runs here ([why](../notes/x.md))."]


def test_the_example_contract_is_the_embedded_default_field_for_field(tmp_path: Path) -> None:
    """docs/contracts.md's complete example loads with the project's own loader to the embedded default's digest."""
    from markdown_it import MarkdownIt

    from pytest_b70lab.contract import project
    from pytest_b70lab.contract.defaults import DEFAULT_CONTRACT
    from pytest_b70lab.contract.schema import load

    page = (REPO / "docs" / "contracts.md").read_text()
    heading = page.index("## A complete example contract")
    [example] = [t.content for t in MarkdownIt().parse(page[heading:]) if t.type == "fence" and t.info == "toml"][:1]
    (tmp_path / "example.toml").write_text(example)
    project.use_root(REPO)
    assert load(str(tmp_path / "example.toml")).digest == load(DEFAULT_CONTRACT).digest


def test_the_strict_build_fails_on_a_broken_link_or_anchor(tmp_path: Path) -> None:
    """`make docs` has teeth: the manual with one broken anchor and one missing page does not build."""
    import subprocess
    import sys

    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy2(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "glossary.md").open("a") as page:
        page.write("\nSee [the verdict](verdict.md#no-such-heading) and [a page](no-such-page.md).\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 1, built.stderr[-2000:]
    assert "'verdict.md#no-such-heading'" in built.stderr and "'no-such-page.md'" in built.stderr, built.stderr
