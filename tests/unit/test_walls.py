"""The package's walls, read from its imports (an AST walk of every module, lazy imports included) and from
each module's folder: what runs inside vLLM's processes imports nothing of the harness, the data folders
never reach pytest, an engine or judgement, judgement never starts an engine, only a surface runs a
workflow, nothing imports a pytest or command-line surface, and there is no import cycle. Each rule is
checked on the tree as it is, and shown to fail on a planted import.

Written here rather than with import-linter: its contracts are per layer of one package, and these rules
also name third-party libraries (only syrupy through judge/snapshots.py; in the engine, only vLLM, torch,
psutil).
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_b70lab"

# Each folder of the package is one wall, read from the module's path: a module moved to another folder
# changes wall with it, and a new folder must be given one here before any test passes.
FOLDER_WALLS = {
    "contract": "data",  # the experimental identity
    "evidence": "data",  # what a start observed and how it is kept
    "engine": "engine",  # driving vLLM from outside
    "in_engine": "in-engine",  # runs inside vLLM's processes
    "judge": "judgement",  # pure functions of evidence
    "quality": "judgement",  # gate 8's checks, scoring and baseline
    "isolation": "isolation",  # process groups and the sandbox for generated code
    "mini": "mini",  # the generated tiny Laguna
    "kernels": "kernels",  # the page-32 component implementations
    # Workflows: each runs the stages in order for one command (a sweep: plan, starts, judging, table; a seal:
    # judge a run and write or check its record). They may import every stage; only a surface imports them.
    "records": "workflow",
    "sweep": "workflow",
    "fleet": "workflow",  # a sweep over several boxes with Ray: the only folder that imports Ray
    "plugin": "surface",
    "cli": "surface",
    "report": "surface",
    "bench": "surface",
}
# The package's root holds the ground (one error base, one home for digests) and the two thin modules at the
# paths the engine command records (the launch command's module, the worker extension), which run in vLLM.
GROUND = {"", "errors", "digests"}
ROOT_IN_ENGINE = {"vllm_entry", "worker_ext"}
# What in-engine modules may import besides the standard library and each other. psutil: a rank's audit
# reports its own process creation time, gate 7's evidence that a start is fresh.
IN_ENGINE_LIBRARIES = {"vllm", "torch", "psutil"}
# The one module of a judgement folder that the engine reads: the quality prompt set a start is asked.
SERVED_SAMPLES = "quality.samples"
# The walls a verdict is computed from: mypy types them strictly (pyproject.toml).
STRICT_WALLS = {"ground", "data", "judgement", "workflow"}


def wall_of(module: str) -> str:
    """The wall of a module, from its folder (the root's modules by name: the ground and the shims)."""
    if module in GROUND:
        return "ground"
    if module in ROOT_IN_ENGINE:
        return "in-engine"
    folder = module.split(".")[0]
    if folder not in FOLDER_WALLS:
        raise AssertionError(
            f"pytest_b70lab.{module} has no wall: put it in the folder of its stage, or give its new folder a wall "
            "in tests/unit/test_walls.py FOLDER_WALLS"
        )
    return FOLDER_WALLS[folder]


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


def _in_engine(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if ext is not None and ext not in stdlib and ext not in IN_ENGINE_LIBRARIES:
        return "in-engine modules import only the standard library, vLLM, torch and psutil"
    if target is not None and target != "in-engine" and t not in ("", "errors"):
        return "in-engine modules import no other module of the harness"
    return None


def _isolation(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if ext is not None and ext not in stdlib:
        return "isolation imports only the standard library"
    if target is not None and target != "isolation" and t != "":
        return "isolation imports no other module of the harness"
    return None


def _ground(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if ext in ("pytest", "syrupy") or (target is not None and target not in ("ground", "in-engine")):
        return "the ground imports only the ground (and in_engine's moments)"
    return None


def _mini(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if target is not None and target not in ("ground", "data", "mini", "isolation"):
        return "mini imports only data and the sandbox it runs generated code in"
    return None


def _data(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if ext in ("pytest", "syrupy") or (target is not None and target not in ("ground", "data", "in-engine")):
        return "data imports no pytest or syrupy, and of the harness only the ground and data"
    return None


def _engine(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if target in ("judgement", "workflow") and t != SERVED_SAMPLES:
        return "the engine imports no judgement (of quality/, only the samples it serves)"
    return None


def _judgement(t: str, ext: str | None, target: str | None, stdlib: set[str]) -> str | None:
    if ext == "pytest" or target in ("engine", "mini", "workflow", "surface"):
        return "judgement imports no pytest, engine, mini, workflow or surface"
    return None


# Each wall's own rule; the rules below them hold for every wall.
WALL_RULES = {
    "in-engine": _in_engine,
    "isolation": _isolation,
    "ground": _ground,
    "mini": _mini,
    "data": _data,
    "engine": _engine,
    "judgement": _judgement,
}


def _rule(module: str, t: str, ext: str | None, stdlib: set[str]) -> str | None:
    """The rule the import `module -> t` breaks, or None."""
    wall = wall_of(module)
    target = None if ext is not None else wall_of(t)
    if (own := WALL_RULES.get(wall)) and (rule := own(t, ext, target, stdlib)):
        return rule
    if ext == "syrupy" and module != "judge.snapshots":
        return "syrupy is imported through judge/snapshots.py alone"
    if ext == "ray" and not module.startswith("fleet."):
        return "Ray is imported by fleet/ alone (never by an engine's process: in_engine/no_ray.py)"
    if target == "workflow" and wall not in ("workflow", "surface"):
        return "only a surface imports a workflow"
    dispatches = module.startswith("cli") or (module.startswith("plugin") and t.split(".")[0] == "report")
    if target == "surface" and t.split(".")[0] != module.split(".")[0] and not dispatches:
        return "nothing imports a surface"  # but the command line dispatches to the bench; a session renders its page
    return None


def breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses a wall, as 'importer -> imported: the rule'."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    out = []
    for module, targets in sorted(graph.items()):
        wall_of(module)  # every module has one, whether or not it imports anything
        for t in sorted(targets):
            ext = t.removeprefix("ext:") if t.startswith("ext:") else None
            if rule := _rule(module, t, ext, stdlib):
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
    assert breaches(graph) == []
    assert cycles(graph) == []


def test_the_package_root_holds_only_the_ground_and_the_recorded_shims() -> None:
    """A module added at the root would sit outside every stage: the flat root the folders replaced."""
    assert {m for m in import_graph(PACKAGE) if "." not in m} == GROUND | ROOT_IN_ENGINE | set(FOLDER_WALLS)


def test_the_in_engine_package_imports_nothing() -> None:
    """digests imports in_engine.observe for its moments: a replay must not load vLLM or torch through the
    package's __init__."""
    assert import_graph(PACKAGE)["in_engine"] == set()


def test_a_module_in_a_folder_without_a_wall_is_named(tmp_path: Path) -> None:
    tree = tmp_path / "pytest_b70lab"
    shutil.copytree(PACKAGE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "stages").mkdir()
    (tree / "stages" / "__init__.py").write_text("")
    with pytest.raises(AssertionError, match="pytest_b70lab.stages has no wall"):
        breaches(import_graph(tree))


@pytest.mark.parametrize(
    "module, planted, rule",
    [
        ("in_engine.observe", "from ..judge import gates", "in-engine modules import no other module of the harness"),
        (
            "in_engine.worker_ext",
            "import numpy",
            "in-engine modules import only the standard library, vLLM, torch and psutil",
        ),
        ("worker_ext", "from .judge import gates", "in-engine modules import no other module of the harness"),
        ("isolation.processes", "import psutil", "isolation imports only the standard library"),
        ("isolation.sandbox", "from ..evidence import record", "isolation imports no other module of the harness"),
        ("digests", "from .evidence import record", "the ground imports only the ground"),
        (
            "mini.evaluate",
            "from ..judge import gates",
            "mini imports only data and the sandbox it runs generated code in",
        ),
        ("evidence.record", "import pytest", "data imports no pytest or syrupy, and of the harness only the ground"),
        (
            "evidence.throughput",
            "from ..engine import server",
            "data imports no pytest or syrupy, and of the harness only the ground and data",
        ),
        ("contract.schema", "from ..judge import verdict", "data imports no pytest or syrupy, and of the harness"),
        (
            "judge.reproduction",
            "from ..engine.starts import run_starts",
            "judgement imports no pytest, engine, mini, workflow",
        ),
        ("quality.judge", "from ..records import store", "judgement imports no pytest, engine, mini, workflow"),
        ("judge.verdict", "import syrupy", "syrupy is imported through judge/snapshots.py alone"),
        ("sweep.runner", "import ray", "Ray is imported by fleet/ alone"),
        ("engine.live", "from ..quality.judge import figure_of", "the engine imports no judgement"),
        ("engine.capability", "from ..judge import verdict", "the engine imports no judgement"),
        ("engine.starts", "from ..sweep import runner", "the engine imports no judgement"),
        ("kernels.cpu", "from ..sweep import runner", "only a surface imports a workflow"),
        ("engine.starts", "from ..plugin import state", "nothing imports a surface"),
        ("sweep.runner", "from ..cli import main", "nothing imports a surface"),
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
    path = tree / "evidence" / "checkpoint.py"
    path.write_text(path.read_text() + "\nfrom . import run_folder\n")
    assert {"evidence.checkpoint", "evidence.run_folder"} in cycles(import_graph(tree))


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


def strict_patterns() -> set[str]:
    """The mypy module patterns of the strict walls: the ground by name, a folder with all it holds."""
    ground = {f"pytest_b70lab.{m}" for m in GROUND if m}
    folders = {f"pytest_b70lab.{f}.*" for f, wall in FOLDER_WALLS.items() if wall in STRICT_WALLS}
    return ground | folders


def test_mypy_is_strict_exactly_where_the_walls_say() -> None:
    """pyproject.toml's strict override lists the walls a verdict is computed from (the ground, data,
    judgement and the workflows), derived from the same folders: a folder that changes wall changes there too,
    or this fails."""
    import tomllib

    overrides = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs")]
    assert len(strict) == 1, "one strict override in pyproject.toml's [tool.mypy]"
    assert set(strict[0]["module"]) == strict_patterns()
