"""Gates judged per start from its metrics, and over all fresh starts together."""

from __future__ import annotations

import pytest

from pytest_b70lab import gates

pytestmark = pytest.mark.gates


@pytest.fixture
def start(b70_evidence, b70_start: int):
    return b70_evidence[b70_start - 1]


def test_metrics_agree(start, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.metrics_agree(start, b70_contract))


def test_spec_counters(start, b70_contract, b70_verdict) -> None:
    if b70_contract.speculative is None:
        pytest.skip("the contract has no speculative decoding")
    b70_verdict(gates.spec_counters(start, b70_contract))


def test_load_audit(start, b70_manifest, b70_verdict) -> None:
    b70_verdict(gates.load_audit(start, b70_manifest["target"]["tensors"] if b70_manifest else None,
                                 b70_manifest["draft"]["tensors"] if b70_manifest else None))


def test_fresh_start_reproduction(b70_evidence, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.reproduction(b70_evidence, b70_contract))
