"""Smoke gate: every fresh start of the contract left complete evidence on disk.

The promotion gates proper evaluate this evidence; this test only says it is all there: the start
succeeded, every rank answered the audit and has its own log, metrics were scraped before and after, every
prompt produced the contract's token count, and teardown left no process behind.
"""

from __future__ import annotations

import pytest

from pytest_b70lab import gates

pytestmark = pytest.mark.gates


@pytest.fixture
def start(b70_start_evidence):
    return b70_start_evidence


def test_the_start_succeeded(start, b70_run_dir) -> None:
    assert start.status == "ok", (f"start-{start.start_index} failed: {start.failure.message if start.failure else '?'}"
                                  f" (evidence: {b70_run_dir / f'start-{start.start_index}' / 'evidence.json'})")
    assert start.ready_s and start.ready_s > 0


def test_every_rank_was_audited_and_logged(start, b70_contract, b70_run_dir) -> None:
    tp = b70_contract.engine.tensor_parallel
    ranks = sorted(a.get("tp_rank") for a in start.audits)
    assert ranks == list(range(tp)), f"start-{start.start_index}: audits from TP ranks {ranks}, expected 0..{tp - 1}"
    folder = b70_run_dir / f"start-{start.start_index}"
    logged = {name.removeprefix("rank:") for name in start.logs if name.startswith("rank:")}
    want = {gates.rank_log_name(b70_contract, r).removeprefix("rank:") for r in range(tp)}
    assert want <= logged, f"start-{start.start_index}: per-rank logs {sorted(logged)}, missing {sorted(want - logged)}"
    if (folder / "ranks").is_dir():  # a replayed bundle may carry the evidence without the logs
        for name in want:
            assert (folder / "ranks" / f"{name}.log").stat().st_size > 0, f"empty log {folder / 'ranks' / name}"


def test_metrics_were_scraped_before_and_after(start) -> None:
    for when, text in (("before", start.metrics_before), ("after", start.metrics_after)):
        assert text and "vllm:cache_config_info" in text, f"start-{start.start_index}: no /metrics {when} the prompts"


def test_every_prompt_produced_the_contract_token_count(start, b70_contract) -> None:
    n = b70_contract.decode.tokens_per_request
    short = {r.prompt_id: len(r.token_ids) for r in start.requests if len(r.token_ids) != n}
    assert len(start.requests) == b70_contract.prompts.count
    assert not short, f"start-{start.start_index}: prompts without {n} tokens: {short}"


def test_teardown_left_no_process(start) -> None:
    assert start.teardown and start.teardown["processes"], "teardown saw no processes"
    survivors = [p for p in start.teardown["processes"] if not p["gone"]]
    assert not survivors, f"start-{start.start_index}: still running after teardown: {survivors}"


def test_only_its_owner_could_reach_the_engine(start) -> None:
    """The API (and vLLM's development endpoints) on the 0700 private socket only; the ranks' rendezvous and
    Gloo sockets on loopback only. Evidence without this record proves nothing and fails."""
    exposure = start.exposure
    assert exposure, f"start-{start.start_index}: the evidence does not record who could reach the engine"
    assert not exposure["problems"], f"start-{start.start_index}: " + "; ".join(exposure["problems"])
    exposed = [s for s in exposure["listening"] if not s["loopback"]]
    assert not exposed, f"start-{start.start_index}: listening beyond loopback: {exposed}"
    assert exposure["api"].startswith("unix ") and exposure["socket_dir_mode"] == "0o700", exposure


def test_the_collective_probe_passed_before_the_first_start(start, b70_contract) -> None:
    """The seed's rule: a run's engine starts only after a probe over all its ranks passed (or the evidence
    says that the session turned the probe off)."""
    probe = start.probe
    assert probe, f"start-{start.start_index}: the evidence does not record the preflight collective probe"
    if "skipped" in probe:
        return
    assert probe.get("passed") is True, f"start-{start.start_index}: the probe did not pass: {probe.get('problems')}"
    ranks = [r["rank"] for r in probe["ranks"] if r.get("correct") and "torn_down" in r.get("reached", [])]
    assert ranks == list(range(b70_contract.engine.tensor_parallel)), probe["ranks"]
