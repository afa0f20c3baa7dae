"""A portable FP8 (E4M3) KV-cache path for vLLM's CPU attention backend, for CPUs without AVX-512 or AMX.

vLLM 0.32's CPU attention refuses an FP8 cache unless the CPU has AVX-512 or AMX (`_get_attn_isa`), and the
AVX2 op library has no FP8 attention at all. The embedded default must serve on every x86-64 CPU of the
lab's kind, so this module serves the same cache with plain PyTorch:

- the cache tensor, its shape and its bytes are vLLM's own: uint8 E4M3 codes in the native `vec` page layout
  (per page and KV head, K as [head_dim, block], V as [block, head_dim]), so the audits, the kernel lane's
  read-back and anything else that reads the cache see no difference;
- codes are written as vLLM's native kernel writes them: toward zero, saturating at +-448, from
  x * fp32(1 / scale), with the kernel's subnormal and signed-zero behaviour
  (notes/2026-11-30-cpu-fp8-cache-write-truncates.md; the kernel lane compares the bytes);
- the checkpoint's calibrated scalar scales, as the layer hands them over; no run-time scale calculation;
- any page size that is a multiple of 32; causal attention (decode, 12-query verification, prefill) and the
  DFlash draft's non-causal attention.

vLLM's CPU platform always picks CPU_ATTN and runs attention as an opaque custom op, eagerly, outside Dynamo
and the AOT compile cache; so the backend's FP8 call sites are redirected rather than a backend added:
`_get_attn_isa` answers `vec` instead of refusing, and the backend module's three op calls (scheduler
metadata, cache write, attention) go to this module for an FP8 cache. Everything else is untouched.

Installed by the vLLM plugin (`fixes`, fix `cpu_fp8_portable_attention`) where the native path cannot
run, or everywhere with `B70LAB_FP8_ATTENTION=portable`. Runs inside vLLM's processes: imports only the
standard library, torch and vLLM. The patch in `patches/` is the same change as a source delta.
"""

from __future__ import annotations

import os
from typing import Any

import torch

ENV_FORCE = "B70LAB_FP8_ATTENTION"  # "portable" forces this path; unset / "auto": only where native cannot run
FORCE_VALUES = ("auto", "portable")
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
PAGE_MULTIPLE = 32
# Query rows attended at once in a long prefill: bounds the [heads, rows, context] logits tensor (~64 MB at
# 16 heads x 2048 context in fp32) without a Python loop per row.
QUERY_CHUNK = 512
IMPLEMENTATION = "b70lab-portable-fp8"
_state: dict[str, Any] = {"installed": False, "reason": None}


class PortableFp8Error(NotImplementedError):
    """A feature the portable path does not serve (it says which, rather than computing something else)."""


def forced(environ=os.environ) -> bool:
    value = (environ.get(ENV_FORCE) or "auto").strip().lower()
    if value not in FORCE_VALUES:
        raise ValueError(f"{ENV_FORCE}={value!r}: expected one of {', '.join(FORCE_VALUES)}")
    return value == "portable"


def native_fp8_supported() -> bool:
    """What vLLM 0.32's `_get_attn_isa` requires of the CPU for an FP8 cache (as this process sees the CPU:
    the AVX2 emulation changes the answer)."""
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def state() -> dict[str, Any]:
    """This process's FP8 attention path, for the audit: installed or not, and why."""
    return {
        "implementation": IMPLEMENTATION if _state["installed"] else "vllm-native",
        "portable": bool(_state["installed"]),
        "reason": _state["reason"],
    }


# --- the cache write ---------------------------------------------------------------------------------------


def fp32_reciprocal(scale: float) -> torch.Tensor:
    """1 / scale taken in fp32, as the native kernel takes it (a reciprocal in double differs in the last bit
    for inputs that land exactly on a code)."""
    return torch.reciprocal(torch.tensor(scale, dtype=torch.float32))


E4M3_SMALLEST_NORMAL = 2.0**-6


def e4m3_codes_toward_zero(x: torch.Tensor, scale: float) -> torch.Tensor:
    """uint8 E4M3 codes of y = x * fp32(1 / scale), saturated at +-448, rounded toward zero, byte for byte as
    vLLM's native CPU write (vec, measured in the kernel lane), including its two quirks:

    - below the smallest normal (2^-6) the kernel adds 2^-6 to |y| in fp32 before truncating, so |y| is first
      rounded to nearest even at that sum's resolution (2^-29): a |y| within 2^-30 below a subnormal code
      (or below 2^-6) is stored as that code, not the one under it;
    - the sign bit is y < 0, so -0.0 is stored as +0 (while -1e-4 is stored as -0)."""
    y = x.float() * fp32_reciprocal(scale)
    magnitude = y.abs().clamp(max=E4M3_MAX)
    normal = torch.tensor(E4M3_SMALLEST_NORMAL)
    magnitude = torch.where(magnitude < normal, (magnitude + normal) - normal, magnitude)  # exact subtraction
    q = magnitude.to(E4M3)  # torch rounds to nearest even; step back one code where that moved away from zero
    codes = q.view(torch.uint8).to(torch.int16) - (q.float() > magnitude).to(torch.int16)
    return (((y < 0).to(torch.int16) << 7) | codes).to(torch.uint8)


def _pages(half: torch.Tensor, kind: str) -> torch.Tensor:
    """One half of vLLM's cache ([blocks, kv heads, block, D] as the backend views it) in the vec layout's
    own shape: K as [blocks, kv heads, D, block], V as [blocks, kv heads, block, D]. Same memory."""
    blocks, heads, block, dim = half.shape
    if block % PAGE_MULTIPLE:
        raise PortableFp8Error(f"page size {block}: the portable FP8 path serves multiples of {PAGE_MULTIPLE}")
    return half.view(blocks, heads, dim, block) if kind == "k" else half


def write_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> None:
    """Write K/V [tokens, kv heads, D] at their slots (negative slots are padding, as in vLLM)."""
    slots = slot_mapping.reshape(-1).long()
    count = slots.numel()
    keep = slots >= 0
    slots = slots[keep]
    if slots.numel() == 0:
        return
    block = key_cache.shape[2]
    page, offset = slots // block, slots % block
    k_pages, v_pages = _pages(key_cache, "k"), _pages(value_cache, "v")
    k_pages[page, :, :, offset] = e4m3_codes_toward_zero(key[:count][keep], k_scale)
    v_pages[page, :, offset, :] = e4m3_codes_toward_zero(value[:count][keep], v_scale)


# --- attention ---------------------------------------------------------------------------------------------

# Every E4M3 code's value, for dequantizing by table look-up: an index_select with int32 indices is about twice
# as fast here as torch's own float8 -> float32 conversion, and gives the same values (exact in fp32).
_E4M3_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3).float()


def _dequantize(codes: torch.Tensor, scale: float) -> torch.Tensor:
    values = torch.index_select(_E4M3_VALUES, 0, codes.reshape(-1).to(torch.int32))
    return (values * scale).view(codes.shape)


def _context(
    key_cache: torch.Tensor, value_cache: torch.Tensor, pages: torch.Tensor, length: int, k_scale: float, v_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's K as [kv heads, D, length] and V as [kv heads, length, D] in fp32, dequantized from its
    pages (K keeps the page's own [D, block] orientation: the logits need K transposed anyway)."""
    heads, dim = key_cache.shape[1], key_cache.shape[3]
    k = _pages(key_cache, "k")[pages].permute(1, 2, 0, 3).reshape(heads, dim, -1)[:, :, :length]
    v = _pages(value_cache, "v")[pages].permute(1, 0, 2, 3).reshape(heads, -1, dim)[:, :length]
    return _dequantize(k.contiguous(), k_scale), _dequantize(v.contiguous(), v_scale)


def attend(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    causal: bool,
    k_scale: float,
    v_scale: float,
) -> None:
    """Paged attention over the FP8 cache, in fp32: each sequence's query rows are its last positions; a
    causal row sees the context and the rows before it, a non-causal row (the DFlash draft) sees all."""
    kv_heads, block = key_cache.shape[1], key_cache.shape[2]
    heads, dim = query.shape[1], query.shape[2]
    group = heads // kv_heads
    starts, lengths = query_start_loc.tolist(), seq_lens.tolist()
    for r, length in enumerate(lengths):
        first, last = starts[r], starts[r + 1]
        rows = last - first
        if rows == 0:
            continue
        pages = block_table[r, : (length + block - 1) // block].long()
        k_t, v = _context(key_cache, value_cache, pages, length, k_scale, v_scale)  # [KVH, D, L], [KVH, L, D]
        q = query[first:last].float().view(rows, kv_heads, group, dim).permute(1, 2, 0, 3)  # [KVH, G, rows, D]
        out = torch.empty(kv_heads, group, rows, dim)
        for at in range(0, rows, QUERY_CHUNK):
            n = min(QUERY_CHUNK, rows - at)
            # one batched product per KV head, its query heads stacked as rows (a broadcast matmul is ~4x slower)
            chunk = q[:, :, at : at + n].reshape(kv_heads, group * n, dim)
            logits = (torch.bmm(chunk, k_t) * scale).view(kv_heads, group, n, length)
            if causal:
                # row i of the block is position length - rows + i: it sees keys 0 .. length - rows + i
                row_pos = torch.arange(at, at + n) + (length - rows)
                hidden = torch.arange(length)[None, :] > row_pos[:, None]
                logits = logits.masked_fill(hidden, float("-inf"))
            probs = logits.softmax(-1).view(kv_heads, group * n, length)
            out[:, :, at : at + n] = torch.bmm(probs, v).view(kv_heads, group, n, dim)
        output[first:last].copy_(out.permute(2, 0, 1, 3).reshape(output[first:last].shape))


# --- installing it into vLLM's CPU backend -----------------------------------------------------------------


def _is_fp8(kv_cache_dtype: str | None) -> bool:
    return bool(kv_cache_dtype) and str(kv_cache_dtype).startswith("fp8")


class PortableFp8Ops:
    """Stands in for `vllm._custom_ops` inside the CPU attention backend module: the three ops it calls go to
    this module for an FP8 cache and to vLLM for any other; every other name is vLLM's."""

    def __init__(self, native: Any):
        self._native = native

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def cpu_attn_get_scheduler_metadata(self, *args, kv_cache_dtype: str = "auto", **kwargs):
        if not _is_fp8(kv_cache_dtype):
            return self._native.cpu_attn_get_scheduler_metadata(*args, kv_cache_dtype=kv_cache_dtype, **kwargs)
        if kwargs.get("dynamic_causal") is not None:
            raise PortableFp8Error("per-request causality (dynamic_causal) is not served by the portable FP8 path")
        if kwargs.get("sliding_window_size", -1) not in (-1, None):
            raise PortableFp8Error("sliding-window attention is not served by the portable FP8 path")
        return None  # the portable attention splits no work: it has no scheduler to feed

    def cpu_attn_reshape_and_cache(
        self,
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        isa,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        kv_cache_dtype: str = "auto",
    ):
        if not _is_fp8(kv_cache_dtype):
            return self._native.cpu_attn_reshape_and_cache(
                key,
                value,
                key_cache,
                value_cache,
                slot_mapping,
                isa,
                k_scale=k_scale,
                v_scale=v_scale,
                kv_cache_dtype=kv_cache_dtype,
            )
        _refuse_other_encodings(kv_cache_dtype)
        return write_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)

    def cpu_attention_with_kv_cache(
        self,
        *,
        query,
        key_cache,
        value_cache,
        output,
        query_start_loc,
        seq_lens,
        scale,
        causal,
        alibi_slopes,
        sliding_window,
        block_table,
        softcap,
        scheduler_metadata,
        s_aux,
        dynamic_causal=None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        kv_cache_dtype: str = "auto",
    ):
        if not _is_fp8(kv_cache_dtype):
            return self._native.cpu_attention_with_kv_cache(
                query=query,
                key_cache=key_cache,
                value_cache=value_cache,
                output=output,
                query_start_loc=query_start_loc,
                seq_lens=seq_lens,
                scale=scale,
                causal=causal,
                alibi_slopes=alibi_slopes,
                sliding_window=sliding_window,
                block_table=block_table,
                softcap=softcap,
                scheduler_metadata=scheduler_metadata,
                s_aux=s_aux,
                dynamic_causal=dynamic_causal,
                k_scale=k_scale,
                v_scale=v_scale,
                kv_cache_dtype=kv_cache_dtype,
            )
        _refuse_other_encodings(kv_cache_dtype)
        for what, present in (
            ("ALiBi slopes", alibi_slopes is not None),
            ("a sliding window", sliding_window != -1),
            ("a logits soft cap", bool(softcap)),
            ("attention sinks", s_aux is not None),
            ("per-request causality", dynamic_causal is not None),
        ):
            if present:
                raise PortableFp8Error(f"the portable FP8 path does not serve {what}")
        return attend(
            query,
            key_cache,
            value_cache,
            output,
            query_start_loc,
            seq_lens,
            block_table,
            scale,
            bool(causal),
            k_scale,
            v_scale,
        )


def _refuse_other_encodings(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in ("fp8", "fp8_e4m3"):
        raise PortableFp8Error(f"kv_cache_dtype {kv_cache_dtype!r}: the portable FP8 path holds E4M3 codes only")


def install(reason: str) -> None:
    """Redirect the CPU backend's FP8 call sites here (idempotent)."""
    if _state["installed"]:
        return
    from vllm.v1.attention.backends import cpu_attn

    native_isa = cpu_attn._get_attn_isa

    def _get_attn_isa(dtype, block_size, head_size=None, kv_cache_dtype=None):
        if _is_fp8(kv_cache_dtype):
            if head_size is not None and head_size % 32:
                raise PortableFp8Error("FP8 KV cache requires head_size divisible by 32 on CPU.")
            if block_size % PAGE_MULTIPLE:
                raise PortableFp8Error(
                    f"FP8 KV cache on the portable path needs a page size that is a multiple "
                    f"of {PAGE_MULTIPLE}; got {block_size}"
                )
            return "vec"
        return native_isa(dtype, block_size, head_size, kv_cache_dtype)

    _get_attn_isa._b70lab_fix = True  # type: ignore[attr-defined]
    cpu_attn._get_attn_isa = _get_attn_isa
    cpu_attn.ops = PortableFp8Ops(cpu_attn.ops)
    _state.update(installed=True, reason=reason)
