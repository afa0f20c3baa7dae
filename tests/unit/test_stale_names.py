"""Every module or name of the package that a comment, a docstring or a page of docs/ names in backticks still
exists: the prose followed the redesign's moves once by hand and went stale (`launch.*`, `session.log_findings`
named modules that were gone), and a reader who greps for a stale name finds nothing.

What counts as naming the package, in backticks:
- a dotted name whose first part is one of its modules (`gates.speed_figures`, `observe.moments`,
  `pytest_b70lab.kernels`): the rest must be a submodule, or a name the module defines (a class's own names
  one level further); a contract's field path (`reproduction.passes`) is accepted where a section is meant;
- a file name (`judge.py`, `mini/draft_model.py`): a file of the repository must end with it;
- a module name the package once had (RETIRED): always stale, whatever follows.
Anything else in backticks (commands, vLLM's names, field values) is not the package's and is left alone.

Written here rather than with a linter: none resolves prose against a package's own AST.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import typing
from functools import cache
from pathlib import Path

import pytest
from test_walls import module_names  # tests/unit/test_walls.py

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_b70lab"
SCANNED = ("pytest_b70lab", "tests", "scripts", "docs")
# Modules the package had before the redesign moved them (git log --diff-filter=DR -- pytest_b70lab): a name
# that starts with one of them points at code that is elsewhere now.
RETIRED = {
    "launch": "engine.starts / engine.live",
    "session": "engine.starts",
    "engine_client": "engine.client",
    "kernels_intel": "kernels.intel",
    "vllm_fixes": "in_engine.fixes",
    "vllm_cpu_emulation": "in_engine.cpu_emulation",
    "vllm_dflash_fix": "in_engine.dflash_fix",
    "vllm_portable_fp8": "in_engine.portable_fp8",
    "vllm_draft_capture": "in_engine.draft_capture",
    "vllm_faults": "in_engine.faults",
    "vllm_observe": "in_engine.observe",
    "gates": "judge/: rules, catalogue and one module per family of gates",
}
TICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?$")
FILE = re.compile(r"^[\w./-]+\.py$")
# `gates.xml`, `server.log`, `recipe.json`: files a run or a build writes, named like dotted names.
DATA_SUFFIXES = {"xml", "log", "json", "jsonl", "html", "toml", "md", "txt", "csv", "yaml", "lock", "safetensors"}
# Files of other projects that the prose names by their own paths (vLLM's, torch's).
FOREIGN_FILE_ROOTS = ("vllm/", "torch/", "transformers/", "csrc/")


@cache
def modules() -> dict[str, Path]:
    """Dotted module name inside the package -> its file (the walls test's reading of the package)."""
    return module_names(PACKAGE)


@cache
def defined_names(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module, each with the names its class body defines (empty for anything else)."""
    names: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            names[node.name] = {
                getattr(n, "name", None) or getattr(getattr(n, "target", None), "id", "")
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.AnnAssign, ast.ClassDef))
            } | {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Assign):
            names |= {t.id: set() for t in node.targets if isinstance(t, ast.Name)}
            names |= {
                e.id: set() for t in node.targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)
            }
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0]: set() for a in node.names}
    return names


def _resolves_in_module(module: str, rest: list[str]) -> bool:
    if not rest:
        return True
    if (child := f"{module}.{rest[0]}".removeprefix(".")) in modules():
        return _resolves_in_module(child, rest[1:])
    names = defined_names(modules()[module])
    if rest[0] not in names:
        return False
    return len(rest) == 1 or not names[rest[0]] or rest[1] in names[rest[0]]


@cache
def record_fields() -> dict[str, set[str]]:
    """Section -> its fields, of the contract and of a start's evidence: the prose names field paths
    (`reproduction.passes`, `throughput.per_prompt`) like dotted names."""
    from pytest_b70lab.contract import schema as contract
    from pytest_b70lab.evidence import record as evidence

    sections: dict[str, set[str]] = {}
    for record in (contract.Contract, evidence.Evidence):
        for name, info in record.model_fields.items():
            for model in (info.annotation, *typing.get_args(info.annotation)):
                if inner := getattr(model, "model_fields", None):
                    sections.setdefault(name, set()).update(inner)
    return sections


def stale(name: str) -> str | None:
    """Why a backticked name is stale, or None when it exists or is not the package's."""
    if FILE.match(name):
        if name.startswith(FOREIGN_FILE_ROOTS):
            return None
        stem = Path(name).stem
        if stem in RETIRED:
            return f"{name}: module {stem} is gone (now {RETIRED[stem]})"
        files = [p for d in ("pytest_b70lab", "tests", "scripts") for p in (ROOT / d).rglob("*.py")]
        if any(str(p.relative_to(ROOT)).endswith(name) for p in files + [ROOT / "conftest.py"]):
            return None
        return f"{name}: no file of the repository ends with it"
    if not DOTTED.match(name) or name.rsplit(".", 1)[-1] in DATA_SUFFIXES:
        return None
    parts = name.removesuffix("()").split(".")
    if parts[0] in RETIRED:
        return f"{name}: module {parts[0]} is gone (now {RETIRED[parts[0]]})"
    if parts[0] == "pytest_b70lab":
        return None if _resolves_in_module("", parts[1:]) else f"{name}: not in the package"
    candidates = [m for m in modules() if m == parts[0] or m.endswith("." + parts[0])]
    if not candidates:
        return None  # not the package's name (vLLM's, a variable's, a command's)
    if any(_resolves_in_module(m, parts[1:]) for m in candidates):
        return None
    if parts[1] in record_fields().get(parts[0], set()):
        return None  # a contract's or an evidence record's field path
    return f"{name}: {' / '.join(candidates)} defines no {'.'.join(parts[1:])}"


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a Python file's comments and docstrings, or of a Markdown page's lines."""
    source = path.read_text()
    if path.suffix == ".md":
        return list(enumerate(source.splitlines(), 1))
    texts = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if (doc := ast.get_docstring(node, clean=False)) is not None:
                texts.append((node.body[0].lineno, doc))
    return texts


# Unticked too: `launch.root_cause` lost its backticks in places. Not "session": an everyday word there.
RETIRED_UNTICKED = re.compile(r"(?<![\w.`/])(" + "|".join(sorted(set(RETIRED) - {"session"})) + r")\.[A-Za-z_]\w*")


def named(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every backticked span in the prose, and of every unticked name of a retired module."""
    texts = prose(path)
    return [(line, m.group(1)) for line, text in texts for m in TICKED.finditer(text)] + [
        (line, m.group(0)) for line, text in texts for m in RETIRED_UNTICKED.finditer(text)
    ]


def scanned_files() -> list[Path]:
    files = [ROOT / "conftest.py", ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder in SCANNED:
        files += sorted((ROOT / folder).rglob("*.py")) + sorted((ROOT / folder).rglob("*.md"))
    return [f for f in files if f.is_file() and f != Path(__file__)]


def test_every_name_the_prose_gives_still_exists() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: `{name}`: {why}"
        for path in scanned_files()
        for line, name in named(path)
        if (why := stale(name))
    ]
    assert not found, "stale names in comments, docstrings and docs/ (rename them, or say where they went):\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    "name, finds",
    [
        ("launch.engine_environment", "module launch is gone"),
        ("session.log_findings", "module session is gone"),
        ("vllm_faults.py", "module vllm_faults is gone"),
        ("catalogue.no_such_rule", "defines no no_such_rule"),
        ("evidence.Evidence.no_such_field", "defines no Evidence.no_such_field"),
        ("pytest_b70lab.engine.nowhere", "not in the package"),
        ("engine/nowhere.py", "no file of the repository ends with it"),
    ],
)
def test_a_stale_name_is_found(name: str, finds: str) -> None:
    assert finds in (stale(name) or "")


def test_a_retired_module_is_found_without_backticks(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Chosen by launch.root_cause, as `catalogue.required_subjects` says."""\n# see engine_client.open\n'
    )
    assert [stale(name) is not None for _, name in named(planted)] == [False, True, True]


@pytest.mark.parametrize(
    "name",
    [
        "catalogue.required_subjects",
        "engine.live.LiveStart",
        "evidence.record.Evidence.counted",
        "pytest_b70lab.worker_ext.AuditExtension",
        "reproduction.passes",
        "throughput.per_prompt",
        "gates.xml",
        "mini/draft_model.py",
        "vllm/platforms/cpu.py",
        "torch.cpu._is_avx512_supported()",
        "pytest -m gates",
    ],
)
def test_a_live_or_foreign_name_passes(name: str) -> None:
    assert stale(name) is None
