"""The embedded default serves: TP2 + EP2, FP8 KV at page 32, DFlash at 11 speculative tokens.

A smoke gate until the contract-driven gates exist: every rank is audited (calibrated target scales,
unit-scale FP8 draft cache layers, the CPU attention backend), completions come back with the requested
token count and a cold cache, and teardown leaves no process behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_b70lab import engine_client, launch, mini

pytestmark = [pytest.mark.gates, pytest.mark.engine]

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "Promotion gates check that"]
TOKENS = 32


@pytest.fixture(scope="module")
def served(b70_engine, b70_mini_model: Path):
    manifest = mini.load_manifest(b70_mini_model)
    config = launch.ServeConfig(model=b70_mini_model / "target", draft=b70_mini_model / "draft",
                                num_speculative_tokens=manifest["draft"]["num_speculative_tokens"],
                                tensor_parallel=2, expert_parallel=True)
    server = b70_engine(config, "embedded-tp2ep2-dflash")
    try:
        with server.client() as client:
            model = engine_client.served_model(client)
            audits = engine_client.audit(client)
            completions = [engine_client.stream_completion(client, model, p, TOKENS, prompt_id=str(i))
                           for i, p in enumerate(PROMPTS)]
    finally:
        teardown = server.stop()
    return {"manifest": manifest, "audits": audits, "completions": completions, "teardown": teardown,
            "log_dir": server.log_dir}


def test_both_ranks_answer_the_audit(served) -> None:
    ranks = sorted((a["tp_rank"], a["ep_rank"]) for a in served["audits"])
    assert ranks == [(0, 0), (1, 1)], f"expected TP/EP ranks (0,0),(1,1); audits came from {ranks}"
    for a in served["audits"]:
        assert a["tp_size"] == 2 and a["ep_size"] == 2
        assert a["speculative_config"]["method"] == "dflash"
        assert a["speculative_config"]["num_speculative_tokens"] == 11


def test_target_layers_hold_the_calibrated_fp8_scales(served) -> None:
    want = served["manifest"]["target"]["kv_scales"]
    for a in served["audits"]:
        for name, scales in want.items():
            layer = a["attention_layers"][name]
            where = f"rank TP{a['tp_rank']} {name}"
            assert layer["kv_cache_dtype"] == "fp8", f"{where}: KV dtype {layer['kv_cache_dtype']}"
            assert (layer["k_scale"], layer["v_scale"]) == (scales["k_scale"], scales["v_scale"]), \
                f"{where}: engine scales {(layer['k_scale'], layer['v_scale'])} != calibrated {scales}"
            assert layer["kv_tensor"]["dtype"] == "uint8", f"{where}: KV tensor {layer['kv_tensor']}"


def test_draft_cache_layers_are_fp8_at_unit_scale(served) -> None:
    for a in served["audits"]:
        for name in served["manifest"]["draft"]["cache_layers"]:
            layer = a["attention_layers"][name]
            assert layer["kv_cache_dtype"] == "fp8"
            assert (layer["k_scale"], layer["v_scale"]) == (1.0, 1.0), f"rank TP{a['tp_rank']} {name}: {layer}"


def test_every_layer_runs_the_cpu_attention_backend(served) -> None:
    for a in served["audits"]:
        backends = {name: layer["backend"] for name, layer in a["attention_layers"].items()}
        assert set(backends.values()) == {"CPU_ATTN"}, f"rank TP{a['tp_rank']}: {backends}"


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_completions_are_complete_and_cold(served, index: int) -> None:
    c = served["completions"][index]
    assert len(c.token_ids) == TOKENS, f"prompt {index}: {len(c.token_ids)} token IDs for max_tokens={TOKENS}"
    assert c.usage["completion_tokens"] == TOKENS
    assert c.cached_tokens == 0, f"prompt {index}: {c.cached_tokens} cached tokens with prefix caching off"
    assert sum(c.chunk_tokens) == TOKENS


def test_teardown_left_no_process(served) -> None:
    report = served["teardown"]
    assert report.processes, "teardown saw no processes at all"
    assert report.clean, f"still running after teardown: {report.survivors()} (logs: {served['log_dir']})"
