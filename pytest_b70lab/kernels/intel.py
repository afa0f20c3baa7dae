"""Kernel adapters for Intel's ops behind the B70 path: vLLM's XPU ops (vllm-xpu-kernels) and IPEX's PagedAttention.

Each adapter is a `kernels.KernelImpl` written against its library's published API; `kernels.discover()`
decides whether it is here (kernels/discovery.py). Nothing is imported at module level: an adapter's library
is imported when its adapter is made.

- vllm-xpu-kernels, the ops vLLM's FLASH_ATTN backend calls on XPU (vllm/v1/attention/backends/fa_utils.py):
  the cache write `torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, key_cache, value_cache,
  slot_mapping, kv_cache_dtype, k_scale, v_scale)` with scalar tensor scales, registered by importing
  `vllm_xpu_kernels._C`, into K and V pages of [num_blocks, block_size, kv_heads, head_dim]; and
  `vllm_xpu_kernels.flash_attn_interface.flash_attn_varlen_func` over the paged cache (block_table,
  seqused_k, causal, k_descale/v_descale as views of one scalar).
- intel-extension-for-pytorch, `ipex.llm.modules.PagedAttention`: `reshape_and_cache` into K and V pages of
  [num_blocks, kv_heads, block_size, head_dim] (the layout its CPU op indexes; measured here), then
  `single_query_cached_kv_attention` for a batch of decodes and `flash_attn_varlen_func` otherwise.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from .reference import E4M3, Batch, Rounding, cumsum


def _paged_codes(cache: torch.Tensor, batch: Batch, seq: int, heads_first: bool) -> torch.Tensor:
    """uint8 codes [S, KVH, D] of one sequence from pages [blocks, block, KVH, D] (or [blocks, KVH, block, D])."""
    codes = cache.view(torch.uint8).cpu()
    pos = torch.arange(batch.seq_lens[seq])
    page = batch.table[seq, pos // batch.block_size].long()
    off = pos % batch.block_size
    return codes[page, :, off] if heads_first else codes[page, off]


def _empty_caches(shape: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed E4M3 key cache and value cache of one layer, in the kernel's own page layout `shape`."""
    key_cache = torch.zeros(shape, dtype=E4M3, device=device)
    return key_cache, torch.zeros_like(key_cache)


def _batch_on(batch: Batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's keys and values (every sequence's tokens, in order) and their cache slots, on `device`."""
    return torch.cat(batch.keys).to(device), torch.cat(batch.values).to(device), batch.slot_mapping().to(device)


class VllmXpuImpl:
    """vLLM's XPU ops on one B70 card. Declarations are read from the source, not yet measured on the card:
    the write computes x / scale in fp32 and casts with c10's Float8_e4m3fn conversion (round to nearest
    even; vllm-xpu-kernels csrc/quantization/fp8/quant_utils.h CopyWithScaleOp), which has no clamp: a
    quotient of 480 or more becomes NaN rather than 448. q12 rows are not claimed equal to q1: a uniform
    causal block of up to 16 queries runs as per-position decodes, a lone query through the general path."""

    name = "vllm-xpu"
    rounding: Rounding = "rne"
    write_code_slack = 0.0
    layout = "K and V pages [block, KVH, D] per page (flash layout)"
    claims_q12_exact = False
    dtypes = (torch.bfloat16,)
    non_causal = False  # not claimed: the DFlash draft's causal=False call is unread in its source

    def __init__(self) -> None:
        import vllm_xpu_kernels._C  # noqa: F401  (registers torch.ops._C_cache_ops on XPU)
        from vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func

        self.reshape_and_cache_flash = torch.ops._C_cache_ops.reshape_and_cache_flash
        self.flash_attn_varlen_func = flash_attn_varlen_func
        self.device = torch.device("xpu")

    def _scalar(self, x: float) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.float32, device=self.device)

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        key_cache, value_cache = _empty_caches(
            (batch.num_blocks, batch.block_size, batch.num_kv_heads, batch.head_dim), self.device
        )
        keys, values, slots = _batch_on(batch, self.device)
        if len(slots):
            self.reshape_and_cache_flash(
                keys, values, key_cache, value_cache, slots, "fp8", self._scalar(k_scale), self._scalar(v_scale)
            )
        return key_cache, value_cache

    def read_back(self, cache, batch: Batch, seq: int):
        return _paged_codes(cache[0], batch, seq, False), _paged_codes(cache[1], batch, seq, False)

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        key_cache, value_cache = cache
        descale = (len(batch.q_lens), batch.num_kv_heads)
        query = batch.queries.to(self.device)
        out = torch.empty_like(query)
        with _refusing_reference_fallback():
            out = self.flash_attn_varlen_func(  # fills `out` and returns it
                q=query,
                k=key_cache,
                v=value_cache,
                out=out,
                max_seqlen_q=max(batch.q_lens),
                cu_seqlens_q=torch.tensor([0, *cumsum(batch.q_lens)], dtype=torch.int32, device=self.device),
                max_seqlen_k=max(batch.seq_lens),
                seqused_k=torch.tensor(batch.seq_lens, dtype=torch.int32, device=self.device),
                softmax_scale=batch.head_dim**-0.5,
                causal=True,
                block_table=batch.table.to(self.device),
                k_descale=self._scalar(k_scale).expand(descale),
                v_descale=self._scalar(v_scale).expand(descale),
            )
        return out.float().cpu()


@contextmanager
def _refusing_reference_fallback():
    """vllm-xpu-kernels answers a shape it has no compiled kernel for with its PyTorch reference and a warning
    (flash_attn_interface: "falling back to PyTorch reference attention"): a test would then measure the
    reference, not the kernel. Turn that warning into an error."""
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "falling back" in record.getMessage():
                seen.append(record.getMessage().splitlines()[0])

    logger = logging.getLogger("vllm_xpu_kernels")
    handler = Catch(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if seen:
        raise RuntimeError(f"vllm-xpu-kernels has no compiled kernel for this shape and ran its reference: {seen[0]}")


class IpexPagedImpl:
    """intel-extension-for-pytorch's PagedAttention, on the XPU where there is one, else on the CPU."""

    rounding: Rounding = "rne"  # unmeasured: the CPU build refuses an E4M3 cache (see probe_e4m3)
    write_code_slack = 0.0
    layout = "K and V pages [KVH, block, D] per page"
    claims_q12_exact = False  # decode batches and query blocks run through different ops
    non_causal = False

    def __init__(self) -> None:
        import intel_extension_for_pytorch as ipex

        self.ops = ipex.llm.modules.PagedAttention
        self.version = getattr(ipex, "__version__", "?")
        self.device = torch.device("xpu" if hasattr(torch, "xpu") and torch.xpu.is_available() else "cpu")
        self.name = f"ipex-{self.device.type}"
        self.dtypes = (torch.bfloat16,) if self.device.type == "xpu" else (torch.float32, torch.bfloat16)

    def probe_e4m3(self) -> str | None:
        """Why this build cannot hold an E4M3 cache (the error of a one-token write), or None if it can."""
        batch = Batch([0], [1], 1, 1, 64, 32, self.dtypes[0]).build()
        try:
            self.write(batch, 1.0, 1.0)
        except Exception as e:  # noqa: BLE001  (the op's own refusal is the answer)
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return None

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        key_cache, value_cache = _empty_caches(
            (batch.num_blocks, batch.num_kv_heads, batch.block_size, batch.head_dim), self.device
        )
        keys, values, slots = _batch_on(batch, self.device)
        if len(slots):
            self.ops.reshape_and_cache(keys, values, key_cache, value_cache, slots, "fp8", k_scale, v_scale)
        return key_cache, value_cache

    def read_back(self, cache, batch: Batch, seq: int):
        return _paged_codes(cache[0], batch, seq, True), _paged_codes(cache[1], batch, seq, True)

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        key_cache, value_cache = cache
        dev, i32 = self.device, torch.int32
        query = batch.queries.to(dev)
        out = torch.empty_like(query)
        table = batch.table.to(dev)
        scale = batch.head_dim**-0.5
        if all(q == 1 for q in batch.q_lens):
            group = batch.num_heads // batch.num_kv_heads
            head_mapping = torch.arange(batch.num_heads, dtype=i32, device=dev) // group
            self.ops.single_query_cached_kv_attention(
                out,
                query,
                key_cache,
                value_cache,
                head_mapping,
                scale,
                table,
                torch.tensor(batch.seq_lens, dtype=i32, device=dev),
                batch.block_size,
                max(batch.seq_lens),
                None,
                -1,
                k_scale,
                v_scale,
            )
        else:
            self.ops.flash_attn_varlen_func(
                out,
                query,
                key_cache,
                value_cache,
                torch.tensor([0, *cumsum(batch.q_lens)], dtype=i32, device=dev),
                torch.tensor([0, *cumsum(batch.seq_lens)], dtype=i32, device=dev),
                max(batch.q_lens),
                max(batch.seq_lens),
                scale,
                True,
                table,
                None,
                -1,
                -1,
                "fp8",
                k_scale,
                v_scale,
            )
        return out.float().cpu()


def e4m3_refusal_summary(error: str, version: str, device: str) -> str:
    """The reason an IPEX build's tests skip: its FP8 cache is not the lab's E4M3 one."""
    return (
        f"intel-extension-for-pytorch {version} on {device} refuses an FP8 E4M3 KV cache (the B70 contract's "
        f"kv_cache_dtype fp8 is E4M3): a one-token reshape_and_cache into float8_e4m3fn pages raised {error}. "
        f"See notes/2026-11-30-ipex-cpu-fp8-cache.md"
    )
