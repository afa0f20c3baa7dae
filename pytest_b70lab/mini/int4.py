"""W4A16 weights for the mini, in the production checkpoints' format: compressed-tensors `pack-quantized`.

Production serves `poolside/Laguna-S-2.1-INT4` and its DFlash draft as INT4 weight-only checkpoints: each
quantized linear's weight is stored as `weight_packed` (int32, eight signed 4-bit codes per word along the
input dimension), `weight_scale` (one scale per output row and group of input columns) and `weight_shape`
(the unpacked [out, in]); activations stay in floating point. This module writes the mini's target and draft
the same way, so that the load audit, the INT4 path and its teacher run on real packed tensors.

The numbers are compressed-tensors' symmetric min-max scheme (what its `minmax` observer and
`calculate_qparams` give for 4 bits): per group, scale = absmax / 7.5 stored in the weights' dtype,
code = clamp(round(w / scale), -8, 7). The packing is compressed-tensors' own `pack_to_int32`. The scheme is
computed here rather than through compressed-tensors' model-level `QuantizationModifier` because that needs
llm-compressor's calibration machinery for a model class the library does not know; the packed format is
the library's, and the tests read it back with its `unpack_from_int32` and with an independent unpack. What the
packed parts stand for is computed by the engine side's one definition, `in_engine.portable_int4.dequantize`.

Which linears are quantized (`ignore` as production's conventions have it): every Linear but the lm_head
and the MoE router (`mlp.gate`), which stay in the checkpoint's float dtype. The group size is 128 (the
production checkpoints' `quantization_config` is not known here; 128 is compressed-tensors' W4A16 preset),
except where a tensor-parallel shard of the input dimension is narrower than a group: vLLM needs whole
groups per rank, so those layers get the widest group that fits (their own config group, by name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NUM_BITS = 4
PACK_FACTOR = 32 // NUM_BITS  # codes per int32 word
CODE_MIN, CODE_MAX = -(2 ** (NUM_BITS - 1)), 2 ** (NUM_BITS - 1) - 1
SCALE_DIVISOR = (CODE_MAX - CODE_MIN) / 2  # 7.5: compressed-tensors' symmetric range for 4 bits
DEFAULT_GROUP_SIZE = 128
# Kept in float: the output head and the MoE router (its scores pick experts: a rounding there changes
# which weights run, not just their values). Embeddings are not Linear layers and are never quantized.
IGNORE = ("lm_head", "re:.*mlp\\.gate$")
PARTS = ("weight_packed", "weight_scale", "weight_shape")


class Int4Error(ValueError):
    """A tensor cannot be quantized as asked (its shape does not fit the groups or the packing)."""


@dataclass(frozen=True)
class Int4Scheme:
    """How one checkpoint was quantized: the group size per layer, and what stayed in float."""

    group_size: int
    overrides: Mapping[str, int]  # linear layer name -> its own group size (narrow tensor-parallel shards)
    ignore: tuple[str, ...] = IGNORE

    def group_for(self, layer: str) -> int:
        return self.overrides.get(layer, self.group_size)


def ignored(layer: str, ignore: tuple[str, ...] = IGNORE) -> bool:
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], layer):
                return True
        elif layer == pattern or layer.endswith("." + pattern):
            return True
    return False


def _codes_and_scales(
    weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4-bit codes [out, in] (int8) and group scales [out, in / group] of one weight."""
    import torch

    if weight.dim() != 2:
        raise Int4Error(f"expected a 2-D weight, got shape {list(weight.shape)}")
    out_features, in_features = weight.shape
    if in_features % group_size or in_features % PACK_FACTOR:
        raise Int4Error(
            f"input dimension {in_features} is not a multiple of the group size {group_size} and of {PACK_FACTOR}"
        )
    w = weight.detach().to(torch.float32).reshape(out_features, in_features // group_size, group_size)
    absmax = w.abs().amax(dim=-1)
    # A group of zeros keeps a finite, nonzero scale (its codes are all 0 whatever the scale).
    scale = torch.where(absmax > 0, absmax / SCALE_DIVISOR, torch.ones_like(absmax)).to(scale_dtype)
    codes = torch.round(w / scale.to(torch.float32).unsqueeze(-1)).clamp(CODE_MIN, CODE_MAX).to(torch.int8)
    return codes.reshape(out_features, in_features), scale.contiguous()


def quantize(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One [out, in] weight as compressed-tensors pack-quantized parts."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    codes, scale = _codes_and_scales(weight, group_size, scale_dtype)
    out_features, in_features = codes.shape
    return {
        "weight_packed": pack_to_int32(codes, NUM_BITS),
        "weight_scale": scale,
        "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int32),
    }


def fake_quantize(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype) -> torch.Tensor:
    """What `quantize`'s parts stand for, without packing them: code x group scale, in fp32 (exact: a 4-bit
    code times a bf16 scale needs at most 11 significant bits). The trainer's INT4 target is made of these."""
    import torch

    codes, scale = _codes_and_scales(weight, group_size, scale_dtype)
    group = codes.shape[1] // scale.shape[1]
    return codes.to(torch.float32) * scale.to(torch.float32).repeat_interleave(group, dim=1)


def quantized_linear(name: str, tensor: torch.Tensor, scheme: Int4Scheme) -> bool:
    """Whether a checkpoint tensor is a linear weight the scheme quantizes: a 2-D `<layer>.weight` whose layer is
    not ignored and is not an embedding or a norm."""
    layer = name.removesuffix(".weight")
    return (
        name.endswith(".weight")
        and tensor.dim() == 2
        and not re.search(r"(embed_tokens|norm)$", layer)
        and not ignored(layer, scheme.ignore)
    )


def quantize_state(
    tensors: Mapping[str, torch.Tensor], scheme: Int4Scheme
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A checkpoint's tensors with every quantizable linear weight (`quantized_linear`) replaced by its packed
    parts; returns the new tensors and the layers quantized."""
    out: dict[str, torch.Tensor] = {}
    quantized: list[str] = []
    for name, tensor in sorted(tensors.items()):
        layer = name.removesuffix(".weight")
        if quantized_linear(name, tensor, scheme):
            try:
                parts = quantize(tensor, scheme.group_for(layer), tensor.dtype)
            except Int4Error as e:
                raise Int4Error(f"{name}: {e}") from None
            out.update({f"{layer}.{part}": value for part, value in parts.items()})
            quantized.append(layer)
        else:
            out[name] = tensor
    return out, quantized


def quantization_config(scheme: Int4Scheme, kv_cache_scheme: Mapping[str, Any] | None) -> dict[str, Any]:
    """config.json's `quantization_config`, as compressed-tensors writes it for W4A16 pack-quantized."""

    def weights(group_size: int) -> dict[str, Any]:
        return {
            "num_bits": NUM_BITS,
            "type": "int",
            "symmetric": True,
            "strategy": "group",
            "group_size": group_size,
            "dynamic": False,
            "actorder": None,
            "block_structure": None,
            "observer": "minmax",
            "observer_kwargs": {},
        }

    groups: dict[str, Any] = {
        "group_0": {"targets": ["Linear"], "weights": weights(scheme.group_size), "input_activations": None}
    }
    for i, size in enumerate(sorted(set(scheme.overrides.values())), start=1):
        layers = sorted(layer for layer, s in scheme.overrides.items() if s == size)
        groups[f"group_{i}"] = {
            "targets": [f"re:^{re.escape(layer)}$" for layer in layers],
            "weights": weights(size),
            "input_activations": None,
        }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": list(scheme.ignore),
        "kv_cache_scheme": dict(kv_cache_scheme) if kv_cache_scheme else None,
        "global_compression_ratio": None,
    }


def scheme_for(
    tensors: Mapping[str, torch.Tensor],
    row_parallel: tuple[str, ...],
    tensor_parallel: int,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Int4Scheme:
    """The group size per layer: `group_size`, or for a row-parallel layer (its input dimension split over
    `tensor_parallel` ranks) whose shard is narrower, the largest power of two that divides the shard."""
    overrides: dict[str, int] = {}
    for name, tensor in tensors.items():
        layer = name.removesuffix(".weight")
        if not name.endswith(".weight") or tensor.dim() != 2 or not any(layer.endswith(r) for r in row_parallel):
            continue
        shard = tensor.shape[1] // tensor_parallel
        if shard % group_size:
            size = shard & -shard  # the largest power of two dividing the shard
            if size < PACK_FACTOR:
                raise Int4Error(f"{name}: a {shard}-column shard cannot hold whole INT4 groups")
            overrides[layer] = size
    return Int4Scheme(group_size=group_size, overrides=overrides)
