"""Gate 8 through the pytest surface (pytester), on the recorded bundle's quality answers and the committed
FP8 baseline: the verdict line, JUnit properties, promotion.json, and failing closed on a tampered
baseline, on evidence without quality answers, and on a contract without a [quality] table."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.isolation import sandbox
from pytest_b70lab.quality import baseline

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
QUALITY = REPO / "tests" / "quality"

pytest_plugins = ["pytester"]


def _replay(pytester: pytest.Pytester, tests: Path = QUALITY, run: Path | None = None, *extra: str):
    if run is None:
        run = pytester.path / "run"
        shutil.copytree(BUNDLE, run)
    junit = pytester.path / "quality.xml"
    result = pytester.runpytest(
        str(tests),
        "-m",
        "quality",
        "-k",
        "not baseline",
        "--b70-evidence",
        str(run),
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        *extra,
    )
    return result, run, junit


def _figures(junit: Path) -> dict[str, dict[str, str]]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        props["failed"] = str(case.find("failure") is not None or case.find("error") is not None)
        out[props.get("quality_figure", case.get("name"))] = props
    return out


def test_the_recorded_candidate_is_quality_ok(pytester: pytest.Pytester) -> None:
    result, run, junit = _replay(pytester)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*QUALITY OK - 8 figures against the FP8 baseline: coding *"])
    figures = _figures(junit)
    assert len(figures) == 8 and all(p["failed"] == "False" for p in figures.values())
    recorded = json.loads((run / "start-1" / "evidence.json").read_text())["quality"]
    coding = figures["coding"]
    assert int(coding["samples"]) == sum(1 for r in recorded if r["family"] == "coding")
    quality = json.loads((run / "promotion.json").read_text())["quality"]
    assert quality["status"] == "ok" and quality["missing"] == [] and len(quality["figures"]) == 8
    # Gate 8 never decides a promotion: this session ran no gate test.
    assert json.loads((run / "promotion.json").read_text())["promotable"] is False
    # The coding samples ran in every OS layer this machine gives (probed again here, as the same user).
    assert set(sandbox.os_layers()) | {"tempdir", "rlimits", "audit-hook"} <= set(quality["sandbox_layers"])
    assert sandbox.has_os_layer(quality["sandbox_layers"]) and quality["unisolated_allowed"] is False
    result.stdout.fnmatch_lines([f"*generated code ran sandboxed: {', '.join(quality['sandbox_layers'])}"])


def test_with_no_os_layer_generated_code_runs_only_when_allowed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine whose kernel refuses the namespaces (simulated by the probe's answer; the runs themselves are
    real, with only the layers that need no privilege): gate 8 refuses, naming how to allow it; allowed, it
    judges and the verdict and promotion.json say the code ran without OS isolation."""
    monkeypatch.setattr(sandbox, "os_layers", lambda: ())
    monkeypatch.setattr(sandbox, "PROBE_FAILURES", {"userns": "unshare: Operation not permitted"})
    monkeypatch.delenv(sandbox.ALLOW_UNISOLATED_ENV, raising=False)
    result, run, _ = _replay(pytester)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*refusing to run model-written code with no OS isolation*"])
    quality = json.loads((run / "promotion.json").read_text())["quality"]
    assert quality["status"] == "incomplete" and "coding" in quality["not_judged"], quality

    allowed = pytester.path / "allowed"
    shutil.copytree(BUNDLE, allowed)
    result, run, _ = _replay(pytester, QUALITY, allowed, "--b70-allow-unisolated-code")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        ["*QUALITY OK*", "*generated code ran WITHOUT OS isolation (allowed by --b70-allow-unisolated-code)*"]
    )
    quality = json.loads((run / "promotion.json").read_text())["quality"]
    assert quality["unisolated_allowed"] is True and not sandbox.has_os_layer(quality["sandbox_layers"])


def _tests_copy(pytester: pytest.Pytester) -> tuple[Path, Path]:
    tests = pytester.path / "tests" / "quality"
    shutil.copytree(QUALITY, tests, ignore=shutil.ignore_patterns("__pycache__"))
    # Another module name than the original's: a session that collected tests/quality has already imported
    # `test_quality` from there (the snapshot folder is named by the baseline module, not by this file).
    (tests / "test_quality.py").rename(tests / "test_quality_copy.py")
    c = contract.load("mini-laguna-cpu")
    return tests, baseline.snapshot_path(tests, c.teacher().output_digest, "fp8")


def test_an_edited_baseline_fails_closed(pytester: pytest.Pytester) -> None:
    tests, path = _tests_copy(pytester)
    data = json.loads(path.read_text())
    first = next(k for k, v in data["samples"].items() if v["passed"])
    data["samples"][first]["passed"] = False
    path.write_text(json.dumps(data, indent=2))
    result, run, _ = _replay(pytester, tests)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        ["*does not match its own digest*edited after it was recorded*", "*QUALITY NOT JUDGED*"]
    )
    assert "QUALITY OK" not in result.stdout.str()
    assert json.loads((run / "promotion.json").read_text())["quality"]["status"] == "incomplete"


def test_a_baseline_whose_figures_disagree_with_its_samples_fails_closed(pytester: pytest.Pytester) -> None:
    """An editor who also recomputes the digest still has to keep figures and samples consistent."""
    tests, path = _tests_copy(pytester)
    data = json.loads(path.read_text())
    data["figures"]["coding"]["passed"] += 1
    body = {k: v for k, v in data.items() if k != "digest"}
    data["digest"] = baseline._digest(body)
    path.write_text(json.dumps(data))
    result, _, _ = _replay(pytester, tests)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*figure coding says * passed, its samples say *: damaged or edited*"])


def test_a_corrupted_baseline_is_a_clear_error(pytester: pytest.Pytester) -> None:
    tests, path = _tests_copy(pytester)
    path.write_text(path.read_text()[:200])
    result, _, _ = _replay(pytester, tests)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*quality baseline * is not valid JSON*corrupted*"])


def test_evidence_without_quality_answers_is_not_judged(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    start = evidence.read(run / "start-1")
    start.quality = []
    evidence.write(start, run / "start-1")
    result, _, _ = _replay(pytester, QUALITY, run)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*holds no quality answers*", "*QUALITY NOT JUDGED*"])


def test_a_contract_without_a_quality_table_cannot_pass_gate_8_and_does_not_stop_the_gates(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest(
        str(QUALITY), "-m", "quality", "--b70-contract", "mini-laguna-cpu-path", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*contract mini-laguna-cpu-path has no ?quality? table: gate 8*", "*QUALITY NOT JUDGED*"]
    )
    assert "QUALITY OK" not in result.stdout.str()
    # Selecting the gates collects the quality tests too: they are deselected, never a collection error.
    collected = pytester.runpytest(
        str(QUALITY),
        "-m",
        "gates",
        "--b70-contract",
        "mini-laguna-cpu-path",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    )
    assert collected.ret == pytest.ExitCode.NO_TESTS_COLLECTED, collected.stdout.str()


@pytest.mark.parametrize("markexpr", ["quality or gates", "gates", "not teacher"])
def test_snapshot_update_records_only_a_teacher_or_a_quality_baseline(pytester: pytest.Pytester, markexpr: str) -> None:
    result = pytester.runpytest("-m", markexpr, "--snapshot-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*only allowed with `-m teacher` or `-m quality` alone*"])
