"""Gates judged per start from its metrics, and over all fresh starts together."""

from __future__ import annotations

import pytest

from pytest_b70lab import gates

pytestmark = pytest.mark.gates


@pytest.mark.b70_gate("metrics-agree")
def test_metrics_agree(b70_start_evidence, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.metrics_agree(b70_start_evidence, b70_contract))


@pytest.mark.b70_gate("spec-counters")
def test_spec_counters(b70_start_evidence, b70_contract, b70_verdict) -> None:
    if b70_contract.speculative is None:
        pytest.skip("the contract has no speculative decoding")
    b70_verdict(gates.spec_counters(b70_start_evidence, b70_contract))


@pytest.mark.b70_gate("load-audit")
def test_load_audit(b70_start_evidence, b70_contract, b70_checkpoints, b70_verdict) -> None:
    b70_verdict(
        gates.load_audit(
            b70_start_evidence,
            b70_contract,
            b70_checkpoints.get("target"),
            b70_checkpoints.get("draft"),
            b70_checkpoints.get("problems"),
        )
    )


@pytest.mark.b70_gate("fresh-start-reproduction")
def test_fresh_start_reproduction(b70_evidence, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.reproduction(b70_evidence, b70_contract))
