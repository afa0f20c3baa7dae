"""The package's walls, read from its imports (an AST walk of every module, lazy imports included): what runs
inside vLLM's processes imports nothing of the harness, the data modules never reach pytest, an engine or
judgement, judgement never starts an engine, nothing imports a pytest or command-line surface, and there is
no import cycle. Each rule is checked on the tree as it is, and shown to fail on a planted import.

Written here rather than with import-linter: its contracts are per layer of one package, and these rules
also name third-party libraries (only syrupy through snapshots.py; in the engine, only vLLM, torch, psutil).
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_b70lab"
# Modules vLLM loads into its own processes: the in_engine folder, and the two thin modules at the paths the
# engine command records (the launch command's module, the worker extension).
IN_ENGINE = {"in_engine", "vllm_entry", "worker_ext"}
# What they may import besides the standard library and each other. psutil: a rank's audit reports its own
# process creation time, gate 7's evidence that a start is fresh.
IN_ENGINE_LIBRARIES = {"vllm", "torch", "psutil"}
DATA = {
    "contract",
    "promotion",
    "evidence",
    "digests",
    "metrics",
    "checkpoint",
    "throughput",
    "project",
    "defaults",
    "errors",
    "host",
    "run_folder",
    "variants",
    "sweep.plan",
}
# compare: a comparison of two runs' evidence is judgement, printed by two surfaces (`b70lab evidence diff`,
# the plugin's --b70-baseline), so it lives here and not with them.
JUDGEMENT = {
    "gates",
    "catalogue",
    "judge",
    "teacher",
    "snapshots",
    "verdict",
    "replay",
    "compare",
    "quality.judge",
    "quality.scoring",
    "quality.checks",
    "quality.baseline",
    "quality.samples",
    "sweep.table",
}
# sweep.runner launches the sweep's starts and the replays that judge them.
ENGINE = {"engine", "capability", "sweep.runner"}
# What the engine's teardown, the probe and the sandbox share: the sandbox's side of it runs where only the
# standard library may be relied on.
STDLIB_ONLY = {"processes"}
SURFACES = {"plugin", "cli", "bench", "report"}


def module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module `name` imports: the package's own by their names inside it ("" is the package itself),
    anything else as "ext:" and its top-level name. The importer's own parent packages are left out: they
    are imported before it whatever it does, so they make no cycle."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    parents = {".".join(name.split(".")[:i]) for i in range(len(name.split(".")))}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join(["pytest_b70lab", *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            imported = [(module, [a.name for a in node.names])]
        else:
            continue
        for module, names in imported:
            if module != "pytest_b70lab" and not module.startswith("pytest_b70lab."):
                found.add("ext:" + module.split(".")[0])
                continue
            inner = module.removeprefix("pytest_b70lab").lstrip(".")
            for t in [inner, *(f"{inner}.{n}".lstrip(".") for n in names)]:
                if t in known and t != name and t not in parents:
                    found.add(t)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    names = module_names(root)
    return {n: imports_of(n, p, set(names)) for n, p in names.items()}


def _in(module: str, group: set[str]) -> bool:
    return any(module == g or module.startswith(g + ".") for g in group)


def breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses a wall, as 'importer -> imported: the rule'."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    out = []
    for module, targets in sorted(graph.items()):
        for t in sorted(targets):
            ext = t.removeprefix("ext:") if t.startswith("ext:") else None
            rule = None
            if _in(module, IN_ENGINE):
                if ext is not None and ext not in stdlib and ext not in IN_ENGINE_LIBRARIES:
                    rule = "in-engine modules import only the standard library, vLLM, torch and psutil"
                elif ext is None and not _in(t, IN_ENGINE) and t not in ("", "errors"):
                    rule = "in-engine modules import no other module of the harness"
            elif module in STDLIB_ONLY:
                if ext is not None and ext not in stdlib:
                    rule = "processes imports only the standard library"
                elif ext is None and t != "":
                    rule = "processes imports no other module of the harness"
            elif _in(module, {"mini"}):
                allowed = DATA | {"mini", "quality.sandbox", "processes"}
                if ext is None and t not in ("", "quality") and not _in(t, allowed):
                    rule = "mini imports only data and the sandbox it runs generated code in"
            elif _in(module, DATA):
                if ext in ("pytest", "syrupy") or (
                    ext is None and _in(t, ENGINE | JUDGEMENT | SURFACES | {"mini", "quality"})
                ):
                    rule = "data modules import no pytest, syrupy, engine, judgement, mini or surface"
            elif _in(module, JUDGEMENT):
                if ext == "pytest" or (ext is None and _in(t, ENGINE | SURFACES | {"mini"})):
                    rule = "judgement imports no pytest, engine, mini or surface"
            if rule is None and ext == "syrupy" and module != "snapshots":
                rule = "syrupy is imported through snapshots.py alone"
            if (
                rule is None
                and ext is None
                and _in(t, SURFACES)
                and t.split(".")[0] != module.split(".")[0]
                and module != "cli"
                and not (module.startswith("plugin") and t.split(".")[0] == "report")
            ):  # the command line dispatches to the bench; a session renders its page (--b70-report)
                rule = "nothing imports a surface"
            if rule:
                out.append(f"{module} -> {t.removeprefix('ext:')}: {rule}")
    return out


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w.startswith("ext:") or w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_keeps_its_walls() -> None:
    graph = import_graph(PACKAGE)
    assert {m for m in IN_ENGINE | DATA | JUDGEMENT | ENGINE | STDLIB_ONLY if m not in graph} == set(), (
        "a module the walls name is gone: move the name with it"
    )
    assert breaches(graph) == []
    assert cycles(graph) == []


def test_the_in_engine_package_imports_nothing() -> None:
    """digests imports in_engine.observe for its moments: a replay must not load vLLM or torch through the
    package's __init__."""
    assert import_graph(PACKAGE)["in_engine"] == set()


@pytest.mark.parametrize(
    "module, planted, rule",
    [
        ("in_engine.observe", "from .. import gates", "in-engine modules import no other module of the harness"),
        (
            "in_engine.worker_ext",
            "import numpy",
            "in-engine modules import only the standard library, vLLM, torch and psutil",
        ),
        ("processes", "import psutil", "processes imports only the standard library"),
        ("mini.evaluate", "from .. import gates", "mini imports only data and the sandbox it runs generated code in"),
        ("evidence", "import pytest", "data modules import no pytest, syrupy, engine, judgement, mini or surface"),
        (
            "throughput",
            "from .engine import server",
            "data modules import no pytest, syrupy, engine, judgement, mini or surface",
        ),
        ("gates", "from .engine.starts import run_starts", "judgement imports no pytest, engine, mini or surface"),
        ("verdict", "import syrupy", "syrupy is imported through snapshots.py alone"),
        ("engine.starts", "from ..plugin import state", "nothing imports a surface"),
    ],
)
def test_a_planted_forbidden_import_is_named(tmp_path: Path, module: str, planted: str, rule: str) -> None:
    tree = tmp_path / "pytest_b70lab"
    shutil.copytree(PACKAGE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / f"{module.replace('.', '/')}.py"
    path.write_text(path.read_text() + f"\n\ndef planted():\n    {planted}\n")
    found = breaches(import_graph(tree))
    assert [b for b in found if b.startswith(f"{module} -> ")] and all(rule in b for b in found), found


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    tree = tmp_path / "pytest_b70lab"
    shutil.copytree(PACKAGE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "digests.py").write_text((tree / "digests.py").read_text() + "\nfrom . import checkpoint\n")
    assert {"digests", "checkpoint"} in cycles(import_graph(tree))


# Counted in statements (the lines on which one begins), not physical lines: ruff format puts each argument
# of a long call on its own line, which makes a function taller without giving it another job. Sixty dense
# lines held about fifty statements.
LONGEST_FUNCTION = 50


def statement_lines(node: ast.AST) -> int:
    return len({n.lineno for n in ast.walk(node) if isinstance(n, ast.stmt)})


def test_no_function_holds_more_than_fifty_statements() -> None:
    """A function a newcomer cannot read on one screen hides several jobs; split it where the jobs part."""
    longer = []
    for name, path in sorted(module_names(PACKAGE).items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (count := statement_lines(node)) > LONGEST_FUNCTION:
                    longer.append(f"{name}.{node.name}: {count} statements")
    assert longer == []


def test_a_planted_long_function_is_named() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION + 1))
    tree = ast.parse(f"def planted():\n{body}\n")
    assert statement_lines(tree.body[0]) == LONGEST_FUNCTION + 2  # the def line is a statement too


def test_mypy_is_strict_exactly_where_the_walls_say_data_and_judgement() -> None:
    """pyproject.toml's strict override lists the modules a verdict is computed from: the walls' data and
    judgement modules. A module that moves between walls moves in both places, or this fails."""
    import tomllib

    overrides = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs")]
    assert len(strict) == 1, "one strict override in pyproject.toml's [tool.mypy]"
    assert {m.removeprefix("pytest_b70lab.") for m in strict[0]["module"]} == DATA | JUDGEMENT
