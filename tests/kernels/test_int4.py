"""The portable INT4 (W4A16) path against an independent oracle, and against vLLM's own CPU kernel where the
op library has one.

The oracle reads compressed-tensors' packed words another way than the implementation: as little-endian bytes,
two 4-bit fields each (low nibble first), one Python integer at a time, and dequantizes group by group in
float64. Shapes cross group and word boundaries: several groups per row, groups of 32 / 64 / 128 columns
(four, eight, sixteen words), output widths that are no multiple of 32, and the stacked [experts, N, K / 8]
tensors of the MoE layers. Each comparison is shown to reject a deliberately wrong unpacking (the mutants).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_b70lab.in_engine import cpu_emulation, portable_int4
from pytest_b70lab.mini import int4

pytestmark = pytest.mark.kernels

GROUP_SIZES = (32, 64, 128)
FP32_UNIT_ROUNDOFF = 2.0**-24


def oracle_codes(packed: torch.Tensor) -> list[list[int]]:
    """Signed codes row by row: each int32 word as four little-endian bytes, each byte's low nibble before its
    high one, stored offset by 8."""
    rows = []
    for row in packed.reshape(-1, packed.shape[-1]).tolist():
        codes = []
        for word in row:
            for byte in (word & 0xFFFFFFFF).to_bytes(4, "little"):
                codes += [(byte & 0xF) - 8, (byte >> 4) - 8]
        rows.append(codes)
    return rows


def oracle_weight(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 [..., N, K]: each code times its group's scale."""
    codes = oracle_codes(packed)
    scales = scale.reshape(-1, scale.shape[-1]).double().tolist()
    k = packed.shape[-1] * 8
    group = k // scale.shape[-1]
    rows = [[c * s[j // group] for j, c in enumerate(row)] for row, s in zip(codes, scales, strict=True)]
    return torch.tensor(rows, dtype=torch.float64).reshape(*packed.shape[:-1], k)


def random_layer(seed: int, out_features: int, in_features: int, group: int, scale_dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=g) * 0.05
    return int4.quantize(weight, group, scale_dtype)


layer_shapes = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(1, 48),  # output rows: mostly no multiple of 32
    st.sampled_from(GROUP_SIZES),
    st.integers(1, 4),  # groups per row
)


@given(layer_shapes)
def test_dequantized_weight_equals_the_oracle_exactly(shape) -> None:
    seed, out_features, group, groups = shape
    parts = random_layer(seed, out_features, group * groups, group)
    got = portable_int4.dequantize(parts["weight_packed"], parts["weight_scale"], torch.float32)
    want = oracle_weight(parts["weight_packed"], parts["weight_scale"])
    # A 4-bit code times a bf16 scale is exact in fp32: no tolerance.
    assert torch.equal(got.double(), want), (got.double() - want).abs().max()


@given(layer_shapes, st.integers(1, 12))
def test_portable_linear_agrees_with_the_oracle_matmul(shape, tokens: int) -> None:
    """F.linear on the dequantized weight against a float64 matmul of the oracle's weight, within the fp32
    worst-case bound of a K-term dot product in any summation order (K u sum |x w|)."""
    seed, out_features, group, groups = shape
    in_features = group * groups
    parts = random_layer(seed, out_features, in_features, group)
    x = torch.randn(tokens, in_features, generator=torch.Generator().manual_seed(seed + 1))
    kernel = portable_int4.dequantize(parts["weight_packed"], parts["weight_scale"], torch.float32)
    got = torch.nn.functional.linear(x, kernel).double()
    w = oracle_weight(parts["weight_packed"], parts["weight_scale"])
    want = x.double() @ w.T
    bound = in_features * FP32_UNIT_ROUNDOFF * (x.double().abs() @ w.abs().T) + 1e-30
    assert bool(((got - want).abs() <= bound).all()), float(((got - want).abs() / bound).max())


@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.sampled_from(GROUP_SIZES))
def test_stacked_expert_tensors_dequantize_expert_by_expert(seed: int, experts: int, group: int) -> None:
    """The MoE layers' [experts, N, K / 8] words and [experts, N, groups] scales: each expert as the oracle."""
    layers = [random_layer(seed + e, 24, 2 * group, group) for e in range(experts)]
    packed = torch.stack([p["weight_packed"] for p in layers])
    scale = torch.stack([p["weight_scale"] for p in layers]).float()  # a bf16 checkpoint's scales in fp32 parameters
    got = portable_int4.dequantize(packed, scale, torch.float32).double()
    assert torch.equal(got, oracle_weight(packed, scale))


def test_the_quantizer_packs_as_compressed_tensors_reads() -> None:
    """The mini's INT4 build writes what compressed-tensors' own unpacking reads back: the codes the quantizer
    chose (round(w / scale), clamped to [-8, 7]) and the shape."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    weight = torch.randn(40, 256, generator=torch.Generator().manual_seed(3))
    parts = int4.quantize(weight, 64, torch.bfloat16)
    read = unpack_from_int32(parts["weight_packed"], 4, torch.Size([40, 256]))
    scale = parts["weight_scale"].float().repeat_interleave(64, dim=1)
    want = torch.round(weight / scale).clamp(-8, 7)
    assert torch.equal(read.float(), want)
    assert torch.equal(torch.tensor(oracle_codes(parts["weight_packed"]), dtype=torch.float32), want)
    assert parts["weight_shape"].tolist() == [40, 256]
    err = (portable_int4.dequantize(parts["weight_packed"], parts["weight_scale"], torch.float32) - weight).abs()
    # Half a step, and a little more at a group's largest weight: bf16 may round absmax / 7.5 down, and the
    # code is clamped at 7 (7.5 times bf16's relative rounding 2^-8 is 0.03 step).
    assert bool((err <= 0.53 * scale).all()), "a code is at most about half a step from its weight"


@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(lambda packed: packed ^ 0x1, id="low-nibble-flipped"),
        pytest.param(lambda packed: packed ^ (0xF << 28), id="high-nibble-flipped"),
        pytest.param(lambda packed: torch.flip(packed, dims=[-1]), id="words-reversed"),
    ],
)
def test_the_oracle_rejects_a_wrong_unpacking(mutant) -> None:
    parts = random_layer(7, 8, 128, 64)
    got = portable_int4.dequantize(mutant(parts["weight_packed"]), parts["weight_scale"], torch.float32)
    assert not torch.equal(got.double(), oracle_weight(parts["weight_packed"], parts["weight_scale"]))


def test_the_oracle_rejects_nibbles_read_high_first() -> None:
    parts = random_layer(11, 8, 128, 64)
    words = parts["weight_packed"].to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(7, -1, -1) * 4  # nibble 7 first: the wrong order
    codes = ((words.unsqueeze(-1) >> shifts) & 0xF).reshape(8, 128) - 8
    scale = parts["weight_scale"].float().repeat_interleave(64, dim=1)
    assert not torch.equal(
        (codes.float() * scale).double(), oracle_weight(parts["weight_packed"], parts["weight_scale"])
    )


def _vllm_wna16_kernel():
    """vLLM's CPU W4A16 linear where this process's op library registers its op, else the reason."""
    if cpu_emulation.applied():
        return None, f"the AVX2 emulation ({cpu_emulation.ENV_EMULATE}) leaves vLLM's CPU op library without it"
    try:
        import vllm._custom_ops  # noqa: F401  (loads the op library)
        from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
    except ImportError as e:
        return None, f"vLLM is not importable here: {e}"
    try:
        torch.ops._C.cpu_gemm_wna16  # noqa: B018
    except (AttributeError, RuntimeError):
        return None, f"this CPU's op library ({cpu_emulation.loaded_op_library()}) has no cpu_gemm_wna16"
    return CPUWNA16LinearKernel, None


@pytest.mark.parametrize("isa", ["vec", "amx"])
@pytest.mark.parametrize("group", GROUP_SIZES)
def test_portable_linear_agrees_with_vllms_kernel_where_it_runs(
    group: int, isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both on bf16 activations (the only ones cpu_gemm_wna16 serves), 64 output rows, 2 groups per row, on each
    of the kernel's x86 code paths: within bf16's rounding (2^-8) of the dot product's magnitude sum |x w| (the
    kernel rounds in bf16: measured here up to 0.0017 of it, as the bf16 rounding of the exact result alone
    reaches 0.0014), plus the fp32 accumulation bound. vLLM's W4A16 kernel, not its W4A8 one (which vLLM prefers
    on AMX for bf16, quantizing the activations to int8)."""
    kernel_cls, why = _vllm_wna16_kernel()
    if kernel_cls is None:
        pytest.skip(why)
    # AMX tiles must be asked of the kernel first (arch_prctl); without it the AMX path is an illegal instruction.
    if isa == "amx" and not (torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx()):
        pytest.skip("this CPU has no AMX tiles for this process")
    from vllm import envs

    monkeypatch.setenv("VLLM_CPU_INT4_W4A8", "0")
    monkeypatch.setattr(envs, "VLLM_CPU_INT4_W4A8", False, raising=False)
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.scalar_type import scalar_types

    out_features, in_features = 64, 2 * group
    parts = random_layer(group, out_features, in_features, group)
    config = MPLinearLayerConfig(
        full_weight_shape=(in_features, out_features),
        partition_weight_shape=(in_features, out_features),
        weight_type=scalar_types.uint4b8,
        act_type=torch.bfloat16,
        group_size=group,
        zero_points=False,
    )
    layer = torch.nn.Module()
    packed = torch.nn.Parameter(parts["weight_packed"].clone(), requires_grad=False)
    packed.input_dim, packed.output_dim, packed.packed_dim = 1, 0, 1  # type: ignore[attr-defined]
    scale = torch.nn.Parameter(parts["weight_scale"].clone(), requires_grad=False)
    scale.input_dim, scale.output_dim = 1, 0  # type: ignore[attr-defined]
    layer.register_parameter("weight_packed", packed)
    layer.register_parameter("weight_scale", scale)
    layer.bias = None
    native = kernel_cls(
        config, w_q_param_name="weight_packed", w_s_param_name="weight_scale", w_zp_param_name="weight_zero_point"
    )
    native.process_weights_after_loading(layer)
    assert not layer.use_w4a8
    layer.isa_hint = isa
    x = torch.randn(5, in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = native.apply_weights(layer, x).double()
    w = oracle_weight(parts["weight_packed"], parts["weight_scale"])
    portable = torch.nn.functional.linear(x.float(), w.float()).double()
    magnitude = x.double().abs() @ w.abs().T
    bound = (2.0**-8 + 2 * in_features * FP32_UNIT_ROUNDOFF) * magnitude
    assert math.isfinite(float(got.abs().max()))
    assert bool(((got - portable).abs() <= bound).all()), float(((got - portable).abs() / bound).max())
