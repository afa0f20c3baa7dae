"""The evidence checks, per fresh start: it left complete evidence on disk, and nothing outlived or exposed it.

The promotion gates proper evaluate this evidence; these say it is all there: the start succeeded, every rank
answered the audit and has its own log, metrics were scraped before and after, every prompt produced the
contract's token count, teardown left no process behind, only its owner could reach the engine, and the
collective probe passed first. Each is a required subject of the verdict (`gates.EVIDENCE_CHECK_SCOPES`).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gates


@pytest.fixture
def start(b70_start_evidence):
    return b70_start_evidence


@pytest.mark.b70_gate("evidence-start")
def test_the_start_succeeded(start, b70_gate_check) -> None:
    b70_gate_check(start)


@pytest.mark.b70_gate("evidence-ranks")
def test_every_rank_was_audited_and_logged(start, b70_gate_check) -> None:
    b70_gate_check(start)  # a replayed bundle may carry the evidence without the logs: then only the evidence


@pytest.mark.b70_gate("evidence-metrics")
def test_metrics_were_scraped_before_and_after(start, b70_gate_check) -> None:
    b70_gate_check(start)


@pytest.mark.b70_gate("evidence-prompts")
def test_every_prompt_produced_the_contract_token_count(start, b70_gate_check) -> None:
    b70_gate_check(start)


@pytest.mark.b70_gate("evidence-teardown")
def test_teardown_left_no_process(start, b70_gate_check) -> None:
    b70_gate_check(start)


@pytest.mark.b70_gate("evidence-exposure")
def test_only_its_owner_could_reach_the_engine(start, b70_gate_check) -> None:
    b70_gate_check(start)


@pytest.mark.b70_gate("evidence-probe")
def test_the_collective_probe_passed_before_the_first_start(start, b70_gate_check) -> None:
    b70_gate_check(start)


@pytest.mark.b70_gate("evidence-logs")
def test_nothing_the_launcher_found_in_the_logs_is_ignored(start, b70_gate_check) -> None:
    b70_gate_check(start)
