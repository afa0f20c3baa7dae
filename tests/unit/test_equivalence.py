"""Gate 7's equivalence rule and the stopping rule that sizes an interleaved session, on the committed bundle of
the embedded default (identical starts, 3 interleaved passes; its paired figure 1.073 by the point rule)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import run_folder, sampling, throughput
from pytest_b70lab.judge.reproduction import reproduction

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures/evidence/mini-laguna-cpu"
# Student's t, 95th percentile (one side of a 90 % interval), 5 degrees of freedom: from a printed table.
T_95_DF5 = 2.015


def _contract(**reproduction: object) -> contract.Contract:
    data = contract.load("mini-laguna-cpu").canonical()
    data["reproduction"] = {**data["reproduction"], **reproduction}
    return contract.Contract.model_validate(data, strict=False)


def _starts() -> list[evidence.Evidence]:
    return run_folder.read_starts(BUNDLE)


def _with_sampling(starts: list[evidence.Evidence], low: int, high: int, tolerance: float) -> None:
    for s in starts:
        assert s.schedule is not None
        s.schedule.sampling = evidence.Sampling(
            min_passes=low, max_passes=high, tolerance=tolerance, stopped="as recorded"
        )


def test_the_new_fields_stay_out_of_the_canonical_form_at_their_defaults() -> None:
    """The contracts written before the rule (the sealed ones among them) keep their digests."""
    plain = _contract()
    assert plain.digest == contract.load("mini-laguna-cpu").digest
    assert {"speed_rule", "max_passes"}.isdisjoint(plain.canonical()["reproduction"])
    sampled = _contract(speed_rule="equivalence", max_passes=8)
    assert sampled.canonical()["reproduction"]["max_passes"] == 8
    assert sampled.reproduction.pass_range == (3, 8) and plain.reproduction.pass_range == (3, 3)
    assert sampled.digest != plain.digest and sampled.output_digest == plain.output_digest
    teacher = sampled.teacher().reproduction
    assert (teacher.schedule, teacher.speed_rule, teacher.max_passes) == ("sequential", "point", None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_passes": 8}, 'speed_rule "equivalence"'),
        ({"speed_rule": "equivalence", "max_passes": 2}, "below passes"),
        ({"speed_rule": "equivalence", "max_passes": 51}, "reproduction.max_passes"),
        ({"speed_rule": "tost"}, "reproduction.speed_rule"),
        ({"schedule": "sequential", "passes": 1, "speed_rule": "equivalence", "max_passes": 2}, "interleaved"),
    ],
)
def test_a_rule_that_cannot_run_is_refused_naming_it(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _contract(**fields)


def test_the_interval_is_students_t_over_the_prompts() -> None:
    logs = [0.02, -0.01, 0.05, 0.00, 0.03, -0.02]
    mean = sum(logs) / 6
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 5)
    figure = throughput.t_ratio(logs, 0.90)
    assert figure.ratio == pytest.approx(math.exp(mean))
    assert figure.low == pytest.approx(math.exp(mean - T_95_DF5 * sd / math.sqrt(6)), rel=1e-4)
    assert figure.high == pytest.approx(math.exp(mean + T_95_DF5 * sd / math.sqrt(6)), rel=1e-4)
    assert figure.method == "t" and "(90 %, t, 6 prompts)" in figure.line()
    lone = throughput.t_ratio([0.01], 0.90)
    assert not lone.inside(0.5) and not lone.outside(0.5), "one prompt has no spread: never decided"


@pytest.mark.parametrize(
    ("low", "high", "inside", "outside"),
    [
        (0.96, 1.04, True, False),
        (0.94, 1.02, False, False),  # straddles 1 - T
        (0.99, 1.06, False, False),  # straddles 1 + T
        (0.90, 0.94, False, True),
        (1.06, 1.20, False, True),
    ],
)
def test_equivalence_needs_the_whole_interval_inside(low: float, high: float, inside: bool, outside: bool) -> None:
    figure = throughput.PairedRatio((low + high) / 2, low, high, 6, 0.90, 0)
    assert (figure.inside(0.05), figure.outside(0.05)) == (inside, outside)


def test_a_run_whose_interval_straddles_the_band_fails_naming_the_interval() -> None:
    """The bundle passes by the point rule (1.073 within 0.10) and fails by the equivalence rule: its 90 % interval
    reaches past 1.10."""
    starts = _starts()
    assert reproduction(starts, _contract()).passed
    verdict = reproduction(starts, _contract(speed_rule="equivalence"))
    assert not verdict.passed
    (reason,) = verdict.reasons
    assert "paired figure start-2 / start-1 1.073 [0.978, 1.177] (90 %, t, 6 prompts)" in reason
    assert "not wholly inside [0.900, 1.100]" in reason
    low, high = verdict.observed["endpoint_interval_start2"]
    assert low < 1 < high, "the endpoint medians' ratio is judged by its interval too (tolerance 0.20: inside)"


def test_a_wide_band_holds_the_same_run() -> None:
    assert reproduction(_starts(), _contract(speed_rule="equivalence", paired_tolerance=0.2)).passed


def test_the_stopping_rule_stops_where_the_interval_is_first_decided() -> None:
    """Pass 1 alone: 1.057 [0.954, 1.171], inside 1 +/- 0.5; the three passes never fit 1 +/- 0.1."""
    first, later = _starts()
    assert sampling.stopping_point(first, later, sampling.SamplingRule(1, 3, 0.5))[0] == 1
    passes, why = sampling.stopping_point(first, later, sampling.SamplingRule(1, 3, 0.1))
    assert passes == 3 and why.startswith("the maximum of 3 passes was served")
    assert sampling.stopping_point(first, later, sampling.SamplingRule(2, 3, 0.5))[0] == 2, "never before the minimum"


def test_a_decided_difference_stops_too() -> None:
    """An interval wholly outside the band will not come inside with more passes: the session stops."""
    rule = sampling.SamplingRule(3, 12, 0.05)
    slower = throughput.PairedRatio(0.90, 0.87, 0.93, 6, 0.90, 0)
    assert rule.decide(slower, 2) is None, "never before the minimum"
    assert "lies wholly outside 1 +/- 0.05" in (rule.decide(slower, 3) or "")
    undecided = throughput.PairedRatio(0.97, 0.93, 1.01, 6, 0.90, 0)
    assert rule.decide(undecided, 11) is None
    assert (rule.decide(undecided, 12) or "").startswith("the maximum of 12 passes was served")
    assert (rule.decide(None, 12) or "").endswith("the paired interval is none")


def test_a_session_that_stopped_elsewhere_than_the_rule_says_fails() -> None:
    """The recorded count is recomputed, never trusted: the rule would have stopped after pass 1."""
    starts = _starts()
    _with_sampling(starts, 1, 3, 0.5)
    verdict = reproduction(starts, _contract(speed_rule="equivalence", passes=1, max_passes=3, paired_tolerance=0.5))
    assert any(
        "the session served 3 passes; the contract's stopping rule, applied to the recorded passes, stops after 1" in r
        for r in verdict.reasons
    ), verdict.reasons


def test_a_session_that_stopped_where_the_rule_says_is_judged_on_its_passes() -> None:
    starts = _starts()
    _with_sampling(starts, 3, 3, 0.2)
    verdict = reproduction(starts, _contract(speed_rule="equivalence", passes=3, max_passes=3, paired_tolerance=0.2))
    assert verdict.passed, verdict.reasons
    assert verdict.observed["passes_served"] == 3
    assert verdict.observed["sampling_stopped"].startswith("after pass 3 the paired interval")


@pytest.mark.parametrize(
    ("sampled_contract", "recorded", "message"),
    [
        (True, None, "sampling is absent; the contract adds passes (2 to 3)"),
        (False, (2, 3, 0.2), "sampling is recorded (as recorded); the contract asks for a fixed 3 passes"),
        (True, (2, 4, 0.2), "sampling was 2 to 4 passes at tolerance 0.2; the contract asks for 2 to 3 at 0.2"),
    ],
)
def test_the_recorded_sampling_must_be_the_contracts(
    sampled_contract: bool, recorded: tuple[int, int, float] | None, message: str
) -> None:
    starts = _starts()
    if recorded is not None:
        _with_sampling(starts, *recorded)
    rule = {"speed_rule": "equivalence", "passes": 2, "max_passes": 3} if sampled_contract else {}
    verdict = reproduction(starts, _contract(paired_tolerance=0.2, **rule))
    assert not verdict.passed
    assert any(message in r for r in verdict.reasons), verdict.reasons


def test_a_sampling_record_round_trips_and_an_unset_one_keeps_the_digest(tmp_path: Path) -> None:
    start = _starts()[0]
    unchanged = start.body_digest()
    assert unchanged == start.digest, "the bundle's digest holds without a sampling record"
    _with_sampling([start], 3, 8, 0.05)
    assert start.body_digest() != unchanged
    evidence.write(start, tmp_path)
    again = evidence.read(tmp_path / evidence.FILENAME)
    assert again.schedule is not None and again.schedule.sampling == start.schedule.sampling  # type: ignore[union-attr]
