"""Gates judged per fresh start and per tensor-parallel rank, from the per-rank audits."""

from __future__ import annotations

import pytest

from pytest_b70lab import gates

pytestmark = pytest.mark.gates


@pytest.fixture
def start(b70_evidence, b70_start: int):
    return b70_evidence[b70_start - 1]


def test_target_scale_audit(start, b70_rank, b70_contract, b70_manifest, b70_verdict) -> None:
    calibrated = b70_manifest["target"]["kv_scales"] if b70_manifest else None
    b70_verdict(gates.target_scale_audit(start, b70_rank, b70_contract, calibrated))


def test_draft_cache_audit(start, b70_rank, b70_contract, b70_verdict) -> None:
    if b70_contract.speculative is None:
        pytest.skip("the contract has no draft")
    b70_verdict(gates.draft_cache_audit(start, b70_rank, b70_contract))


def test_engine_resolution(start, b70_rank, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.engine_resolution(start, b70_rank, b70_contract))


def test_compile_topology(start, b70_rank, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.compile_topology(start, b70_rank, b70_contract))


def test_launch_flags(start, b70_rank, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.launch_flags(start, b70_rank, b70_contract))
