"""Oracles for the kernel tests, computed another way than `pytest_b70lab.kernels`, so that a comparison with
them can fail when the reference (or an implementation declaring the same behaviour) is wrong.

- E4M3 round to nearest even: torch's own float8 cast of the clamped quotient (checked in turn against a
  nearest-even search over the code table, so the cast is not taken on trust).
- E4M3 toward zero: a search over the table of E4M3 code values, built from the format's definition (sign,
  4-bit exponent with bias 7, 3-bit mantissa, subnormals below 2^-6, no infinities, NaN at 0x7F and 0xFF).
- Attention: torch's scaled_dot_product_attention with grouped-query heads and an explicit boolean mask
  (causal inside the query block, or not causal), over a cache dequantized through that table.

What is rounded (`quotient`) follows the two conventions: round to nearest even encodes x / scale in fp32 (the
GPU kernels' arithmetic); toward zero encodes x * (1 / scale) with the reciprocal taken in fp32, which is how
vLLM's CPU kernel computes it (notes/2026-11-30-cpu-fp8-cache-write-truncates.md: 0 codes differ, where
x / scale leaves ~4e-4 of them one step off). Both are written here as in the reference; the oracles re-derive
the rounding, the saturation and the attention, not that arithmetic. Inputs are finite.

Toward zero is the CPU kernel's, byte for byte, including what it does below the smallest normal (|y| is
first rounded to nearest even on a 2^-29 grid, see `e4m3_rtz_codes`) and with zero: its sign bit is y < 0,
so -0.0 is stored as +0 while -1e-4 is stored as -0. Round to nearest even gives a zero code the sign of
x / scale, as the float8 cast does. The reference's `e4m3_codes` is held to both byte for byte. Cache bytes of
an implementation are compared as points on the E4M3 number line (`code_steps`), where +0 and -0 are one
point: they dequantize to the same 0.0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
LARGEST_FINITE_MAGNITUDE_CODE = 0x7E  # 448; 0x7F is NaN
SMALLEST_NORMAL = 2.0**-6
# vLLM's CPU write adds 2^-6 to a subnormal |y| in fp32 before truncating: fp32's spacing on [2^-6, 2^-5)
SUBNORMAL_GRID = 2.0**-29


def _e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0**-9  # subnormal: 0.mmm x 2^-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


# value of each of the 256 codes (NaN at 0x7F and 0xFF); the magnitudes 0x00..0x7E ascend from 0 to 448
CODE_VALUES = torch.tensor([_e4m3_value(c) for c in range(256)], dtype=torch.float32)
MAGNITUDES = CODE_VALUES[: LARGEST_FINITE_MAGNITUDE_CODE + 1].contiguous()


def quotient(x: torch.Tensor, scale: float, rounding: str) -> torch.Tensor:
    """The number a cache write encodes: x / scale in fp32 ("rne"), or x times 1 / scale taken in fp32
    ("rtz", vLLM's CPU kernel)."""
    if rounding == "rtz":
        return x.float() * (torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32))
    return x.float() / scale


def _signed(magnitude: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((torch.signbit(y).to(torch.int64) << 7) | magnitude).to(torch.uint8)


def e4m3_rne_codes(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Round to nearest even, saturating at +-448: torch's float8 cast, as uint8 codes."""
    return quotient(x, scale, "rne").clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_rtz_codes(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Toward zero, saturating, as vLLM's CPU kernel writes: the largest code magnitude not above |y|, where a
    |y| below the smallest normal is first rounded to the nearest multiple of 2^-29 (ties to even: a |y| within
    2^-30 below a subnormal code is that code); the sign bit is y < 0."""
    y = quotient(x, scale, "rtz")
    magnitude = y.abs()
    on_grid = torch.round(magnitude / SUBNORMAL_GRID) * SUBNORMAL_GRID  # exact scaling; round is half to even
    magnitude = torch.where(magnitude < SMALLEST_NORMAL, on_grid, magnitude)
    not_above = torch.searchsorted(MAGNITUDES, magnitude.contiguous(), right=True) - 1
    return (((y < 0).to(torch.int64) << 7) | not_above).to(torch.uint8)


def e4m3_nearest_even_by_table(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Nearest code magnitude from the table, ties to the even code, saturating: what the cast must equal."""
    y = quotient(x, scale, "rne")
    magnitude = y.abs().contiguous()
    below = torch.searchsorted(MAGNITUDES, magnitude, right=True) - 1
    above = (below + 1).clamp(max=LARGEST_FINITE_MAGNITUDE_CODE)
    to_below, to_above = magnitude - MAGNITUDES[below], MAGNITUDES[above] - magnitude  # exact (Sterbenz)
    take_above = (to_above < to_below) | ((to_above == to_below) & (above % 2 == 0))
    return _signed(torch.where(take_above, above, below), y)


ROUNDINGS = {"rne": e4m3_rne_codes, "rtz": e4m3_rtz_codes}


def e4m3_codes(x: torch.Tensor, scale: float, rounding: str) -> torch.Tensor:
    """The oracle of the named rounding ("rne" or "rtz")."""
    return ROUNDINGS[rounding](x, scale)


def classify_rounding(inputs: torch.Tensor, written: torch.Tensor) -> str | None:
    """Which rounding produced `written` codes from `inputs` at scale 1 (None: neither)."""
    for rounding, codes in ROUNDINGS.items():
        if torch.equal(codes(inputs, 1.0), written):
            return rounding
    return None


def number_line_position(codes: torch.Tensor) -> torch.Tensor:
    """Signed step count from zero; +0 and -0 are both position 0."""
    magnitude = (codes & 0x7F).to(torch.int16)
    return torch.where((codes & 0x80) != 0, -magnitude, magnitude)


def code_steps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many representable E4M3 values apart two code tensors are, elementwise (across zero too)."""
    return (number_line_position(got) - number_line_position(want)).abs()


# --- attention ----------------------------------------------------------------------------------------


def dequantize(codes: torch.Tensor, scale: float) -> torch.Tensor:
    return CODE_VALUES[codes.long()] * scale


def visibility_mask(ctx_len: int, q_len: int, causal: bool = True) -> torch.Tensor:
    """[q_len, ctx_len + q_len], True where query row i sees key j: all of the context, and inside the query
    block only itself and the rows before it (keys 0 .. ctx_len + i); not causal (the DFlash draft), every
    key of the sequence."""
    rows = torch.arange(q_len)[:, None]
    keys = torch.arange(ctx_len + q_len)[None, :]
    if not causal:
        return (keys >= 0).expand(q_len, ctx_len + q_len)
    return keys <= ctx_len + rows


def sdpa_attention(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    ctx_lens: list[int],
    q_lens: list[int],
    causal: bool = True,
) -> torch.Tensor:
    """fp32 attention per sequence through torch's SDPA. query [sum q, H, D]; keys and values per sequence
    [S, KVH, D]. Query head h reads KV head h // (H / KVH) (enable_gqa), the convention vLLM uses."""
    dim = query.shape[-1]
    out = []
    for q, k, v, ctx, ql in zip(query.split(q_lens), keys, values, ctx_lens, q_lens, strict=False):
        heads_first = [t.float().transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, heads, tokens, D]
        o = F.scaled_dot_product_attention(
            *heads_first, attn_mask=visibility_mask(ctx, ql, causal), scale=dim**-0.5, enable_gqa=True
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out) if out else torch.zeros(0, *query.shape[1:])


def cache_contents(impl, cache, batch, k_scale: float, v_scale: float) -> tuple[list, list]:
    """Per sequence, the K and V [S, KVH, D] that `impl` stored: its codes read back, dequantized through the
    table."""
    keys, values = [], []
    for seq in range(len(batch.seq_lens)):
        k, v = impl.read_back(cache, batch, seq)
        keys.append(dequantize(k, k_scale))
        values.append(dequantize(v, v_scale))
    return keys, values


def attention_over_cache(impl, cache, batch, k_scale: float, v_scale: float) -> torch.Tensor:
    """The oracle's attention over what `impl` stored (causal or not as the batch says)."""
    keys, values = cache_contents(impl, cache, batch, k_scale, v_scale)
    return sdpa_attention(batch.query, keys, values, batch.ctx_lens, batch.q_lens, batch.causal)
