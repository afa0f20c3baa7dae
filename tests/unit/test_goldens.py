"""Every committed bundle and seal replays to the verdict it gave before the package's folders moved (issue 45).

The goldens under fixtures/goldens/ were recorded from pytest replays at 6474259, before the first move: the
verdict section a tired engineer reads and the promotion.json a dashboard reads, with this machine's folders
written as <run>, <cache> and <repo>. A move or a split that changes either fails here, naming the case and
the first line that differs. The cache is an empty folder, and whether the checkpoint tables were recomputed
or taken on trust (a fact of the machine, not of the run) is left out of the comparison.

To record them again after a deliberate change of the verdict: B70LAB_RECORD_GOLDENS=1 pytest
tests/unit/test_goldens.py (each case then fails, saying it wrote its golden: review the diff before
committing it).
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
from pathlib import Path

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest
import torch  # noqa: F401  (likewise: a replay that loads it, then drops it from sys.modules, crashes the next)

REPO = Path(__file__).resolve().parents[2]
GATES = REPO / "tests" / "gates"
GOLDENS = REPO / "fixtures" / "goldens"

pytest_plugins = ["pytester"]

# (golden name, folder, the contract to judge under: None for the one it names, or its recorded digest)
CASES = [
    ("mini-laguna-cpu", "fixtures/evidence/mini-laguna-cpu", None),
    ("mini-laguna-cpu-int4", "fixtures/evidence/mini-laguna-cpu-int4", None),
    ("mini-laguna-cpu-teacher", "fixtures/evidence/mini-laguna-cpu-teacher", None),
    ("mini-laguna-cpu-v1-sequential", "fixtures/evidence/mini-laguna-cpu-v1-sequential", None),
    (
        "mini-laguna-cpu-v1-sequential@recorded",
        "fixtures/evidence/mini-laguna-cpu-v1-sequential",
        "mini-laguna-cpu@996974721f3aef50fee98f315713a7e6eeb40a62ae1771fa6bcb123612edf4d8",
    ),
    ("seal-mini-laguna-cpu-20261204", "repro/mini-laguna-cpu-20261204", None),
    (
        "seal-mini-laguna-cpu-20261204@recorded",
        "repro/mini-laguna-cpu-20261204",
        "mini-laguna-cpu@0d03c5e9a06fb8c6a7ddf28a2cbf4d8c66d578bb30e404fa61b19190a543978b",
    ),
    ("seal-mini-laguna-cpu-20261204b", "repro/mini-laguna-cpu-20261204b", None),
    ("seal-mini-laguna-cpu-20261205", "repro/mini-laguna-cpu-20261205", None),
    ("seal-mini-laguna-cpu-int4-20261205", "repro/mini-laguna-cpu-int4-20261205", None),
    (
        "seal-mini-laguna-cpu-int4-20261205@recorded",
        "repro/mini-laguna-cpu-int4-20261205",
        "mini-laguna-cpu-int4@318eb19d9c3a4aff389c2f32fd740dae5e30a0f0b8d82fdca816837bb985c0b6",
    ),
    ("seal-mini-laguna-cpu-int4-20261206", "repro/mini-laguna-cpu-int4-20261206", None),
]


def _verdict_section(lines: list[str]) -> list[str]:
    """The lines under the verdict banner, up to pytest's own summary."""
    start = next(i for i, line in enumerate(lines) if "b70lab promotion verdict" in line)
    section = []
    for line in lines[start + 1 :]:
        if line.startswith("=") and ("short test summary" in line or " in " in line):
            break
        section.append(line)
    # Whether pytest opens the section with a blank line depends on what the terminal held before it (it differs
    # between a run under CI=true and one without): blank lines at the edges are not the verdict's.
    while section and not section[0].strip():
        section.pop(0)
    while section and not section[-1].strip():
        section.pop()
    return section


def _relative(text: str, run: Path, cache: Path) -> str:
    return text.replace(str(run), "<run>").replace(str(cache), "<cache>").replace(str(REPO), "<repo>")


TABLES_LINE = "  checkpoint tables taken on trust"


def _of_the_run(golden: dict) -> dict:
    """What the run's files alone decide: not whether this machine holds a checkpoint the tables could be
    recomputed from (a path contract's exported folder under data/ is there once an engine test has written
    it), which promotion.json's checkpoint_tables_checked and one verdict line say."""
    promotion = {k: v for k, v in golden["promotion"].items() if k != "checkpoint_tables_checked"}
    verdict = [line for line in golden["verdict"] if not line.startswith(TABLES_LINE)]
    return {**golden, "promotion": promotion, "verdict": verdict}


@pytest.mark.parametrize("name, folder, contract", CASES, ids=[c[0] for c in CASES])
def test_a_committed_bundle_replays_to_its_golden(
    pytester: pytest.Pytester, name: str, folder: str, contract: str | None
) -> None:
    run, cache = pytester.path / "run", pytester.path / "cache"
    shutil.copytree(REPO / folder, run)
    cache.mkdir()
    extra = [f"--b70-contract={contract}"] if contract else []
    result = pytester.runpytest(
        str(GATES), "-m", "gates", f"--b70-evidence={run}", f"--b70-cache-dir={cache}", "-p", "no:cacheprovider", *extra
    )
    promotion = json.loads((run / "promotion.json").read_text())
    seen = {
        "exit_status": int(result.ret),
        "verdict": [_relative(line, run, cache) for line in _verdict_section(result.stdout.lines)],
        "promotion": json.loads(_relative(json.dumps(promotion), run, cache)),
    }
    path = GOLDENS / f"{name}.json"
    if os.environ.get("B70LAB_RECORD_GOLDENS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")
        pytest.fail(f"recorded {path.relative_to(REPO)}: review its diff, then run again without B70LAB_RECORD_GOLDENS")
    assert path.is_file(), f"no golden for {name} at {path}: record it with B70LAB_RECORD_GOLDENS=1"
    expected = _of_the_run(json.loads(path.read_text()))
    seen = _of_the_run(seen)
    if seen != expected:
        diff = difflib.unified_diff(
            json.dumps(expected, indent=1, sort_keys=True).splitlines(),
            json.dumps(seen, indent=1, sort_keys=True).splitlines(),
            f"golden {path.relative_to(REPO)}",
            f"replay of {folder}",
            lineterm="",
            n=2,
        )
        pytest.fail(f"{folder} no longer replays to its golden:\n" + "\n".join(list(diff)[:60]))


def _help_texts() -> str:
    """`b70lab --help` and every subcommand's, at a fixed width, each under its command line."""
    import argparse

    from pytest_b70lab.cli import build_parser

    texts: list[str] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        texts.append(f"$ b70lab {' '.join(words)} --help".rstrip() + "\n" + parser.format_help())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*words, name])

    walk(build_parser(), [])
    return "\n".join(texts)


def test_every_command_line_help_is_its_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's help, which moving its modules into cli/ must not change."""
    monkeypatch.setenv("COLUMNS", "120")
    seen = _help_texts()
    path = GOLDENS / "cli-help.txt"
    if os.environ.get("B70LAB_RECORD_GOLDENS") == "1":
        path.write_text(seen)
        pytest.fail(f"recorded {path.relative_to(REPO)}: review its diff, then run again without B70LAB_RECORD_GOLDENS")
    expected = path.read_text()
    if seen != expected:
        diff = difflib.unified_diff(expected.splitlines(), seen.splitlines(), "golden", "now", lineterm="", n=2)
        pytest.fail("the command line's help changed:\n" + "\n".join(list(diff)[:60]))
