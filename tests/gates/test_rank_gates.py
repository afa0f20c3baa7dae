"""Gates judged per fresh start and per tensor-parallel rank, from the per-rank audits."""

from __future__ import annotations

import pytest

from pytest_b70lab import gates

pytestmark = pytest.mark.gates


def _calibrated(checkpoints: dict) -> dict | None:
    return (checkpoints.get("target") or {}).get("kv_scales")


@pytest.mark.b70_gate("target-scale-audit")
def test_target_scale_audit(b70_start_evidence, b70_rank, b70_contract, b70_checkpoints, b70_verdict) -> None:
    if "target-scale-audit" not in gates.applicable_gates(b70_contract):
        pytest.skip("the unquantized-KV reference has no calibrated KV scales")
    b70_verdict(gates.target_scale_audit(b70_start_evidence, b70_rank, b70_contract, _calibrated(b70_checkpoints)))


@pytest.mark.b70_gate("draft-cache-audit")
def test_draft_cache_audit(b70_start_evidence, b70_rank, b70_contract, b70_verdict) -> None:
    if b70_contract.speculative is None:
        pytest.skip("the contract has no draft")
    b70_verdict(gates.draft_cache_audit(b70_start_evidence, b70_rank, b70_contract))


@pytest.mark.b70_gate("engine-resolution")
def test_engine_resolution(b70_start_evidence, b70_rank, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.engine_resolution(b70_start_evidence, b70_rank, b70_contract))


@pytest.mark.b70_gate("compile-topology")
def test_compile_topology(b70_start_evidence, b70_rank, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.compile_topology(b70_start_evidence, b70_rank, b70_contract))


@pytest.mark.b70_gate("launch-flags")
def test_launch_flags(b70_start_evidence, b70_rank, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.launch_flags(b70_start_evidence, b70_rank, b70_contract))
