"""The plain-PyTorch reference of the page-32 FP8 KV-cache components: E4M3 encoding in both cache-write
roundings, the call's shape (Batch), the interface every implementation meets (KernelImpl), and attention
computed from the dequantised cache."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from ..in_engine import portable_fp8

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
Rounding = Literal["rne", "rtz"]
ENTRY_POINT_GROUP = "b70lab.kernels"


# --- E4M3 encoding -----------------------------------------------------------------------------------


def e4m3_codes(x: torch.Tensor, scale: float, rounding: Rounding) -> torch.Tensor:
    """uint8 E4M3 codes, saturated at +-448, in one of the two cache-write conventions:

    - "rne": x / scale rounded to nearest even (torch's float8 cast; the GPU kernels' convention);
    - "rtz": vLLM's CPU write, toward zero of x * fp32(1 / scale), with its subnormal and signed-zero
      behaviour (notes/2026-11-30-cpu-fp8-cache-write-truncates.md). Its one home is the portable FP8 path
      (in_engine.portable_fp8), which writes vLLM's cache with it; the lane holds both to the oracle and to the
      native bytes."""
    if rounding == "rtz":
        return portable_fp8.e4m3_codes_toward_zero(x, scale)
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(torch.uint8)


def e4m3_values(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(E4M3).float()


def rounding_probe_inputs() -> torch.Tensor:
    """Values that tell the two roundings apart (and saturation): RNE gives 1.125, 1.125, 3.75, 448, 448,
    -1.125; toward zero gives 1.0, 1.0, 3.5, 448, 448, -1.0 (at scale 1)."""
    return torch.tensor([1.07, 1.10, 3.70, 460.0, 1000.0, -1.10])


# --- the paged cache and the implementations ---------------------------------------------------------


@dataclass
class Batch:
    """One call: per-sequence context lengths and query counts, and everything derived from them. A causal
    call's query rows see the context and the rows before them (decode, speculative verification); a
    non-causal call's rows see the whole sequence, their own block included (the DFlash draft's attention)."""

    ctx_lens: list[int]
    q_lens: list[int]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    seed: int = 0
    causal: bool = True
    keys: list[torch.Tensor] = field(default_factory=list)  # per sequence [S, KVH, D]
    values: list[torch.Tensor] = field(default_factory=list)
    query: torch.Tensor | None = None  # [sum q, H, D]
    block_table: torch.Tensor | None = None
    num_blocks: int = 0

    @property
    def queries(self) -> torch.Tensor:
        if self.query is None:
            raise RuntimeError("Batch.build() makes the query rows: call it first")
        return self.query

    @property
    def table(self) -> torch.Tensor:
        if self.block_table is None:
            raise RuntimeError("Batch.build() makes the block table: call it first")
        return self.block_table

    @property
    def seq_lens(self) -> list[int]:
        return [c + q for c, q in zip(self.ctx_lens, self.q_lens, strict=False)]

    def build(self) -> Batch:
        gen = torch.Generator().manual_seed(self.seed)
        kvh, d = self.num_kv_heads, self.head_dim
        self.keys = [(torch.randn(s, kvh, d, generator=gen) * 1.5).to(self.dtype) for s in self.seq_lens]
        self.values = [(torch.randn(s, kvh, d, generator=gen) * 2.0).to(self.dtype) for s in self.seq_lens]
        self.query = torch.randn(sum(self.q_lens), self.num_heads, d, generator=gen).to(self.dtype)
        pages = [max(1, math.ceil(s / self.block_size)) for s in self.seq_lens]
        self.num_blocks = sum(pages) + 3
        perm = torch.randperm(self.num_blocks, generator=gen)  # scattered physical pages
        self.block_table = torch.zeros(len(pages), max(pages), dtype=torch.int32)
        at = 0
        for r, n in enumerate(pages):
            self.block_table[r, :n] = perm[at : at + n].to(torch.int32)
            at += n
        return self

    def slot_mapping(self) -> torch.Tensor:
        slots = []
        for r, s in enumerate(self.seq_lens):
            pos = torch.arange(s)
            slots.append(self.table[r, pos // self.block_size].long() * self.block_size + pos % self.block_size)
        return torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)

    def calibrated_scales(self) -> tuple[float, float]:
        """Static scalar scales: absmax / 448 over everything written (what calibration produces)."""
        k = max(float(t.float().abs().max()) for t in self.keys)
        v = max(float(t.float().abs().max()) for t in self.values)
        return k / E4M3_MAX, v / E4M3_MAX


class KernelImpl(Protocol):
    name: str
    rounding: Rounding
    # fraction of cache codes allowed one step off the declared rounding (arithmetic order of x / scale)
    write_code_slack: float
    layout: str
    claims_q12_exact: bool
    dtypes: tuple[torch.dtype, ...]
    # serves batch.causal False (the DFlash draft's attention); an implementation without the attribute does
    # not, and its non-causal tests skip (see serves_non_causal)
    non_causal: bool

    def write(self, batch: Batch, k_scale: float, v_scale: float) -> object: ...

    def read_back(self, cache: object, batch: Batch, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 codes [S, KVH, D] of sequence `seq`'s K and V, as stored."""
        ...

    def attention(self, cache: object, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        """Causal or not as batch.causal says."""
        ...


def serves_non_causal(impl) -> bool:
    return bool(getattr(impl, "non_causal", False))


def attention_reference(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    ctx_lens: list[int],
    q_lens: list[int],
    num_kv_heads: int,
    causal: bool = True,
) -> torch.Tensor:
    """Plain attention in fp32, one query row at a time (so a row of a 12-query call is, by construction,
    the 1-query call at the same context): causal inside the query block, full over the context; or, not
    causal, every row over the whole sequence."""
    heads, dim = query.shape[1], query.shape[2]
    group = heads // num_kv_heads
    scale = dim**-0.5
    out, at = [], 0
    for r, (ctx, ql) in enumerate(zip(ctx_lens, q_lens, strict=False)):
        k = keys[r].float().repeat_interleave(group, dim=1)
        v = values[r].float().repeat_interleave(group, dim=1)
        for i in range(ql):
            visible = ctx + i + 1 if causal else ctx + ql
            q = query[at + i].float()  # [H, D]
            logits = torch.einsum("hd,khd->hk", q, k[:visible]) * scale
            out.append(torch.einsum("hk,khd->hd", logits.softmax(-1), v[:visible]))
        at += ql
    return torch.stack(out) if out else torch.zeros(0, heads, dim)


@dataclass
class ReferenceImpl:
    """Plain PyTorch. Cache: K and V pages [num_blocks, KVH, block, D] of uint8 E4M3 codes."""

    rounding: Rounding = "rne"
    name: str = "reference-rne"
    write_code_slack: float = 0.0
    layout: str = "K and V pages [block, D] per (page, kv head)"
    claims_q12_exact: bool = True
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    non_causal: bool = True

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        shape = (batch.num_blocks, batch.num_kv_heads, batch.block_size, batch.head_dim)
        k_cache = torch.zeros(shape, dtype=torch.uint8)
        v_cache = torch.zeros(shape, dtype=torch.uint8)
        slots = batch.slot_mapping()
        if len(slots):
            keys, values = torch.cat(batch.keys), torch.cat(batch.values)
            page, off = slots // batch.block_size, slots % batch.block_size
            k_cache[page, :, off] = e4m3_codes(keys, k_scale, self.rounding)
            v_cache[page, :, off] = e4m3_codes(values, v_scale, self.rounding)
        return k_cache, v_cache

    def read_back(self, cache, batch: Batch, seq: int):
        k_cache, v_cache = cache
        pos = torch.arange(batch.seq_lens[seq])
        page = batch.table[seq, pos // batch.block_size].long()
        off = pos % batch.block_size
        return k_cache[page, :, off], v_cache[page, :, off]

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        keys, values = [], []
        for r in range(len(batch.seq_lens)):
            k, v = self.read_back(cache, batch, r)
            keys.append(e4m3_values(k) * k_scale)
            values.append(e4m3_values(v) * v_scale)
        return attention_reference(
            batch.queries, keys, values, batch.ctx_lens, batch.q_lens, batch.num_kv_heads, batch.causal
        )


def cumsum(xs: list[int]) -> list[int]:
    total, out = 0, []
    for x in xs:
        total += x
        out.append(total)
    return out
