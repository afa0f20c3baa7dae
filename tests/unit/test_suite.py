"""The gate suite ships with the plugin (pytest_b70lab/plugin/suite/, collected by plugin/collect.py): this
repository keeps the node ids its test files had, and a lab folder that holds no test file gets the same
session and verdict."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest

REPO = Path(__file__).resolve().parents[2]
GATES = REPO / "tests" / "gates"
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
NODE_IDS = REPO / "fixtures" / "gate-node-ids.txt"

pytest_plugins = ["pytester"]


def _collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest(*args, "--co", "-q", "-p", "no:cacheprovider")
    return [line for line in result.stdout.lines if "::" in line]


def test_this_repository_keeps_the_node_ids_of_its_former_test_files(pytester: pytest.Pytester) -> None:
    """-k, --deselect, xdist, JUnit names and saved dashboards key on these ids."""
    recorded = [line for line in NODE_IDS.read_text().splitlines() if line and not line.startswith("#")]
    run = pytester.path / "bundle"  # not named like a contract: the replay's argument is a folder
    shutil.copytree(BUNDLE, run)
    gates = _collected(pytester, str(GATES), "-m", "gates", f"--b70-evidence={run}")
    teacher = _collected(pytester, str(GATES), "-m", "teacher", f"--b70-evidence={run}")
    assert gates + teacher == recorded
    assert not list(GATES.glob("test_*.py")), "the suite is the plugin's: tests/gates holds the teacher snapshots"


def _lab(pytester: pytest.Pytester) -> Path:
    """A lab repository as the issue draws it: a pyproject naming its contract, the contract, its prompt set,
    its teacher snapshots and a copy of a bundle; no test file, no conftest."""
    lab = pytester.path
    (lab / "contracts").mkdir()
    shutil.copy(REPO / "fixtures" / "contracts" / "mini-laguna-cpu.toml", lab / "contracts" / "candidate.toml")
    (lab / "fixtures" / "prompts").mkdir(parents=True)
    shutil.copy(REPO / "fixtures" / "prompts" / "mini-v3.jsonl", lab / "fixtures" / "prompts")
    shutil.copytree(GATES / "__snapshots__", lab / "tests" / "gates" / "__snapshots__")
    shutil.copytree(BUNDLE, lab / "bundle")
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nb70_contract = "contracts/candidate.toml"\n')
    assert not [p for p in lab.rglob("*.py")], "a lab folder of data alone"
    return lab


def test_a_lab_folder_without_test_files_gets_the_gates_and_the_verdict(pytester: pytest.Pytester) -> None:
    lab = _lab(pytester)
    result = pytester.runpytest("-m", "gates", f"--b70-evidence={lab / 'bundle'}", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        [
            "tests/gates/test_rank_gates.py *",
            "PROMOTABLE at * / * tok/s median (start-1 / start-2) - contract mini-laguna-cpu "
            "(79/79 required gate subjects passed)",
        ]
    )
    mine = _collected(pytester, "-m", "gates", f"--b70-evidence={lab / 'bundle'}")
    recorded = [line for line in NODE_IDS.read_text().splitlines() if line and not line.startswith("#")]
    assert mine == recorded[: len(mine)] and len(mine) == 80, "a lab's ids are this repository's"


def test_a_lab_file_named_like_a_suite_module_replaces_it_and_says_so(pytester: pytest.Pytester) -> None:
    lab = _lab(pytester)
    (lab / "tests" / "gates" / "test_speedup.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.gates\n\n\ndef test_the_labs_own() -> None:\n    pass\n"
    )
    result = pytester.runpytest("-m", "gates", f"--b70-evidence={lab / 'bundle'}", "-p", "no:cacheprovider", "-rA")
    result.stdout.fnmatch_lines(
        [
            "*test_speedup.py replaces the gate suite's own test_speedup.py*",
            "PASSED tests/gates/test_speedup.py::test_the_labs_own",
        ]
    )
    assert "test_speedup_over_target_only" not in result.stdout.str()


def test_a_missing_gates_folder_is_said_in_the_header(pytester: pytest.Pytester) -> None:
    lab = _lab(pytester)
    shutil.rmtree(lab / "tests")
    result = pytester.runpytest("-m", "gates", f"--b70-evidence={lab / 'bundle'}", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["b70lab: no gates folder */tests/gates: the gate suite is collected there*"])
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_a_project_that_asks_for_no_gates_grows_none(pytester: pytest.Pytester) -> None:
    """Installed beside other projects, the plugin leaves their tests/gates alone unless told otherwise."""
    (pytester.path / "tests" / "gates").mkdir(parents=True)
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\n")
    assert _collected(pytester, "-m", "gates") == []
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nb70_gates_dir = "tests/gates"\n')
    assert len(_collected(pytester, "-m", "teacher")) == 6


def test_the_labs_conftest_hooks_reach_the_suites_tests(pytester: pytest.Pytester) -> None:
    """pytest finds a node's conftests from its path, which for the suite names no file: collect.py loads them."""
    lab = _lab(pytester)
    (lab / "tests" / "gates" / "conftest.py").write_text(
        "import pytest\n\n\ndef pytest_runtest_setup(item):\n"
        "    if 'test_launch_flags[start-2-rank-1]' in item.nodeid:\n"
        "        pytest.skip('the lab skipped it')\n"
    )
    result = pytester.runpytest("-m", "gates", f"--b70-evidence={lab / 'bundle'}", "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_launch_flags?start-2-rank-1? skipped, but a promotion requires it*"])
