"""expect.min_accepted_per_draft, judged by spec-counters from the server's own counters, on the recorded runs:
the INT4 lane's bundle (its draft distilled against the unquantized target, 0.89 accepted per draft) fails a
floor of 5 naming the start and the figure; the unquantized lane's bundle (6.27) passes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pytest_b70lab.contract.schema import Contract
from pytest_b70lab.evidence import metrics
from pytest_b70lab.evidence.record import Evidence
from pytest_b70lab.evidence.run_folder import read_starts
from pytest_b70lab.judge import engine_resolution

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "fixtures" / "evidence"


def recorded(name: str) -> tuple[list[Evidence], Contract]:
    starts = read_starts(BUNDLES / name)
    return starts, Contract.model_validate(starts[0].contract.canonical, strict=False)


def with_floor(contract: Contract, floor: float | None) -> Contract:
    data = contract.canonical()
    data["expect"] = {**data["expect"], "min_accepted_per_draft": floor}
    return Contract.model_validate(data, strict=False)


def counters_ratio(start: Evidence) -> float:
    """Accepted tokens per draft as the report reads them: per-position counters over drafts."""
    a = metrics.acceptance(start.metrics_before, start.metrics_after)
    assert isinstance(a, metrics.Acceptance), a
    return sum(a.accepted.values()) / a.drafts


def test_the_int4_bundle_fails_a_floor_of_five_naming_each_start_and_its_figure() -> None:
    starts, contract = recorded("mini-laguna-cpu-int4-v1-draft")
    assert contract.expect.min_accepted_per_draft is None
    judged = with_floor(contract, 5.0)
    for start in starts:
        assert engine_resolution.spec_counters(start, contract).passed, "no floor: the bundle passes as recorded"
        verdict = engine_resolution.spec_counters(start, judged)
        ratio = counters_ratio(start)
        assert ratio < 1.0
        assert not verdict.passed
        (reason,) = verdict.reasons
        assert f"start-{start.start_index}" in reason and f"{ratio:.3f}" in reason and "at least 5" in reason
        assert verdict.observed["accepted_per_draft"] == pytest.approx(ratio, abs=1e-4)


def test_the_unquantized_bundle_passes_a_floor_of_five_and_fails_one_above_its_figure() -> None:
    starts, contract = recorded("mini-laguna-cpu")
    for start in starts:
        ratio = counters_ratio(start)
        assert ratio > 5.0
        assert engine_resolution.spec_counters(start, with_floor(contract, 5.0)).passed
        above = engine_resolution.spec_counters(start, with_floor(contract, round(ratio + 0.01, 2)))
        assert not above.passed and f"{ratio:.3f}" in above.reasons[0]


def test_the_floor_is_left_out_of_the_digest_while_unset_and_out_of_the_teacher() -> None:
    _, contract = recorded("mini-laguna-cpu")
    assert "min_accepted_per_draft" not in contract.canonical()["expect"]
    assert with_floor(contract, None).digest == contract.digest
    floored = with_floor(contract, 5.0)
    assert floored.digest != contract.digest
    assert floored.canonical()["expect"]["min_accepted_per_draft"] == 5.0
    assert floored.teacher().digest == contract.teacher().digest


@pytest.mark.parametrize("floor", [12.0, -1.0])
def test_a_floor_a_draft_cannot_reach_or_below_zero_is_refused(floor: float) -> None:
    _, contract = recorded("mini-laguna-cpu")
    with pytest.raises(ValidationError, match="min_accepted_per_draft"):
        with_floor(contract, floor)


def test_a_floor_without_speculation_is_refused() -> None:
    _, contract = recorded("mini-laguna-cpu")
    data = contract.teacher().canonical()
    data["expect"] = {**data["expect"], "min_accepted_per_draft": 1.0}
    with pytest.raises(ValidationError, match="needs speculative decoding"):
        Contract.model_validate(data, strict=False)


def test_the_int4_lane_recorded_with_its_own_draft_passes_its_contracts_floor() -> None:
    """fixtures/evidence/mini-laguna-cpu-int4: the same lane with the draft distilled against the INT4 target."""
    starts, contract = recorded("mini-laguna-cpu-int4")
    assert contract.expect.min_accepted_per_draft == 6.0
    for start in starts:
        assert counters_ratio(start) > 6.0
        assert engine_resolution.spec_counters(start, contract).passed
