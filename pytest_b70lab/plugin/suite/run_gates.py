"""Gates judged per start from its metrics and checkpoint tables, and over all fresh starts together, through
the catalogue."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gates


@pytest.mark.b70_gate("metrics-agree")
def test_metrics_agree(b70_start_evidence, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence)


@pytest.mark.b70_gate("spec-counters")
def test_spec_counters(b70_start_evidence, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence)


@pytest.mark.b70_gate("load-audit")
def test_load_audit(b70_start_evidence, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence)


@pytest.mark.b70_gate("fresh-start-reproduction")
def test_fresh_start_reproduction(b70_gate_check) -> None:
    b70_gate_check()
