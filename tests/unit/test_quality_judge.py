"""Gate 8's judgement, engine-free: the checks of one answer, the paired exact test, the baseline's
integrity, and the verdict's own line. Answers come from the pinned quality set's own samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.judge import verdict
from pytest_b70lab.quality import checks, judge, samples

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mini_set() -> list[samples.QualitySample]:
    q = contract.load("mini-laguna-cpu").quality
    assert q is not None
    return samples.load(contract.repo_path(q.file), q.sha256, q.count)


def _first(mini_set, family: str) -> samples.QualitySample:
    return next(s for s in mini_set if s.family == family)


class _Ran:
    def __init__(self, passed: bool):
        self.passed, self.reason, self.seconds = passed, "ran", 0.01


# --- one answer -------------------------------------------------------------------------------------


def test_coding_runs_prompt_body_and_test_and_cuts_at_the_stop(mini_set) -> None:
    s = _first(mini_set, "coding")
    programs: list[str] = []
    score = checks.coding(
        s, checks.Answer(text="    return 1\n\ndef extra(): pass\n"), lambda p: programs.append(p) or _Ran(True)
    )
    assert score.passed
    assert programs[0].startswith(s.prompt + "    return 1\n\n")
    assert "def extra" not in programs[0] and programs[0].rstrip().endswith(f"check({s.entry_point})")


def test_structured_validates_against_the_samples_schema(mini_set) -> None:
    s = _first(mini_set, "structured")
    schema = s.schema_
    good = {
        k: (v["enum"][0] if "enum" in v else {"string": "x", "integer": 1, "boolean": True}[v["type"]])
        for k, v in schema["properties"].items()
    }
    assert checks.structured(s, checks.Answer(text=json.dumps(good) + "\n")).passed
    first = next(iter(good))
    bad = checks.structured(s, checks.Answer(text=json.dumps({**good, first: [1]})))
    assert not bad.passed and "[1]" in bad.detail
    not_json = checks.structured(s, checks.Answer(text='{"a": '))
    assert not not_json.passed and "not JSON" in not_json.detail


def test_tool_use_needs_one_call_of_the_expected_tool_with_valid_arguments(mini_set) -> None:
    s = _first(mini_set, "tool_use")
    tool = next(t["function"] for t in s.tools if t["function"]["name"] == s.expected_tool)
    args = {p: (1 if spec["type"] == "integer" else "x") for p, spec in tool["parameters"]["properties"].items()}
    call = {"name": s.expected_tool, "arguments": json.dumps(args)}
    assert checks.tool_use(s, checks.Answer(text="", tool_calls=[call])).passed
    assert not checks.tool_use(s, checks.Answer(text="", tool_calls=[call, call])).passed
    other = next(t["function"]["name"] for t in s.tools if t["function"]["name"] != s.expected_tool)
    wrong = checks.tool_use(s, checks.Answer(text="", tool_calls=[{**call, "name": other}]))
    assert not wrong.passed and other in wrong.detail
    missing = checks.tool_use(s, checks.Answer(text="", tool_calls=[{**call, "arguments": "{}"}]))
    assert not missing.passed and "required" in missing.detail


def test_repetition_figures() -> None:
    words = "the cat sat on the mat and the cat sat on the mat".split()
    assert checks.longest_repeated_span(words) == 6  # "the cat sat on the mat"
    assert checks.longest_repeated_span("a b c d".split()) == 0
    assert checks.repetition_rate("a b c d e".split(), 2) == 0.0
    assert checks.repetition_rate("a b a b a b".split(), 2) == pytest.approx(1 - 2 / 5)
    limits = checks.RepetitionLimits(ngram=4, max_rate=0.5, max_span=16)
    s = samples.QualitySample(id="r", family="repetition", prompt="p", max_tokens=10)
    loop = checks.repetition(s, checks.Answer(text=" ".join(["one two three four five"] * 8)), limits)
    assert not loop.passed and loop.figures["longest_repeated_span"] == 35
    prose = checks.repetition(
        s, checks.Answer(text="The baker opened a quiet garden in the spring and smiled."), limits
    )
    assert prose.passed, prose.detail


def test_long_context_takes_the_first_word(mini_set) -> None:
    s = _first(mini_set, "long_context")
    assert checks.long_context(s, checks.Answer(text=f" {s.expected}\n? k1 = v2")).passed
    assert checks.long_context(s, checks.Answer(text=f" {s.expected}.")).passed
    assert not checks.long_context(s, checks.Answer(text=f" {s.expected}0")).passed


def test_a_failed_request_is_a_failed_sample_with_the_engines_error(mini_set) -> None:
    s = _first(mini_set, "long_context")
    score = checks.score(s, checks.Answer(text=s.expected or "", error="HTTP 500: boom"), run=lambda p: _Ran(True))
    assert not score.passed and "HTTP 500" in score.detail


# --- the paired exact test ---------------------------------------------------------------------------


def test_one_sided_binomial_p_values() -> None:
    assert judge.one_sided_p(0, 7) == 1.0
    assert judge.one_sided_p(5, 0) == 1 / 32
    assert judge.one_sided_p(3, 1) == 5 / 16
    assert judge.one_sided_p(4, 0) == 1 / 16


def _scores(keys, failing: set) -> dict:
    return {k: checks.Score(k not in failing, "failed here" if k in failing else "ok") for k in keys}


def test_judge_fails_a_figure_on_five_net_lost_samples_not_on_four(mini_set) -> None:
    keys = judge.keys_by_figure(mini_set)["coding"]
    base = {k: True for k in keys}
    four = judge.judge("coding", keys, _scores(keys, set(keys[:4])), base, 0.05)
    five = judge.judge("coding", keys, _scores(keys, set(keys[:5])), base, 0.05)
    assert four.passed and four.p_value == 1 / 16
    assert not five.passed and five.lost == [judge.key_text(k) for k in keys[:5]]
    assert "p = 0.0312 < alpha 0.05" in five.explain() and "failed here" in five.explain()
    # Gains offset losses: 6 lost and 3 gained is chance at this level.
    mixed_base = {k: k not in keys[6:9] for k in keys}
    mixed = judge.judge("coding", keys, _scores(keys, set(keys[:6])), mixed_base, 0.05)
    assert mixed.passed and (len(mixed.lost), len(mixed.gained)) == (6, 3)


def test_judge_fails_closed_on_missing_answers_and_a_stale_baseline(mini_set) -> None:
    keys = judge.keys_by_figure(mini_set)["tool_use"]
    partial = judge.judge("tool_use", keys, _scores(keys[1:], set()), {k: True for k in keys}, 0.05, " (evidence X)")
    assert not partial.passed and "partial evidence" in partial.explain() and "(evidence X)" in partial.explain()
    stale = judge.judge("tool_use", keys, _scores(keys, set()), {k: True for k in keys[1:]}, 0.05)
    assert not stale.passed and "--snapshot-update" in stale.explain()
    empty = judge.judge("tool_use", [], {}, {}, 0.05)
    assert not empty.passed


def test_every_figure_of_the_mini_set() -> None:
    q = contract.load("mini-laguna-cpu").quality
    figures = judge.keys_by_figure(samples.load(contract.repo_path(q.file), q.sha256, q.count))
    assert set(figures) == {
        "coding",
        "structured/guided",
        "structured/unguided",
        "tool_use",
        "repetition",
        "long_context/quarter",
        "long_context/half",
        "long_context/near-max",
    }
    assert figures["structured/guided"] == [(k, "guided") for k, _ in figures["structured/unguided"]]


# --- the quality verdict line -------------------------------------------------------------------------


def _outcome(figure: str, outcome: str, c: int | None, b: int, n: int, p: float | None) -> verdict.QualityOutcome:
    observed = {"candidate_passed": c, "baseline_passed": b, "samples": n, "p_value": p} if c is not None else {}
    return verdict.QualityOutcome(
        f"tests/quality/test_quality.py::test_quality[{figure}]",
        figure,
        outcome,
        "" if outcome == "passed" else "why",
        observed,
    )


def test_quality_verdict_lines() -> None:
    ok = verdict.QualityDecision(
        ["coding", "tool_use"],
        [_outcome("coding", "passed", 28, 28, 30, 1.0), _outcome("tool_use", "passed", 29, 30, 30, 0.5)],
    )
    assert ok.status == "ok"
    assert verdict.quality_summary(ok)[0][0].startswith("QUALITY OK - 2 figures")
    bad = verdict.QualityDecision(
        ["coding", "long_context/near-max"],
        [_outcome("coding", "passed", 28, 28, 30, 1.0), _outcome("long_context/near-max", "failed", 0, 8, 8, 1 / 256)],
    )
    assert bad.status == "regressed"
    assert verdict.quality_summary(bad)[0][0] == "QUALITY REGRESSED: long_context/near-max: 0/8 vs 8/8"
    partial = verdict.QualityDecision(["coding", "tool_use"], [_outcome("coding", "failed", None, 0, 0, None)])
    assert partial.status == "incomplete"
    line = verdict.quality_summary(partial)[0][0]
    assert line.startswith("QUALITY NOT JUDGED") and "tool_use: did not run" in line and "coding: failed" in line


def test_promotion_json_keeps_quality_apart(tmp_path: Path) -> None:
    q = verdict.QualityDecision(["coding"], [_outcome("coding", "failed", 20, 28, 30, 0.001)])
    data = json.loads(verdict.write(None, tmp_path, q).read_text())
    assert data["promotable"] is False and data["complete"] is False
    assert data["quality"]["status"] == "regressed" and data["quality"]["regressed"] == ["coding"]
