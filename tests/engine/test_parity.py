"""vLLM on the mini target equals transformers token for token: the model, the router and its bias are right.

Both sides run fp32 weights and an fp32 KV cache at TP1 (the reference checkpoint has no KV scheme, so
`--kv-cache-dtype auto` keeps fp32). A second start without the router-bias fix shows that defect on a
real engine: the bias is silently left at zero and the output changes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytest_b70lab.engine import command
from pytest_b70lab.engine.client import audit, served_model, stream_completion
from pytest_b70lab.in_engine import fixes

pytestmark = pytest.mark.engine

PROMPTS = {
    "code": "def fibonacci(n):",
    "prose": "The quick brown fox",
    "gates": "Promotion gates check that",
    "class": "import json\nclass Model(object):",
}
TOKENS = 48
LAYER = re.compile(r"layers\.(\d+)\.")


@pytest.fixture(scope="module")
def transformers_greedy(b70_mini_model: Path) -> dict[str, dict[str, list[int]]]:
    from transformers import AutoTokenizer, LagunaForCausalLM

    ref = b70_mini_model / "reference"
    tok = AutoTokenizer.from_pretrained(str(ref), local_files_only=True)
    model = LagunaForCausalLM.from_pretrained(str(ref), dtype=torch.float32).eval()
    out = {}
    for name, prompt in PROMPTS.items():
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            seq = model.generate(
                ids,
                max_new_tokens=TOKENS,
                min_new_tokens=TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=tok.pad_token_id,
            )
        out[name] = {"prompt": ids[0].tolist(), "tokens": seq[0, ids.shape[1] :].tolist()}
    return out


def _serve_reference(b70_engine, model_dir: Path, name: str, env_extra=None, enforce_eager=False):
    config = command.ServeConfig(
        model=model_dir / "reference", dtype="float32", kv_cache_dtype="auto", enforce_eager=enforce_eager
    )
    server = b70_engine(config, name, env_extra)
    try:
        with server.client() as client:
            model = served_model(client)
            audits = audit(client)
            completions = {
                name: stream_completion(client, model, prompt, TOKENS, prompt_id=name)
                for name, prompt in PROMPTS.items()
            }
    finally:
        report = server.stop()
    assert report.clean, f"engine processes left behind: {report.survivors()}"
    return {"audits": audits, "completions": completions, "log": server.log_dir / "server.log"}


@pytest.fixture(scope="module")
def vllm_greedy(b70_engine, b70_mini_model: Path):
    return _serve_reference(b70_engine, b70_mini_model, "parity-tp1-fp32")


@pytest.fixture(scope="module")
def vllm_without_bias_fix(b70_engine, b70_mini_model: Path):
    others = ",".join(n for n in fixes.FIX_NAMES if n != "moe_router_bias_load")
    return _serve_reference(
        b70_engine, b70_mini_model, "parity-no-bias-fix", {fixes.ENV_SELECT: others}, enforce_eager=True
    )


def checkpoint_router_bias(model_dir: Path) -> dict[int, list[float]]:
    tensors = load_file(str(model_dir / "reference" / "model.safetensors"))
    return {
        int(LAYER.search(k).group(1)): v.float().tolist()
        for k, v in tensors.items()
        if k.endswith("e_score_correction_bias")
    }


def engine_router_bias(audit: dict) -> dict[int, list[float]]:
    return {int(LAYER.search(k).group(1)): v for k, v in audit["router_bias"].items()}


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_vllm_greedy_equals_transformers(prompt: str, transformers_greedy, vllm_greedy) -> None:
    want = transformers_greedy[prompt]
    got = vllm_greedy["completions"][prompt]
    assert got.prompt_token_ids == want["prompt"], "both sides must see the same prompt tokens"
    assert len(got.token_ids) == TOKENS
    first = next((i for i, (a, b) in enumerate(zip(got.token_ids, want["tokens"], strict=False)) if a != b), None)
    assert first is None, (
        f"prompt {prompt!r}: vLLM and transformers diverge at token {first}: "
        f"vLLM {got.token_ids[first : first + 5]} vs transformers "
        f"{want['tokens'][first : first + 5]} (log: {vllm_greedy['log']})"
    )


def test_engine_loaded_the_router_bias(b70_mini_model: Path, vllm_greedy) -> None:
    want = checkpoint_router_bias(b70_mini_model)
    (audit,) = vllm_greedy["audits"]
    assert engine_router_bias(audit) == want


def test_without_the_fix_the_router_bias_is_silently_zero(
    b70_mini_model: Path, transformers_greedy, vllm_without_bias_fix
) -> None:
    want = checkpoint_router_bias(b70_mini_model)
    (audit,) = vllm_without_bias_fix["audits"]
    got = engine_router_bias(audit)
    assert sorted(got) == sorted(want)
    assert all(any(v != 0 for v in values) for values in want.values())
    assert all(all(v == 0 for v in values) for values in got.values()), (
        "vLLM 0.32 drops the checkpoint's router bias; if it now loads it, retire the moe_router_bias_load fix"
    )
    log = vllm_without_bias_fix["log"].read_text()
    assert "moe_router_bias_load disabled" in log
    assert "e_score_correction_bias" not in log, "the loader said nothing about the dropped tensor"
    diverged = [
        p for p in PROMPTS if vllm_without_bias_fix["completions"][p].token_ids != transformers_greedy[p]["tokens"]
    ]
    assert diverged, "with the bias at zero the output should differ from transformers on some prompt"
