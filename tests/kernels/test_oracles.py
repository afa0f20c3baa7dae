"""The reference's E4M3 encoding against the oracles byte for byte, the oracles against the format's definition,
and wrong encodings that the comparisons must reject (so that none of these checks can pass on anything)."""

from __future__ import annotations

import oracles
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_b70lab import kernels

pytestmark = pytest.mark.kernels

SUBNORMAL_STEP = 2.0**-9
SCALES = (1.0, 0.25, 3.0, 0.0123)


@st.composite
def near_codes(draw) -> float:
    """A quotient on, next to, or between two E4M3 values (the places where roundings part), either sign."""
    magnitude_code = draw(st.integers(0, oracles.LARGEST_FINITE_MAGNITUDE_CODE))
    low = float(oracles.MAGNITUDES[magnitude_code])
    high = float(oracles.MAGNITUDES[min(magnitude_code + 1, oracles.LARGEST_FINITE_MAGNITUDE_CODE)])
    if high == low:
        high = 464.0  # past 448: where saturation takes over
    y = draw(st.sampled_from([low, (low + high) / 2, draw(st.floats(low, high, width=32))]))
    y = float(torch.tensor(y).nextafter(torch.tensor(draw(st.sampled_from([-1e9, y, 1e9])))))
    return -y if draw(st.booleans()) else y


def quotient_vectors():
    values = st.one_of(near_codes(), st.floats(-1000, 1000, width=32), st.floats(-1 / 64, 1 / 64, width=32))
    return st.lists(values, min_size=1, max_size=64)


def inputs_for(quotients: list[float], scale: float) -> torch.Tensor:
    return torch.tensor(quotients, dtype=torch.float32) * scale


@given(quotients=quotient_vectors(), scale=st.sampled_from(SCALES))
def test_the_reference_rne_codes_equal_the_float8_cast(quotients, scale) -> None:
    x = inputs_for(quotients, scale)
    assert torch.equal(kernels.e4m3_codes(x, scale, "rne"), oracles.e4m3_rne_codes(x, scale))


@given(quotients=quotient_vectors(), scale=st.sampled_from(SCALES))
def test_the_reference_rtz_codes_equal_the_code_table_search(quotients, scale) -> None:
    x = inputs_for(quotients, scale)
    assert torch.equal(kernels.e4m3_codes(x, scale, "rtz"), oracles.e4m3_rtz_codes(x, scale))


@given(quotients=quotient_vectors(), scale=st.sampled_from(SCALES))
def test_the_float8_cast_is_nearest_even_over_the_code_table(quotients, scale) -> None:
    """The RNE oracle is torch's cast; this holds the cast itself to the format's definition."""
    x = inputs_for(quotients, scale)
    assert torch.equal(oracles.e4m3_rne_codes(x, scale), oracles.e4m3_nearest_even_by_table(x, scale))


def test_the_code_table_follows_the_format() -> None:
    values = oracles.CODE_VALUES
    assert values[0x01] == SUBNORMAL_STEP and values[0x07] == 7 * SUBNORMAL_STEP  # subnormals
    assert values[0x08] == 2.0**-6 and values[0x38] == 1.0 and values[0x7E] == 448.0
    assert torch.isnan(values[0x7F]) and torch.isnan(values[0xFF])
    assert torch.signbit(values[0x80]) and values[0x80] == 0.0 and values[0xB8] == -1.0
    assert bool((oracles.MAGNITUDES[1:] > oracles.MAGNITUDES[:-1]).all())


# Hand-written codes: signed zeros, subnormal ties (nearest even), the subnormal/normal edge, saturation, and
# vLLM's CPU write below 2^-6 (toward zero of |y| rounded to the nearest multiple of 2^-29, ties to even).
EXPLICIT_CASES = [
    # quotient,                 rne,  rtz
    (0.0, 0x00, 0x00),
    (-0.0, 0x80, 0x00),  # toward zero is the CPU kernel's: sign bit y < 0, so -0.0 is +0
    (1e-4, 0x00, 0x00),
    (-1e-4, 0x80, 0x80),  # toward zero keeps the sign: -0
    (-0.6 * SUBNORMAL_STEP, 0x81, 0x80),
    (2.5 * SUBNORMAL_STEP, 0x02, 0x02),  # tie: 2 is even
    (3.5 * SUBNORMAL_STEP, 0x04, 0x03),  # tie: 4 is even
    (7.5 * SUBNORMAL_STEP, 0x08, 0x07),  # tie across into the normals: 2^-6 is code 8
    (-7.9 * SUBNORMAL_STEP, 0x88, 0x87),
    (SUBNORMAL_STEP - 2**-31, 0x01, 0x01),  # within 2^-30 below a subnormal code: the kernel stores the code
    (7 * SUBNORMAL_STEP - 2**-30, 0x07, 0x07),  # exactly 2^-30 below: a tie on the grid, to the even code
    (7 * SUBNORMAL_STEP - 2**-29, 0x07, 0x06),  # a whole grid step below: the code under it
    (2**-6 - 2**-30, 0x08, 0x08),  # up to the smallest normal
    (1.0625, 0x38, 0x38),  # tie: 1.0 (mantissa 0) is even
    (1.07, 0x39, 0x38),
    (3.7, 0x47, 0x46),  # 3.75 / 3.5
    (447.0, 0x7E, 0x7D),  # 448 / 416
    (460.0, 0x7E, 0x7E),  # saturation
    (-1e6, 0xFE, 0xFE),
]


@pytest.mark.parametrize("rounding", ["rne", "rtz"])
def test_explicit_codes_from_the_oracles_and_the_reference(rounding) -> None:
    x = torch.tensor([q for q, _, _ in EXPLICIT_CASES])
    want = torch.tensor([rne if rounding == "rne" else rtz for _, rne, rtz in EXPLICIT_CASES], dtype=torch.uint8)
    for name, encode in (("oracle", oracles.e4m3_codes), ("reference", kernels.e4m3_codes)):
        got = encode(x, 1.0, rounding)
        assert torch.equal(got, want), (
            f"{name} {rounding}: {[hex(c) for c in got.tolist()]} for {x.tolist()}, "
            f"expected {[hex(c) for c in want.tolist()]}"
        )


def test_code_steps_count_values_along_the_number_line() -> None:
    def steps(a: int, b: int) -> int:
        return int(oracles.code_steps(torch.tensor([a], dtype=torch.uint8), torch.tensor([b], dtype=torch.uint8)))

    assert steps(0x00, 0x80) == 0  # +0 and -0: one point
    assert steps(0x01, 0x81) == 2 and steps(0x01, 0x80) == 1  # across zero
    assert steps(0x38, 0x37) == 1 and steps(0x7E, 0x00) == 126 and steps(0xFE, 0x7E) == 252


def test_the_visibility_mask_is_full_over_the_context_and_causal_in_the_block() -> None:
    assert oracles.visibility_mask(2, 3).tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


# --- wrong encodings the comparisons must reject ---------------------------------------------------------


@given(
    magnitude_code=st.integers(0, oracles.LARGEST_FINITE_MAGNITUDE_CODE - 1),
    past_midpoint=st.floats(0.5, 1.0, exclude_min=True, exclude_max=True),
    negative=st.booleans(),
)
def test_the_code_comparisons_reject_the_other_rounding(magnitude_code, past_midpoint, negative) -> None:
    """Strictly past the midpoint between two values, RNE goes up and toward zero goes down."""
    low, high = (float(oracles.MAGNITUDES[c]) for c in (magnitude_code, magnitude_code + 1))
    y = torch.tensor([low + past_midpoint * (high - low)], dtype=torch.float32)
    assume((low + high) / 2 < float(y) < high)  # still strictly inside after rounding to fp32
    # and not within half a grid step of a subnormal code, where the CPU kernel's toward zero rounds up to it
    assume(high > oracles.SMALLEST_NORMAL or float(y) < high - oracles.SUBNORMAL_GRID / 2)
    x = -y if negative else y
    assert not torch.equal(kernels.e4m3_codes(x, 1.0, "rtz"), oracles.e4m3_rne_codes(x, 1.0))
    assert not torch.equal(kernels.e4m3_codes(x, 1.0, "rne"), oracles.e4m3_rtz_codes(x, 1.0))


@pytest.mark.parametrize("rounding", ["rne", "rtz"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_code_comparisons_reject_a_scale_1_percent_high(rounding, seed) -> None:
    x = torch.randn(512, generator=torch.Generator().manual_seed(seed)) * 2.0
    scale = float(x.abs().max()) / oracles.E4M3_MAX
    assert not torch.equal(kernels.e4m3_codes(x, scale * 1.01, rounding), oracles.e4m3_codes(x, scale, rounding))


@pytest.mark.parametrize("rounding", ["rne", "rtz"])
def test_the_code_comparisons_reject_subnormals_flushed_to_zero(rounding) -> None:
    x = torch.tensor([1.0, 2.5, 3.2, 6.9]) * SUBNORMAL_STEP
    codes = kernels.e4m3_codes(x, 1.0, rounding)
    flushed = torch.where(x.abs() < 2.0**-6, codes & 0x80, codes)
    assert not torch.equal(flushed, oracles.e4m3_codes(x, 1.0, rounding))
