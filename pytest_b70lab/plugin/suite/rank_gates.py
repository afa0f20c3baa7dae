"""Gates judged per fresh start and per tensor-parallel rank, from the per-rank audits. Each judges through the
catalogue (pytest_b70lab/catalogue.py: what it reads, when it applies), as the in-process judge does."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gates


@pytest.mark.b70_gate("target-scale-audit")
def test_target_scale_audit(b70_start_evidence, b70_rank, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, rank=b70_rank)


@pytest.mark.b70_gate("draft-cache-audit")
def test_draft_cache_audit(b70_start_evidence, b70_rank, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, rank=b70_rank)


@pytest.mark.b70_gate("engine-resolution")
def test_engine_resolution(b70_start_evidence, b70_rank, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, rank=b70_rank)


@pytest.mark.b70_gate("compile-topology")
def test_compile_topology(b70_start_evidence, b70_rank, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, rank=b70_rank)


@pytest.mark.b70_gate("launch-flags")
def test_launch_flags(b70_start_evidence, b70_rank, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, rank=b70_rank)
