"""The interleaved reproduction schedule's pure parts: the contract fields, the balanced order, the estimator
that one hiccup cannot move, and what memory two starts alive together need."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.engine import capability
from pytest_b70lab.engine.interleave import order
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import throughput


def _with_reproduction(**fields) -> contract.Contract:
    data = contract.load("mini-laguna-cpu").canonical()
    data["reproduction"] = {**data["reproduction"], **fields}
    return contract.Contract.model_validate(data, strict=False)


def test_the_defaults_stay_out_of_the_canonical_form() -> None:
    """A contract written before the schedule existed keeps its digest: sequential and one pass are left out."""
    plain = _with_reproduction(schedule="sequential", passes=1)
    assert "schedule" not in plain.canonical()["reproduction"] and "passes" not in plain.canonical()["reproduction"]
    interleaved = _with_reproduction(schedule="interleaved", passes=3)
    assert interleaved.canonical()["reproduction"]["schedule"] == "interleaved"
    assert interleaved.digest != plain.digest and interleaved.output_digest == plain.output_digest
    assert (plain.reproduction.alive_together, interleaved.reproduction.alive_together) == (1, 2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"schedule": "interleaved", "fresh_starts": 3}, 'schedule "interleaved" alternates two starts'),
        ({"schedule": "sequential", "passes": 2}, "repeated passes belong to the interleaved schedule"),
        ({"schedule": "duet"}, "reproduction.schedule"),
        ({"passes": 0}, "reproduction.passes"),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_naming_it(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        _with_reproduction(**fields)


def test_a_teacher_is_recorded_one_start_at_a_time() -> None:
    teacher = _with_reproduction(schedule="interleaved", passes=3).teacher()
    assert teacher.reproduction.schedule == "sequential" and teacher.reproduction.passes == 1


def test_each_start_goes_first_equally_often() -> None:
    for prompts in (5, 6):
        firsts = [order(p, k)[0] for p in (1, 2) for k in range(prompts)]
        assert firsts.count(0) == firsts.count(1)
        assert all(sorted(order(p, k)) == [0, 1] for p in (1, 2, 3) for k in range(prompts))


def test_one_pass_gives_the_paired_figure() -> None:
    a = {"p1": 100.0, "p2": 50.0, "p3": 80.0}
    b = {"p1": 110.0, "p2": 52.0, "p3": 70.0}
    once = throughput.interleaved_ratio({k: [(a[k], b[k])] for k in a})
    assert once == throughput.paired_ratio(a, b)


def test_one_hiccup_does_not_move_the_figure() -> None:
    """Three passes of six prompts, B 5 % slower throughout; one of B's requests runs at a third of its speed.
    The median over passes keeps the figure at 0.95; a mean over the passes would not."""
    rates = {f"p{i}": 60.0 + 30 * i for i in range(6)}
    pairs = {k: [(r, 0.95 * r)] * 3 for k, r in rates.items()}
    pairs["p2"] = [(rates["p2"], 0.95 * rates["p2"] / 3), *pairs["p2"][1:]]
    figure = throughput.interleaved_ratio(pairs)
    assert figure is not None and figure.ratio == pytest.approx(0.95)
    mean_of_passes = math.exp(sum(sum(math.log(b / a) for a, b in v) / len(v) for v in pairs.values()) / len(pairs))
    assert mean_of_passes < 0.92


def test_no_usable_pair_is_no_figure() -> None:
    assert throughput.interleaved_ratio({}) is None
    assert throughput.interleaved_ratio({"p": [(0.0, 1.0)]}) is None
    with pytest.raises(ValueError, match="confidence"):
        throughput.interleaved_ratio({"p": [(1.0, 1.0)]}, confidence=1.0)


def test_two_starts_alive_together_need_twice_the_memory_and_shm() -> None:
    one = _with_reproduction(schedule="sequential", passes=1)
    two = _with_reproduction(schedule="interleaved", passes=2)
    assert capability.ram_need(two) == 2 * capability.ram_need(one)
    assert capability.shm_need(two) == 2 * capability.shm_need(one)
    roomy = capability.Machine.observe("cpu")
    tight = replace(roomy, available_memory=capability.ram_need(one) + capability.GIB, shm_free=None)
    problems = [str(p) for p in capability.preflight(two, {}, machine=tight) if p.check == "memory"]
    assert problems and "2 starts alive together (reproduction.schedule interleaved)" in problems[0]
    assert 'reproduction.schedule = "sequential"' in problems[0]
    assert not [p for p in capability.preflight(one, {}, machine=tight) if p.check == "memory"]


def _measured(seconds: float, other_cpu_s: float | None, outside_cpu_s: float | None = None) -> evidence.Measurement:
    return evidence.Measurement(
        pass_index=1,
        prompt_id="p",
        attempt=1,
        sequence=0,
        started_at=10.0,
        ended_at=10.0 + seconds,
        quiet_wait_s=0.5,
        other_start=2,
        other_cpu_s=other_cpu_s,
        outside_cpu_s=outside_cpu_s,
        kept_in="requests",
        index=0,
    )


def test_a_measurement_is_contaminated_by_what_was_measured_not_by_a_flag() -> None:
    def m(cpu: float | None, seconds: float) -> evidence.Measurement:
        return _measured(seconds, cpu)

    assert not m(0.02, 0.7).contaminated and m(0.06, 0.7).contaminated
    assert not m(0.2, 5.0).contaminated and m(0.3, 5.0).contaminated  # 5 % of a 5 s request is 0.25 CPU-s
    assert m(None, 0.7).contaminated  # unread is never clean


def test_load_outside_both_starts_contaminates_under_the_host_rule_only() -> None:
    def m(outside: float | None, seconds: float) -> evidence.Measurement:
        return _measured(seconds, 0.01, outside)

    ruled = evidence.Schedule.new(3)
    assert ruled.host_rule and not ruled.rule_differences()
    assert ruled.contamination(m(0.09, 0.5)) is None
    why = ruled.contamination(m(0.4, 0.5))
    assert why is not None and "outside both starts used 0.4 CPU-s" in why and "limit 0.100" in why
    assert ruled.contamination(m(0.5, 4.0)) is None  # 15 % of a 4 s request is 0.6 CPU-s
    assert "could not be read" in (ruled.contamination(m(None, 0.5)) or "")
    # A schedule measured before the host rule existed (which measured nothing outside) is judged by the rule it
    # was measured under; one that measured outside load without the rule is refused on read (below).
    before = ruled.model_copy(update={name: None for name in evidence.HOST_RULE_FIELDS})
    assert not before.host_rule and not before.rule_differences()
    assert before.contamination(m(None, 0.5)) is None
    # One field of the rule left without the others is not a schedule from before it.
    partial = ruled.model_copy(update={"outside_fraction": None})
    assert partial.rule_differences() == ["schedule.outside_fraction is None, the quiet rule is 0.15"]


# --- the schedule as evidence: refused on read where it does not add up ------------------------------------


def _stripped(record: evidence.Evidence, measurements_too: bool) -> evidence.Evidence:
    assert record.schedule is not None
    update = {name: None for name in evidence.HOST_RULE_FIELDS}
    schedule = record.schedule.model_copy(update=update)
    if measurements_too:
        schedule.measurements = [m.model_copy(update={"outside_cpu_s": None}) for m in schedule.measurements]
    return record.model_copy(update={"schedule": schedule})


def test_a_schedule_stripped_of_the_host_rule_is_refused(tmp_path: Path) -> None:
    """Taking the rule's three fields out would let any outside load pass: with the measurements' outside_cpu_s
    kept, any version is refused; with those taken out too, a version-3 file is refused (the version says the
    rule is recorded). Unsigned, a downgrade to version 2 cannot be told from a real old file."""
    record = evidence.read(BUNDLE / "start-1")
    assert record.version == 2 and record.schedule is not None and record.schedule.host_rule
    for version, measurements_too, refused in [
        (2, False, "record outside_cpu_s, but the schedule records no host rule to judge it by: stripped"),
        (3, False, "version 3 evidence records the host rule, and its schedule has none of quiet_outside_cpu_s"),
        (3, True, "version 3 evidence records the host rule, and its schedule has none of quiet_outside_cpu_s"),
    ]:
        edited = _stripped(record, measurements_too).model_copy(update={"version": version})
        evidence.write(edited, tmp_path / f"v{version}-{measurements_too}")
        with pytest.raises(evidence.EvidenceError, match=refused.replace("(", r"\(").replace(")", r"\)")):
            evidence.read(tmp_path / f"v{version}-{measurements_too}")
    evidence.write(_stripped(record, True), tmp_path / "old")  # as a version-2 file from before the rule reads
    assert not evidence.read(tmp_path / "old").schedule.host_rule


def test_a_live_session_writes_the_version_that_records_the_host_rule() -> None:
    assert evidence.VERSION == evidence.HOST_RULE_VERSION and evidence.Schedule.new(3).host_rule


BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "evidence" / "mini-laguna-cpu"


def _written(tmp_path: Path, edit: Callable[[evidence.Evidence], None]) -> Path:
    """Start-2 of the bundle, edited, then written with a digest that matches the edit (a consistent forgery:
    only the schedule's own arithmetic can catch it)."""
    record = evidence.read(BUNDLE / "start-2")
    edit(record)
    return evidence.write(record, tmp_path / "start-2")


def _first(record: evidence.Evidence, **where) -> evidence.Measurement:
    return next(m for m in record.schedule.measurements if all(getattr(m, k) == v for k, v in where.items()))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: setattr(_first(r, pass_index=2), "index", 999), "points at repeats[999], which does not exist"),
        (lambda r: setattr(_first(r, pass_index=2), "prompt_id", "json-2"), "a request for"),
        (lambda r: setattr(_first(r, pass_index=1), "kept_in", "repeats"), "points at repeats["),
        (lambda r: r.schedule.measurements.pop(), "was timed by no measurement"),
        (lambda r: setattr(_first(r, pass_index=3), "ended_at", 0.0), "not after it started"),
        (lambda r: setattr(r.schedule, "quiet_cpu_s", 1.0), "schedule.quiet_cpu_s is 1.0, the quiet rule is 0.02"),
        (lambda r: setattr(_first(r, pass_index=2), "attempt", 3), "has attempts [3] (1.. at most 4)"),
        (lambda r: setattr(r, "schedule", None), "repeats without a schedule"),
        (lambda r: setattr(r, "version", 1), "version 1 evidence carries a schedule"),
    ],
)
def test_a_schedule_that_does_not_add_up_is_refused_naming_it(tmp_path: Path, edit, message: str) -> None:
    path = _written(tmp_path, edit)
    with pytest.raises(evidence.EvidenceError) as e:
        evidence.read(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_the_recorded_schedule_adds_up() -> None:
    """Every (pass, prompt) measured at both starts, each start's requests its pass-1 ones, and the two starts
    alternating in one sequence on one clock."""
    starts = [evidence.read(BUNDLE / f"start-{i}") for i in (1, 2)]
    passes = starts[0].contract.canonical["reproduction"]["passes"]
    prompts = [r.prompt_id for r in starts[0].requests]
    for s in starts:
        assert set(s.counted()) == {(n, p) for n in range(1, passes + 1) for p in prompts}
    sequence = sorted(
        (m.sequence, s.start_index, m.started_at, m.ended_at) for s in starts for m in s.schedule.measurements
    )
    assert [n for n, *_ in sequence] == list(range(len(sequence)))
    assert all(a[3] <= b[2] for a, b in zip(sequence, sequence[1:], strict=False)), "requests overlapped in time"


SEQUENTIAL_V1 = BUNDLE.parent / "mini-laguna-cpu-v1-sequential"


def test_version_1_evidence_still_reads_and_is_judged_sequentially() -> None:
    """The embedded default's bundle as recorded before the schedule existed (version 1, its two starts one after
    the other, under the contract of then): it reads, and gate 7 judges it as it did, one request per prompt."""
    from pytest_b70lab.evidence.run_folder import read_starts
    from pytest_b70lab.judge import reproduction

    starts = read_starts(SEQUENTIAL_V1)
    assert [(s.version, s.schedule, s.repeats) for s in starts] == [(1, None, [])] * 2
    recorded = contract.Contract.model_validate(starts[0].contract.canonical, strict=False)
    assert recorded.reproduction.schedule == "sequential"
    verdict = reproduction.reproduction(starts, recorded)
    assert verdict.passed, verdict.reasons
    paired = throughput.paired_ratio(*(throughput.arrival_rates(s.requests)[0] for s in starts))
    assert paired is not None and verdict.observed["paired_ratio_start2"] == round(paired.ratio, 4)
    # The same starts judged under today's interleaved contract: no schedule in the evidence, named.
    today = reproduction.reproduction(starts, contract.load("mini-laguna-cpu"))
    assert not today.passed and any("evidence.schedule is absent" in r for r in today.reasons), today.reasons
