"""The training-side DFlash draft (`mini/draft_model.py`) computes what vLLM's draft serves, on the same inputs.

One engine start on the mini: the reference target (fp32, `--kv-cache-dtype auto`, so nothing is FP8) with
the mini's draft, and the draft-capture plugin on (`B70LAB_CAPTURE_DRAFT`), which saves every drafting
step: the target's raw aux hidden states, their positions, the query block and the draft's logits. Per
request the test rebuilds the context the draft's KV cache holds at each step (the aux hidden state of
every earlier position, from the target pass that verified its token) and runs `forward_blocks` once over
all the request's anchors. Every expected value comes from the model folder or the engine, so a trained
draft in the folder is checked the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pytest_b70lab import mini
from pytest_b70lab.contract import schema as contract
from pytest_b70lab.engine import command
from pytest_b70lab.engine.client import served_model, stream_completion
from pytest_b70lab.in_engine.draft_capture import ENV_CAPTURE
from pytest_b70lab.mini.draft_model import DFlashDraft, target_aux_hidden

pytestmark = pytest.mark.engine

# Three of the gate prompts (code, code, tool call): with the trained draft most blocks are accepted for
# several tokens, so the context the test rebuilds grows by whole accepted runs, not one token a step.
PROMPTS = {p.id: p.prompt for p in contract.load_prompts(contract.load("mini-laguna-cpu"))[:3]}
TOKENS = 30
LOGIT_ATOL = 1e-4  # fp32 both sides: only summation order differs
AUX_RTOL = 1e-5  # transformers' target vs vLLM's, relative to the largest aux value


@dataclass
class RequestSteps:
    """One request's drafting steps, rebuilt into forward_blocks inputs."""

    prompt: str
    sequence: list[int]  # prompt + completion token ids
    steps: list[dict[str, torch.Tensor]]
    aux_hidden: torch.Tensor  # [T, n_aux * H]: what the draft cache holds for positions 0..T-1
    anchors: torch.Tensor  # [K]: the bonus token's position in each step
    bonus: torch.Tensor  # [K]: the token each step's block starts with, as the engine fed it

    # With accepted drafts the engine can verify past max_tokens and draft once more before the request
    # ends: the last anchors may lie beyond the returned sequence. Their tokens come from the capture.


def _draft_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "draft" / "config.json").read_text())


def _rebuild(prompt: str, sequence: list[int], steps: list[dict[str, torch.Tensor]]) -> RequestSteps:
    """Context rows at positions >= the step's anchor are rejected drafts (vLLM's padded drafter batch
    writes them, then the query block overwrites their slots); every other position is written once."""
    history: dict[int, torch.Tensor] = {}
    for step in steps:
        anchor = int(step["positions"][0])
        for pos, row in zip(step["context_positions"].tolist(), step["aux_hidden"], strict=False):
            if pos < anchor:
                assert pos not in history, f"position {pos} entered the draft's context twice"
                history[pos] = row
    length = max(history) + 1
    assert sorted(history) == list(range(length)), "the draft's context has holes"
    return RequestSteps(
        prompt,
        sequence,
        steps,
        torch.stack([history[p] for p in range(length)]),
        torch.tensor([int(s["positions"][0]) for s in steps]),
        torch.tensor([int(s["input_ids"][0]) for s in steps]),
    )


@pytest.fixture(scope="module")
def engine_capture(b70_engine, b70_mini_model: Path, tmp_path_factory) -> list[RequestSteps]:
    capture = tmp_path_factory.mktemp("draft-capture")
    manifest = mini.load_manifest(b70_mini_model)
    config = command.ServeConfig(
        model=b70_mini_model / manifest["reference"]["path"],
        dtype="float32",
        kv_cache_dtype="auto",
        draft=b70_mini_model / manifest["draft"]["path"],
        num_speculative_tokens=manifest["draft"]["num_speculative_tokens"],
        enforce_eager=True,
    )
    server = b70_engine(config, "draft-parity", {ENV_CAPTURE: str(capture)})
    try:
        with server.client() as client:
            model = served_model(client)
            completions = {
                name: stream_completion(client, model, prompt, TOKENS, prompt_id=name)
                for name, prompt in PROMPTS.items()
            }
    finally:
        report = server.stop()
    assert report.clean, f"engine processes left behind: {report.survivors()}"

    files = sorted(capture.glob("step-*.pt"), key=lambda p: (p.name.split("-")[1], int(p.stem.split("-")[2])))
    assert files, f"the engine recorded no drafting step (log: {server.log_dir / 'server.log'})"
    per_request: list[list[dict]] = []
    for path in files:  # one sequence at a time: each request opens with its prefill, context from 0
        step = torch.load(path, weights_only=True)
        if int(step["context_positions"][0]) == 0:
            per_request.append([])
        per_request[-1].append(step)
    assert len(per_request) == len(PROMPTS), [len(r) for r in per_request]
    rebuilt = []
    for (name, done), steps in zip(completions.items(), per_request, strict=False):
        assert len(done.token_ids) == TOKENS
        assert steps[0]["context_positions"].numel() == len(done.prompt_token_ids)
        rebuilt.append(_rebuild(name, done.prompt_token_ids + done.token_ids, steps))
    return rebuilt


@pytest.fixture(scope="module")
def draft(b70_mini_model: Path) -> DFlashDraft:
    manifest = mini.load_manifest(b70_mini_model)
    return DFlashDraft.from_folders(
        b70_mini_model / manifest["draft"]["path"], b70_mini_model / manifest["reference"]["path"]
    ).eval()


def test_query_block_is_bonus_then_masks_at_the_next_positions(engine_capture, b70_mini_model: Path) -> None:
    """What forward_blocks builds from (anchor, token): vLLM's block, read from the engine."""
    config = _draft_config(b70_mini_model)
    width, mask = config["block_size"], config["dflash_config"]["mask_token_id"]
    for request in engine_capture:
        for step, anchor in zip(request.steps, request.anchors.tolist(), strict=False):
            assert step["positions"].tolist() == list(range(anchor, anchor + width))
            assert step["input_ids"].tolist()[1:] == [mask] * (width - 1)
            if anchor < len(request.sequence):
                assert int(step["input_ids"][0]) == request.sequence[anchor], f"{request.prompt} anchor {anchor}"
            assert step["logits"].shape[0] == width - 1, "vLLM samples every block row but the bonus"


def test_training_forward_equals_the_engine_draft(engine_capture, draft: DFlashDraft, record_property) -> None:
    worst, agree, total = 0.0, 0, 0
    for request in engine_capture:
        with torch.no_grad():
            logits = draft.forward_blocks(request.aux_hidden[None], request.anchors[None], request.bonus[None])[0]
            context = draft.combine_hidden_states(request.aux_hidden)
        for k, step in enumerate(request.steps):
            valid = step["context_positions"] < request.anchors[k]
            torch.testing.assert_close(
                context[step["context_positions"][valid]],
                step["context_states"][valid],
                rtol=0,
                atol=LOGIT_ATOL,
                msg=f"{request.prompt} step {k}: context states",
            )
            got, want = logits[k, 1:], step["logits"]
            assert torch.isfinite(want).all(), f"{request.prompt} step {k}: the engine's draft logits are not finite"
            diff = float((got - want).abs().max())
            worst = max(worst, diff)
            same = got.argmax(-1) == want.argmax(-1)
            agree, total = agree + int(same.sum()), total + same.numel()
            assert diff <= LOGIT_ATOL and bool(same.all()), (
                f"{request.prompt} step {k} (anchor {int(request.anchors[k])}): max |logit diff| {diff:.3g}, "
                f"argmax differs at block rows {(~same).nonzero().flatten().add(1).tolist()}"
            )
    record_property("max_abs_logit_diff", worst)
    record_property("argmax_agreement", f"{agree}/{total}")
    # The trained draft is accepted for several tokens a step: the rebuilt context grows by whole runs.
    steps = sum(len(r.steps) for r in engine_capture)
    record_property(
        "tokens_per_drafting_step",
        round(sum(len(r.sequence) - len(r.steps[0]["context_positions"]) for r in engine_capture) / steps, 2),
    )


def test_target_aux_hidden_is_what_the_engine_hands_the_draft(
    engine_capture, draft: DFlashDraft, b70_mini_model: Path
) -> None:
    from transformers import LagunaForCausalLM

    manifest = mini.load_manifest(b70_mini_model)
    target = LagunaForCausalLM.from_pretrained(
        str(b70_mini_model / manifest["reference"]["path"]), dtype=torch.float32
    ).eval()
    for request in engine_capture:
        length = min(request.aux_hidden.shape[0], len(request.sequence))  # positions whose tokens were returned
        with torch.no_grad():
            aux, _ = target_aux_hidden(target, torch.tensor([request.sequence[:length]]), draft.target_layer_ids)
        scale = float(request.aux_hidden.abs().max())
        diff = float((aux[0] - request.aux_hidden[:length]).abs().max())
        assert diff <= AUX_RTOL * scale, f"{request.prompt}: max |aux diff| {diff:.3g} (largest value {scale:.3g})"
