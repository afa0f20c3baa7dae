"""Training-side DFlash Laguna draft: the forward vLLM's `DFlashLagunaForCausalLM` serves, in plain PyTorch.

Mirrors vllm/model_executor/models/laguna_dflash.py (+ qwen3_dflash.py, laguna.py, v1/spec_decode/dflash.py)
of vllm 0.32, so that weights trained here and saved with `save_safetensors` are what the engine drafts with.
What vLLM computes, per drafting step of one request whose next (bonus) token sits at position `a`:

* aux hidden states: the target's residual stream AFTER decoder layer `i` (output + residual, before any
  norm) for each `i` in `dflash_config.target_layer_ids`, ascending, concatenated on the feature axis
  (`get_eagle3_aux_layers_from_config` turns id `i` into aux layer `i + 1`, which
  `LagunaModel._maybe_add_hidden_state` captures as `hidden_states + residual` after layer index `i`).
  transformers' `hidden_states[i + 1]` is the same tensor, except for the last layer: transformers reports
  `hidden_states[-1]` final-normed, hence the hooks in `target_aux_hidden`.
* context states (`combine_hidden_states`): RMSNorm each aux slice with `aux_hidden_norms[j]`, concat, `fc`,
  then `hidden_norm`.
* context K/V (`precompute_and_store_context_kv` / `_project_context_kv`): for every draft layer, that
  layer's `input_layernorm` on the SAME context states (they do not flow through the layers), the K/V rows
  of its `qkv_proj`, `k_norm` on K, RoPE at the context positions. The cache holds them for positions
  0..a-1: every earlier position, each from the target pass that verified its token.
* query block (`copy_and_expand_dflash_inputs_kernel`): [bonus token, mask x (block_size - 1)] at positions
  a..a+block_size-1; the mask is `dflash_config.mask_token_id` embedded with the target's `embed_tokens`
  (the Laguna draft loads no separate mask embedding).
* attention: each block query sees the context keys 0..a-1 and every key of its own block; non-causal
  unless the config says causal (`_dflash_layer_causal`), then causal within the block.
* layers: LagunaDecoderLayer (pre-norm, q/k RMSNorm per head, partial neox RoPE, per-head softplus output
  gate, SiLU MLP); final `norm`; the target's `lm_head`. vLLM samples block rows 1.. (the mask rows) by
  argmax; row 0 (the bonus token) is computed but not sampled.

The target's embedding and lm_head are shared and frozen: buffers, not parameters, and not in
`draft_state_dict()`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's RMSNorm: statistics in fp32, cast back, then scale (`ir.ops.rms_norm`)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(dtype) * weight.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight, self.eps)


def _rope_dims(config: dict[str, Any], head_dim: int, layer_type: str) -> tuple[int, float]:
    """(rotary_dim, theta) the way `LagunaAttention` resolves them for `get_rope`."""
    rope = config.get("rope_parameters") or {}
    if any(isinstance(v, dict) for v in rope.values()):  # nested per-layer-type form
        rope = rope.get(layer_type) or rope.get("full_attention") or {}
    if config.get("partial_rotary_factor") is not None and "partial_rotary_factor" not in rope:
        rope = {**rope, "partial_rotary_factor": config["partial_rotary_factor"]}
    if rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"draft rope_type {rope['rope_type']!r}: only 'default' is mirrored")
    rotary_dim = rope.get("rope_dim") or int(head_dim * rope.get("partial_rotary_factor", 1.0))
    return int(rotary_dim), float(rope.get("rope_theta", 10000))


def _apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of the first `2 * len(inv_freq)` channels of x [..., S, heads, hd] at positions
    [..., S]; the cos/sin table as `RotaryEmbedding._compute_cos_sin_cache` builds it (fp32)."""
    rot = 2 * inv_freq.numel()
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [..., S, rot/2]
    cos = freqs.cos().unsqueeze(-2).to(x.dtype)  # broadcast over heads
    sin = freqs.sin().unsqueeze(-2).to(x.dtype)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x_pass), dim=-1)


class DraftAttention(nn.Module):
    """LagunaAttention with DFlash's split: K/V of the context come from `context_kv`."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        gating: Any,
        rotary_dim: int,
        theta: float,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False)
        # LagunaAttention: gating True / "per-head" -> one softplus gate per head; "per-element" -> per channel
        self.gate_per_head = gating is True or gating == "per-head"
        self.g_proj = nn.Linear(hidden, heads if self.gate_per_head else self.q_size, bias=False) if gating else None
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.register_buffer(
            "inv_freq",
            1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)),
            persistent=False,
        )

    def context_kv(self, normed_ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`DFlashLagunaModel._project_context_kv` + `_normalize_context_k` + RoPE for one layer:
        the K/V rows of qkv_proj (no Q), k_norm, RoPE. normed_ctx [B, T, H] -> K, V [B, T, kv_heads, hd]."""
        kv = F.linear(normed_ctx, self.qkv_proj.weight[self.q_size :])
        k, v = kv.unflatten(-1, (2, self.kv_heads, self.head_dim)).unbind(-3)
        k = _apply_rope(self.k_norm(k), positions, self.inv_freq)
        return k, v

    def forward(
        self, h: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """h [B, Q, H] block rows; ctx_k/ctx_v [B, T, kv, hd]; mask [B, 1, Q, T + Q] (True: attend)."""
        q, k, v = self.qkv_proj(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _apply_rope(self.q_norm(q.unflatten(-1, (self.heads, self.head_dim))), positions, self.inv_freq)
        k = _apply_rope(self.k_norm(k.unflatten(-1, (self.kv_heads, self.head_dim))), positions, self.inv_freq)
        v = v.unflatten(-1, (self.kv_heads, self.head_dim))
        keys = torch.cat((ctx_k, k.to(ctx_k.dtype)), dim=1).transpose(1, 2)  # [B, kv, T + Q, hd]
        values = torch.cat((ctx_v, v.to(ctx_v.dtype)), dim=1).transpose(1, 2)
        rep = self.heads // self.kv_heads  # query head i reads kv head i // rep, as vLLM's GQA does
        keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        query = q.transpose(1, 2)
        out = F.scaled_dot_product_attention(query, keys.to(query.dtype), values.to(query.dtype), attn_mask=mask)
        out = out.transpose(1, 2).flatten(-2)  # [B, Q, heads * hd]
        if self.g_proj is not None:  # LagunaAttention.forward: softplus in fp32, then the attention's dtype
            gate = F.softplus(self.g_proj(h).float()).to(out.dtype)
            if self.gate_per_head:
                out = (out.unflatten(-1, (self.heads, self.head_dim)) * gate.unsqueeze(-1)).flatten(-2)
            else:
                out = out * gate
        return self.o_proj(out)


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, config: dict[str, Any], index: int) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config["rms_norm_eps"]
        per_layer = config.get("num_attention_heads_per_layer")
        heads = per_layer[index] if per_layer else config["num_attention_heads"]
        head_dim = config.get("head_dim") or hidden // heads
        layer_type = (config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"])[index]
        rotary_dim, theta = _rope_dims(config, head_dim, layer_type)
        self.self_attn = DraftAttention(
            hidden, heads, config["num_key_value_heads"], head_dim, eps, config.get("gating"), rotary_dim, theta
        )
        self.mlp = DraftMLP(hidden, config["intermediate_size"])
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)


def _layer_causal(config: dict[str, Any]) -> bool:
    """`qwen3_dflash._dflash_layer_causal` for a uniform-full-attention draft (the only kind Laguna takes)."""
    if config.get("is_causal") is not None:
        return bool(config["is_causal"])
    override = (config.get("dflash_config") or {}).get("causal")
    return bool(override) if override is not None else False


class DFlashDraft(nn.Module):
    """The DFlash Laguna draft of one draft folder, fed by a target's embedding and lm_head (not owned)."""

    def __init__(self, config: dict[str, Any], embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        dflash = config.get("dflash_config") or {}
        self.target_layer_ids: tuple[int, ...] = tuple(sorted(set(dflash["target_layer_ids"])))
        self.mask_token_id = int(dflash["mask_token_id"])
        self.block_size = int(config["block_size"])
        self.eps = float(config["rms_norm_eps"])
        hidden = config["hidden_size"]
        layer_types = set(config.get("layer_types") or ["full_attention"])
        if layer_types != {"full_attention"} or (dflash.get("use_swa")):
            raise NotImplementedError(f"draft layer_types {sorted(layer_types)}: only full attention is mirrored")
        self.causal = _layer_causal(config)
        target_hidden = embed_weight.shape[1]
        if lm_head_weight.shape[1] != hidden or target_hidden != hidden:
            raise ValueError(
                f"target hidden {target_hidden} / lm_head {tuple(lm_head_weight.shape)} do not fit "
                f"a draft of hidden size {hidden}"
            )
        if config.get("draft_vocab_size", lm_head_weight.shape[0]) != lm_head_weight.shape[0]:
            raise ValueError("Laguna DFlash shares the target lm_head: draft_vocab_size must equal its rows")
        n_aux = len(self.target_layer_ids)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config["num_hidden_layers"]))
        self.aux_hidden_norms = nn.ModuleList(RMSNorm(target_hidden, self.eps) for _ in range(n_aux))
        self.fc = nn.Linear(target_hidden * n_aux, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, self.eps)
        self.norm = RMSNorm(hidden, self.eps)
        # Shared with the target, frozen; non-persistent so they stay out of the draft's checkpoint.
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach().clone(), persistent=False)

    # --- construction and weights -------------------------------------------------------------------

    @classmethod
    def from_folders(
        cls,
        draft_dir: Path | str,
        target_dir: Path | str,
        *,
        load_weights: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> DFlashDraft:
        """A draft from its served folder, with `model.embed_tokens` and `lm_head` read from the target's."""
        from safetensors import safe_open

        draft_dir, target_dir = Path(draft_dir), Path(target_dir)
        config = json.loads((draft_dir / "config.json").read_text())
        shared = {}
        for path in sorted(target_dir.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for name in ("model.embed_tokens.weight", "lm_head.weight"):
                    if name in f.keys():
                        shared[name] = f.get_tensor(name).to(dtype)
        if len(shared) != 2:
            missing = sorted({"model.embed_tokens.weight", "lm_head.weight"} - set(shared))
            raise ValueError(f"{target_dir}: no {missing} in its safetensors")
        model = cls(config, shared["model.embed_tokens.weight"], shared["lm_head.weight"]).to(dtype)
        if load_weights:
            model.load_state_dict_from_safetensors(draft_dir / "model.safetensors")
        return model

    def draft_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The draft's own tensors under the names vLLM's DFlashLagunaForCausalLM.load_weights reads (no
        `model.` prefix, fused qkv_proj, no embed_tokens / lm_head)."""
        return {
            name: (t.detach().to(dtype) if dtype is not None else t.detach()).contiguous()
            for name, t in self.state_dict().items()
        }

    def load_state_dict_from_safetensors(self, path: Path | str) -> None:
        """Load a served draft's model.safetensors; every name must match, both ways, shape for shape."""
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        own = self.state_dict()
        missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
        wrong = sorted(n for n in set(own) & set(tensors) if own[n].shape != tensors[n].shape)
        if missing or extra or wrong:
            raise ValueError(f"{path}: missing {missing}, unexpected {extra}, shape mismatch {wrong}")
        with torch.no_grad():
            for name, t in own.items():
                t.copy_(tensors[name].to(t.dtype))

    def save_safetensors(self, path: Path | str, dtype: torch.dtype = torch.bfloat16) -> None:
        """Write the served draft's model.safetensors (bf16 by default, as the mini's is)."""
        from safetensors.torch import save_file

        save_file(dict(sorted(self.draft_state_dict(dtype).items())), str(path), metadata={"format": "pt"})

    # --- forward ------------------------------------------------------------------------------------

    def combine_hidden_states(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """`DFlashLagunaForCausalLM.combine_hidden_states`: norm each aux slice, concat, fc, hidden_norm."""
        slices = aux_hidden.unflatten(-1, (len(self.aux_hidden_norms), -1))
        normed = torch.stack([norm(slices[..., j, :]) for j, norm in enumerate(self.aux_hidden_norms)], dim=-2)
        return self.hidden_norm(self.fc(normed.flatten(-2)))

    def block_input_ids(self, block_tokens: torch.Tensor) -> torch.Tensor:
        """[..., K] bonus tokens -> [..., K, block_size]: [bonus, mask, mask, ...] (the dflash input kernel)."""
        ids = torch.full(
            (*block_tokens.shape, self.block_size), self.mask_token_id, dtype=torch.long, device=block_tokens.device
        )
        ids[..., 0] = block_tokens
        return ids

    def attention_mask(self, anchors: torch.Tensor, num_context: int) -> torch.Tensor:
        """[B, 1, K*bs, T + K*bs]: block k's rows see context positions < anchors[k] and their own block
        (all of it, or its causal part when the draft is causal)."""
        B, K = anchors.shape
        bs, dev = self.block_size, anchors.device
        ctx = torch.arange(num_context, device=dev)
        to_ctx = (ctx.view(1, 1, 1, -1) < anchors.view(B, K, 1, 1)).expand(B, K, bs, num_context)
        block = torch.arange(K, device=dev)
        within = torch.ones(bs, bs, dtype=torch.bool, device=dev)
        if self.causal:
            within = within.tril()
        to_block = (block.view(K, 1, 1, 1) == block.view(1, 1, K, 1)) & within.view(1, bs, 1, bs)
        to_block = to_block.reshape(1, K, bs, K * bs).expand(B, K, bs, K * bs)
        return torch.cat((to_ctx, to_block), dim=-1).reshape(B, 1, K * bs, num_context + K * bs)

    def forward_blocks(
        self,
        aux_hidden: torch.Tensor,
        anchors: torch.Tensor,
        block_tokens: torch.Tensor,
        context_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draft logits [B, K, block_size, V] for K blocks per sequence, all in one pass.

        aux_hidden [B, T, n_aux * H]: the target's raw aux hidden states at positions 0..T-1 (layout of
        `target_aux_hidden`). anchors [B, K]: position a of each block's bonus token, 1 <= a <= T; the block
        sits at a..a+block_size-1 and sees the context of positions < a. block_tokens [B, K]: the token at a.
        context_positions [B, T] (default 0..T-1): RoPE positions of the context rows.
        """
        B, T, _ = aux_hidden.shape
        K, bs = anchors.shape[1], self.block_size
        dev = aux_hidden.device
        anchors = anchors.to(dev).long()
        if context_positions is None:
            context_positions = torch.arange(T, device=dev).expand(B, T)
        ctx = self.combine_hidden_states(aux_hidden)  # [B, T, H]
        positions = (anchors.unsqueeze(-1) + torch.arange(bs, device=dev)).reshape(B, K * bs)
        ids = self.block_input_ids(block_tokens.to(dev).long()).reshape(B, K * bs)
        h = F.embedding(ids, self.embed_weight)
        mask = self.attention_mask(anchors, T)
        residual = None
        for layer in self.layers:
            attn = layer.self_attn
            # _project_context_kv: this layer's input_layernorm on the shared context states
            ctx_k, ctx_v = attn.context_kv(layer.input_layernorm(ctx), context_positions)
            # LagunaDecoderLayer.forward: pre-norm with the residual stream carried between layers
            residual = h if residual is None else h + residual
            h = attn(layer.input_layernorm(residual), positions, ctx_k, ctx_v, mask)
            residual = h + residual
            h = layer.mlp(layer.post_attention_layernorm(residual))
        h = self.norm(h + residual)
        logits = F.linear(h, self.lm_head_weight.to(h.dtype))
        return logits.reshape(B, K, bs, -1)

    # --- training helpers ---------------------------------------------------------------------------

    def block_labels(self, input_ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """[B, K, block_size] labels: the sequence's token at a+i (i >= 1), IGNORE_INDEX past its end and
        at i = 0 (the bonus token is given, not drafted)."""
        B, T = input_ids.shape
        pos = anchors.long().unsqueeze(-1) + torch.arange(self.block_size, device=anchors.device)
        labels = input_ids.gather(1, pos.clamp(max=T - 1).reshape(B, -1)).reshape(pos.shape).clone()
        labels[pos >= T] = IGNORE_INDEX
        labels[..., 0] = IGNORE_INDEX
        return labels

    def target_aux_hidden(
        self, target_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return target_aux_hidden(target_model, input_ids, self.target_layer_ids, attention_mask)


def draft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over block rows 1..block_size-1 (the rows vLLM samples); IGNORE_INDEX skipped."""
    return F.cross_entropy(
        logits[..., 1:, :].float().flatten(0, -2), labels[..., 1:].flatten(), ignore_index=IGNORE_INDEX
    )


def target_aux_hidden(
    target_model: nn.Module,
    input_ids: torch.Tensor,
    target_layer_ids: Sequence[int],
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux_hidden [B, T, n_aux * H], logits [B, T, V]) of a transformers LagunaForCausalLM: the residual
    stream after each decoder layer in `target_layer_ids`, ascending, concatenated as vLLM's target hands it
    to the drafter. Hooks read the layer outputs because transformers' `hidden_states[-1]` is the
    final-normed state, not the last layer's output that vLLM captures."""
    layers = target_model.model.layers
    ids = sorted(set(target_layer_ids))
    captured: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def keep(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return keep

    handles = [layers[i].register_forward_hook(hook(i)) for i in ids]
    try:
        out = target_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.cat([captured[i] for i in ids], dim=-1), out.logits
