"""A session that cannot begin, or whose start failed, reads as that one failure: one error, the verdict
`NOT PROMOTABLE: start-N ...` naming the cause and the file, gate names only. Every later test that needs the
engine's evidence is skipped with that failure as its reason (also on the other xdist worker), and every other
test of the same pytest session (here a stand-in for the unit and kernel tests `make test` runs with the
gates) runs and reports as ever.

The model case is the one a new user hit: one byte changed in the mini's target checkpoint, caught by its
manifest before any engine starts (it used to surface as 73 setup errors with tracebacks)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_b70lab.evidence import record as evidence

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
GATES = REPO / "tests" / "gates"

pytest_plugins = ["pytester"]


UNRELATED = """
import pytest

@pytest.mark.kernels
def test_unrelated_runs():
    assert True
"""


def _assert_blocked_the_rest(result: pytest.RunResult, cause: str) -> None:
    """One failure, every other engine test skipped naming it, the unrelated test passed, exit status 1."""
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", 0) + outcomes.get("failed", 0) == 1, outcomes
    assert outcomes.get("passed") == 1 and outcomes.get("skipped", 0) > 10, outcomes
    assert re.search(r"PASSED .*::test_unrelated_runs", out), out[-3000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(
        re.search("not run after this session's first failure: " + cause, line) for line in skipped
    ), skipped[:3]


def _verdict_lines(out: str) -> list[str]:
    section = out.split("b70lab promotion verdict", 1)[1].split("short test summary info", 1)[0]
    return [line for line in section.splitlines()[1:] if line and not line.startswith("=")]


@pytest.fixture
def damaged_cache(pytester: pytest.Pytester, b70_mini_model: Path) -> Path:
    """A cache root holding a copy of the current mini with one byte of its target weights changed."""
    cache = pytester.path / "cache"
    copy = cache / "mini" / b70_mini_model.name
    shutil.copytree(b70_mini_model, copy)
    weights = copy / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 1
    weights.write_bytes(bytes(data))
    return cache


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["n0", "n2"])
def test_a_model_that_fails_its_manifest_is_one_failure(
    pytester: pytest.Pytester, damaged_cache: Path, workers: list[str]
) -> None:
    run = pytester.path / "run"
    unrelated = pytester.makepyfile(test_unrelated=UNRELATED)
    # Under -n 2 the teacher tests could be a worker's first engine test and name the teacher's start.
    lanes = "gates or kernels" if workers else "gates or teacher or kernels"
    result = pytester.runpytest(
        str(GATES),
        str(unrelated),
        "-m",
        lanes,
        f"--b70-cache-dir={damaged_cache}",
        f"--b70-run-dir={run}",
        "-p",
        "no:cacheprovider",
        "-rA",
        *workers,
    )
    out = result.stdout.str()
    assert "Traceback" not in out and "def verify" not in out, out[-3000:]
    cause = (
        r"start-1 could not begin: mini model at .*/cache/mini/mini-laguna-\w+ does not match its manifest: "
        r"target/model\.safetensors: sha256 \w+\.\.\., manifest says \w+\.\.\.\. Rebuild with"
    )
    # One failure for the whole session, also under -n 2: the second worker skips instead.
    _assert_blocked_the_rest(result, cause)
    lines = _verdict_lines(out)
    assert re.match("NOT PROMOTABLE: " + cause, lines[0]), lines
    assert not any("::test_" in line or "failed gates" in line for line in lines), lines  # no test names
    verdict = json.loads((run / "promotion.json").read_text())
    assert verdict["promotable"] is False and verdict["complete"] is False
    assert re.match(cause, verdict["blocked"])
    # The skipped gate subjects count as failed, each naming the session's first failure.
    skipped = [f for f in verdict["failed"] if f["outcome"] == "skipped"]
    assert skipped and all(re.search(cause, f["reasons"]) for f in skipped), verdict["failed"][:3]
    assert not (run / "start-1").exists(), "no engine may start on a model that fails its manifest"
    assert not list(run.glob(".blocked-*")), "the session's marker is removed at its end"


def test_replay_of_a_failed_start_reads_as_that_failure(pytester: pytest.Pytester) -> None:
    """A start that failed (here: the recorded start-2, marked failed in the start-up phase, as a start that
    never became ready writes it) is the session's one failure, with its phase, its cause and its evidence
    file; the other gate tests are skipped naming it, and an unrelated test still runs."""
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    failed = evidence.read(run / "start-2" / evidence.FILENAME)
    failed.status = "failed"
    failed.failure = evidence.Failure(
        message="engine not ready after 5 s (deadline)\nmore detail",
        phase="compiling",
        tails={"rank:Worker_TP1_EP1": ["last line"]},
    )
    evidence.write(failed, run / "start-2")
    unrelated = pytester.makepyfile(test_unrelated=UNRELATED)
    result = pytester.runpytest(
        str(GATES), str(unrelated), "-m", "gates or kernels", f"--b70-evidence={run}", "-p", "no:cacheprovider", "-rA"
    )
    out = result.stdout.str()
    _assert_blocked_the_rest(result, "start-2 failed while compiling: engine not ready after 5 s")
    lines = _verdict_lines(out)
    assert lines[0] == (
        "NOT PROMOTABLE: start-2 failed while compiling: engine not ready after 5 s (deadline) "
        f"(evidence and each rank's last lines: {run / 'start-2' / 'evidence.json'})"
    ), lines
    assert result.parseoutcomes().get("errors") == 1
    assert json.loads((run / "promotion.json").read_text())["blocked"].startswith("start-2 failed while compiling")


def test_a_stalled_collective_fails_before_any_engine_start(pytester: pytest.Pytester) -> None:
    """The seed's stall, injected into the preflight probe: the session's one failure comes within seconds of
    the probe's collective deadline, with each rank's state, and no engine ever starts."""
    run = pytester.path / "run"
    result = pytester.runpytest(
        str(GATES), "-m", "gates", f"--b70-run-dir={run}", "--b70-probe-stall=1", "-p", "no:cacheprovider"
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    lines = _verdict_lines(out)
    assert lines[0].startswith(
        "NOT PROMOTABLE: start-1 could not begin: collective probe failed: rank 0: stopped after entered, never "
        "completed; rank 1: stopped after initialized, never entered; the all_reduce did not complete within "
        "20 s of the first rank entering it"
    ), lines
    assert lines[0].endswith(f"({run / 'probe' / 'probe.json'})"), lines
    assert not (run / "start-1").exists(), "no engine may start after a failed probe"
    probe = json.loads((run / "probe" / "probe.json").read_text())
    assert probe["passed"] is False and all(r["gone"] for r in probe["ranks"])
