"""The training-side DFlash draft: its checkpoint is the served one, and its blocks see what vLLM's see.

CPU only and engine-free; `tests/engine/test_draft_parity.py` compares its logits with the real engine's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytest_b70lab import mini
from pytest_b70lab.mini.draft_model import IGNORE_INDEX, DFlashDraft, RMSNorm, draft_loss, target_aux_hidden

FP32_UNIT_ROUNDOFF = 2.0**-24


def _folders(model_dir: Path) -> tuple[Path, Path]:
    manifest = mini.load_manifest(model_dir)
    return model_dir / manifest["draft"]["path"], model_dir / manifest["reference"]["path"]


@pytest.fixture(scope="module")
def draft(b70_mini_model: Path) -> DFlashDraft:
    return DFlashDraft.from_folders(*_folders(b70_mini_model)).eval()


def _inputs(draft: DFlashDraft, length: int, anchors: list[list[int]], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    width = draft.fc.in_features
    aux = torch.randn(len(anchors), length, width, generator=gen) * 4
    tokens = torch.randint(0, draft.embed_weight.shape[0], (len(anchors), len(anchors[0])), generator=gen)
    return aux, torch.tensor(anchors), tokens


def test_draft_state_dict_round_trips_the_served_checkpoint(
    b70_mini_model: Path, draft: DFlashDraft, tmp_path: Path
) -> None:
    served = load_file(str(_folders(b70_mini_model)[0] / "model.safetensors"))
    mine = draft.draft_state_dict(dtype=next(iter(served.values())).dtype)
    assert sorted(mine) == sorted(served)
    for name, tensor in served.items():
        assert mine[name].shape == tensor.shape and mine[name].dtype == tensor.dtype, name
        assert torch.equal(mine[name], tensor), name
    draft.save_safetensors(tmp_path / "model.safetensors", dtype=next(iter(served.values())).dtype)
    again = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(again) == sorted(served) and all(torch.equal(again[n], served[n]) for n in served)
    assert not any("embed" in n or "lm_head" in n for n in mine), "embedding and lm_head are the target's"


def test_a_checkpoint_with_other_names_is_refused(b70_mini_model: Path, draft: DFlashDraft, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    served = load_file(str(_folders(b70_mini_model)[0] / "model.safetensors"))
    served["model.norm.weight"] = served.pop("norm.weight")
    save_file(served, str(tmp_path / "renamed.safetensors"))
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\], unexpected \\['model.norm.weight'\\]"):
        draft.load_state_dict_from_safetensors(tmp_path / "renamed.safetensors")


def test_config_drives_the_block(b70_mini_model: Path, draft: DFlashDraft) -> None:
    config = json.loads((_folders(b70_mini_model)[0] / "config.json").read_text())
    assert draft.block_size == config["block_size"]
    assert draft.mask_token_id == config["dflash_config"]["mask_token_id"]
    ids = draft.block_input_ids(torch.tensor([[7, 9]]))
    assert ids.tolist() == [
        [[7] + [draft.mask_token_id] * (draft.block_size - 1), [9] + [draft.mask_token_id] * (draft.block_size - 1)]
    ]


def test_a_block_sees_only_the_context_before_its_anchor(draft: DFlashDraft) -> None:
    aux, anchors, tokens = _inputs(draft, 20, [[5, 12]])
    with torch.no_grad():
        base = draft.forward_blocks(aux, anchors, tokens)
        later = aux.clone()
        later[:, 12:] += 3.0  # positions >= both anchors' contexts end: no block may change
        assert torch.equal(draft.forward_blocks(later, anchors, tokens), base)
        between = aux.clone()
        between[:, 8] += 3.0  # inside the second block's context, after the first block's anchor
        moved = draft.forward_blocks(between, anchors, tokens)
    assert torch.equal(moved[:, 0], base[:, 0])
    assert not torch.allclose(moved[:, 1], base[:, 1])


def reduction_path(draft: DFlashDraft, context_len: int) -> int:
    """The summed lengths of the fp32 reductions on a logit's way through forward_blocks (every linear layer's
    input width, every RMS norm's width, per layer the attention's head-dim dot product and its sum over the
    keys, the LM head): an upper bound on the reductions in any one path, parallel branches counted too."""
    linears = sum(m.in_features for m in draft.modules() if isinstance(m, torch.nn.Linear))
    norms = sum(m.weight.numel() for m in draft.modules() if isinstance(m, RMSNorm))
    attention = sum(2 * (layer.self_attn.head_dim + context_len + draft.block_size) for layer in draft.layers)
    return linears + norms + attention + draft.lm_head_weight.shape[1]


def test_blocks_and_sequences_are_independent_in_a_batch(draft: DFlashDraft) -> None:
    aux, anchors, tokens = _inputs(draft, 16, [[3, 9, 16], [1, 4, 10]])
    with torch.no_grad():
        batched = draft.forward_blocks(aux, anchors, tokens)
        # One batched pass and one pass per block compute the same fp32 numbers with matmuls of other shapes,
        # which a CPU's kernels may sum in another order (1.0014e-5 on an AVX2 machine and under
        # ATEN_CPU_CAPABILITY=avx2, 8.6e-6 at AVX-512 here: ~10 u of the largest logit). The bound holds for
        # any order, to first order: a reduction of n terms is off by at most n u relative (u = 2^-24), the RMS
        # norms keep each stage at unit scale so the stages' errors add, and the sum is taken relative to the
        # largest logit (about 7.5e3 u of it for the mini, 7.4e-3 absolute; letting a block's rows see a single
        # key of the next block moves every row's logits by 0.36 or more).
        atol = reduction_path(draft, aux.shape[1]) * FP32_UNIT_ROUNDOFF * float(batched.abs().max())
        for b in range(2):
            for k in range(3):
                single = draft.forward_blocks(
                    aux[b : b + 1], anchors[b : b + 1, k : k + 1], tokens[b : b + 1, k : k + 1]
                )
                torch.testing.assert_close(batched[b, k], single[0, 0], rtol=0, atol=atol)


def test_training_step_under_bf16_autocast(b70_mini_model: Path) -> None:
    draft = DFlashDraft.from_folders(*_folders(b70_mini_model)).train()
    aux, anchors, tokens = _inputs(draft, 24, [[2, 10, 20]])
    sequence = torch.randint(0, draft.embed_weight.shape[0], (1, 24), generator=torch.Generator().manual_seed(1))
    labels = draft.block_labels(sequence, anchors)
    assert (labels[..., 0] == IGNORE_INDEX).all() and (labels[0, 2, 4:] == IGNORE_INDEX).all()
    assert labels[0, 1, 1:].tolist() == sequence[0, 11:22].tolist()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = draft.forward_blocks(aux, anchors, tokens)
        loss = draft_loss(logits, labels)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in draft.parameters())
    assert not draft.embed_weight.requires_grad and not draft.lm_head_weight.requires_grad
    with torch.no_grad():
        exact = draft.forward_blocks(aux, anchors, tokens)
    assert (logits.float().argmax(-1) == exact.argmax(-1)).float().mean() > 0.9


def test_target_aux_hidden_is_the_residual_stream_after_each_target_layer(
    b70_mini_model: Path, draft: DFlashDraft
) -> None:
    """Layer i's output is transformers' hidden_states[i + 1], except for the last layer: transformers
    reports that one final-normed, vLLM captures it before the norm."""
    from transformers import LagunaForCausalLM

    target = LagunaForCausalLM.from_pretrained(str(_folders(b70_mini_model)[1]), dtype=torch.float32).eval()
    ids = torch.tensor([[0, 5, 17, 33, 80, 120, 7]])
    with torch.no_grad():
        aux, logits = target_aux_hidden(target, ids, draft.target_layer_ids)
        out = target(input_ids=ids, output_hidden_states=True)
    slices = aux.unflatten(-1, (len(draft.target_layer_ids), -1)).unbind(-2)
    last = len(target.model.layers) - 1
    assert torch.equal(logits, out.logits)
    for layer, got in zip(draft.target_layer_ids, slices, strict=False):
        if layer == last:
            torch.testing.assert_close(target.model.norm(got), out.hidden_states[-1])
        else:
            assert torch.equal(got, out.hidden_states[layer + 1])
