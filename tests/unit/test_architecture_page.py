"""docs/architecture.md's layout block is drawn from the tree: it lists every module of the package, each on one
line with its job, and names no module that is gone. The page drifted once (six modules it never named); a
module added, moved or removed without its line fails here, naming it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pytest_b70lab"
PAGE = REPO / "docs" / "architecture.md"
ENTRY = re.compile(r"^(?P<indent>(?:  )*)(?P<name>[\w.]+(?:/|\.py))(?P<job>\s+\S.*)?$")


def listed_modules(page: str) -> list[str]:
    """The files the layout block names, as paths inside the package (a folder's line ends with '/', and the
    lines under it, two spaces deeper, are its files)."""
    block = re.search(r"```(?:text)?\npytest_b70lab/\n(.*?)```", page, re.S)
    assert block, f"{PAGE.relative_to(REPO)}: no layout block (a code block that starts with 'pytest_b70lab/')"
    folders: list[str] = []
    found = []
    for number, line in enumerate(block.group(1).splitlines(), 1):
        entry = ENTRY.match(line)
        assert entry and entry["indent"], f"layout block line {number} is not a module or folder line: {line!r}"
        depth = len(entry["indent"]) // 2 - 1
        del folders[depth:]
        if entry["name"].endswith("/"):
            folders.append(entry["name"])
        else:
            assert entry["job"], f"layout block line {number}: {entry['name']} has no job after its name"
            found.append("".join(folders) + entry["name"])
    return found


def package_modules(root: Path = PACKAGE) -> set[str]:
    """Every module of the package, but a package's __init__.py that holds only its docstring (its folder's line
    says what the folder is for)."""
    found = set()
    for path in root.rglob("*.py"):
        body = ast.parse(path.read_text()).body
        only_docstring = all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)
        if path.name != "__init__.py" or not only_docstring:
            found.add(str(path.relative_to(root)))
    return found


def problems(page: str, modules: set[str]) -> list[str]:
    listed = listed_modules(page)
    twice = sorted({m for m in listed if listed.count(m) > 1})
    return (
        [f"{m}: not in docs/architecture.md's layout block" for m in sorted(modules - set(listed))]
        + [f"{m}: named by docs/architecture.md but not in the package" for m in sorted(set(listed) - modules)]
        + [f"{m}: listed twice" for m in twice]
    )


def test_the_layout_block_lists_every_module_and_no_other() -> None:
    assert problems(PAGE.read_text(), package_modules()) == []


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda page: page.replace("    schema.py", "    schemata.py"), "contract/schema.py: not in"),
        (lambda page: page.replace("    schema.py", "    schemata.py"), "contract/schemata.py: named by"),
        (lambda page: re.sub(r"\n  errors\.py[^\n]*", "", page), "errors.py: not in"),
    ],
)
def test_an_edited_page_is_named(edit, named: str) -> None:
    found = problems(edit(PAGE.read_text()), package_modules())
    assert any(p.startswith(named) for p in found), found
