"""A worked example of the hookspecs (pytest_b70lab/plugin/hookspecs.py): another plugin adds a gate to the
promotion and reads the verdict. Judged on the recorded evidence bundle, through pytester."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
GATES = REPO / "tests" / "gates"

pytest_plugins = ["pytester"]

# The other plugin: one gate of scope "start" (so one required subject per fresh start), and a reader of the
# verdict. A lab would ship this as its own package with a pytest11 entry point; here it is loaded with -p.
LATENCY_PLUGIN = """
import json

def pytest_b70lab_gates(config):
    return {"first-token-latency": "start"}

def pytest_b70lab_verdict(config, decision, quality, run_dir):
    (run_dir / "read-by-plugin.json").write_text(json.dumps(
        {"promotable": decision.promotable, "complete": decision.complete, "failed_gates": decision.failed_gates,
         "required": sorted({gate for gate, _ in decision.required})}))
"""

# Its gate test: a pure function of the start's evidence, like the catalogue's.
LATENCY_TEST = """
import os
import pytest
from pytest_b70lab.judge import rules

pytestmark = pytest.mark.gates

@pytest.mark.b70_gate("first-token-latency")
def test_first_token_latency(b70_start_evidence, b70_start, b70_verdict):
    limit = float(os.environ["FIRST_TOKEN_LIMIT_S"])
    slowest = max(r.chunk_times[0] for r in b70_start_evidence.requests)
    reasons = [] if slowest <= limit else [f"slowest first token {slowest:.3f} s > {limit} s"]
    b70_verdict(rules.Verdict("first-token-latency", rules.subject(b70_start), not reasons, reasons,
                              {"slowest_first_token_s": slowest}))
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, limit_s: float, *extra: str):
    pytester.makepyfile(latency_plugin=LATENCY_PLUGIN, test_latency=LATENCY_TEST)
    pytester.syspathinsert()
    monkeypatch.setenv("FIRST_TOKEN_LIMIT_S", str(limit_s))
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    result = pytester.runpytest(
        str(GATES),
        str(pytester.path / "test_latency.py"),
        "-m",
        "gates",
        "--b70-evidence",
        str(run),
        "-p",
        "latency_plugin",
        "-p",
        "no:cacheprovider",
        "-v",
        *extra,
    )
    promotion = json.loads((run / "promotion.json").read_text())
    return result, promotion, json.loads((run / "read-by-plugin.json").read_text())


def _first_tokens(start: str) -> float:
    evidence = json.loads((BUNDLE / start / "evidence.json").read_text())
    return max(r["chunk_times"][0] for r in evidence["requests"])


def test_a_plugin_gate_is_required_and_the_plugin_reads_the_verdict(pytester, monkeypatch) -> None:
    result, promotion, read = _run(pytester, monkeypatch, limit_s=60.0)
    result.stdout.fnmatch_lines(
        [
            "*test_first_token_latency?start-1? PASSED*",
            "*test_first_token_latency?start-2? PASSED*",
            f"PROMOTABLE at * ({len(promotion['required'])}/{len(promotion['required'])} *",
        ]
    )
    assert ["first-token-latency", "start-1"] in promotion["required"]
    assert ["first-token-latency", "start-2"] in promotion["required"]
    assert read == {"promotable": True, "complete": True, "failed_gates": [], "required": sorted(read["required"])}
    assert "first-token-latency" in read["required"] and "teacher-exactness" in read["required"]


def test_a_failing_plugin_gate_stops_the_promotion(pytester, monkeypatch) -> None:
    # Between the two starts' slowest first tokens: one start passes and the other fails.
    firsts = {start: _first_tokens(start) for start in ("start-1", "start-2")}
    low, high = sorted(firsts.values())
    assert low < high, "the recorded starts' first tokens differ, so a limit between them splits them"
    slower = max(firsts, key=firsts.get)
    result, promotion, read = _run(pytester, monkeypatch, limit_s=(low + high) / 2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "NOT PROMOTABLE*failed gates: first-token-latency*",
            f"*test_first_token_latency?{slower}? failed: slowest first token*",
        ]
    )
    assert promotion["failed_gates"] == read["failed_gates"] == ["first-token-latency"]
    assert read["promotable"] is False


def test_a_deselected_plugin_gate_leaves_the_run_incomplete(pytester, monkeypatch) -> None:
    result, promotion, read = _run(pytester, monkeypatch, 60.0, "-k", "not first_token_latency")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert sorted(map(tuple, promotion["missing"])) == [
        ("first-token-latency", "start-1"),
        ("first-token-latency", "start-2"),
    ]
    assert read["complete"] is False and read["promotable"] is False


@pytest.mark.parametrize(
    "declared, problem",
    [
        ({"teacher-exactness": "prompt"}, "'teacher-exactness' is a gate of the catalogue already"),
        ({"first-token-latency": "request"}, "scope 'request'; a scope is one of rank, prompt, start, run"),
    ],
)
def test_a_bad_gate_declaration_is_a_usage_error(pytester, declared, problem) -> None:
    pytester.makepyfile(
        bad_plugin=f"def pytest_b70lab_gates(config):\n    return {declared!r}\n", test_latency=LATENCY_TEST
    )
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "bad_plugin", "-p", "no:cacheprovider", "-m", "gates")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines([f"*pytest_b70lab_gates: *{problem}*"])


def test_a_gate_nobody_declared_is_refused_naming_the_declared_ones(pytester) -> None:
    pytester.makepyfile(test_latency=LATENCY_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "gates")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["*b70_gate('first-token-latency') is not a gate of the catalogue*"])


# The same gate declared the catalogue's way (pytest_b70lab_catalogue): its rule a pure function of the run's
# inputs, its test one call of b70_gate_check, and the in-process judge takes the same entry.
CATALOGUED_PLUGIN = """
import os
from pytest_b70lab.judge import catalogue, rules

def first_token_latency(inputs, subject):
    limit = float(os.environ["FIRST_TOKEN_LIMIT_S"])
    slowest = max(r.chunk_times[0] for r in subject.start.requests)
    reasons = [] if slowest <= limit else [f"slowest first token {slowest:.3f} s > {limit} s"]
    return rules.Verdict("first-token-latency", subject.name, not reasons, reasons, {"slowest_first_token_s": slowest})

FIRST_TOKEN = catalogue.Gate(
    "first-token-latency", (catalogue.START,), "test_latency.py::test_first_token_latency", first_token_latency,
    declared_scope="start",
)

def pytest_b70lab_catalogue(config):
    return [FIRST_TOKEN]
"""

CATALOGUED_TEST = """
import pytest

pytestmark = pytest.mark.gates

@pytest.mark.b70_gate("first-token-latency")
def test_first_token_latency(b70_start_evidence, b70_gate_check):
    b70_gate_check(b70_start_evidence)
"""


def test_a_catalogued_plugin_gate_is_judged_alike_by_the_session_and_the_in_process_judge(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from pytest_b70lab.engine.starts import tables_or_why
    from pytest_b70lab.evidence.run_folder import read_starts
    from pytest_b70lab.judge import folder as judge
    from pytest_b70lab.judge import replay

    firsts = sorted(_first_tokens(start) for start in ("start-1", "start-2"))
    pytester.makepyfile(catalogued_plugin=CATALOGUED_PLUGIN, test_latency=CATALOGUED_TEST)
    pytester.syspathinsert()
    monkeypatch.setenv("FIRST_TOKEN_LIMIT_S", str(sum(firsts) / 2))  # one start passes, the other fails
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    result = pytester.runpytest(
        str(GATES), str(pytester.path / "test_latency.py"), "-m", "gates", f"--b70-evidence={run}",
        "-p", "catalogued_plugin", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    session = json.loads((run / "promotion.json").read_text())
    assert session["failed_gates"] == ["first-token-latency"]
    assert ["first-token-latency", "start-2"] in session["required"]

    plugin = importlib.import_module("catalogued_plugin")  # the plugin's own entry, as the sweep would import it
    starts = read_starts(run)
    contract, problems = replay.judged_contract(starts, run, None)
    decision = judge.judge(
        run,
        contract,
        starts,
        tables=tables_or_why(run, contract, run / "no-cache"),
        teacher_snapshots=GATES / "__snapshots__",
        problems=problems,
        added=[plugin.FIRST_TOKEN],
    )
    assert decision.failed_gates == session["failed_gates"]
    assert sorted(map(list, decision.required)) == sorted(session["required"])
    assert decision.promotable is session["promotable"] is False
