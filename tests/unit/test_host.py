"""Which CPU a start ran on, and which FP8 attention path it would take there."""

from __future__ import annotations

from pytest_b70lab.evidence import host

# The two kinds of machine this project has met, as their /proc/cpuinfo says it (abridged to the lines read).
AVX512_CPUINFO = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
    "flags\t\t: fpu sse2 avx f16c fma avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni\n"
)
AVX2_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx f16c fma avx2 bmi2 sha_ni\n"
AMX_CPUINFO = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
    "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
)


def test_identity_reads_the_model_and_the_flags_that_matter() -> None:
    avx512 = host.cpu_identity(AVX512_CPUINFO, environ={})
    assert avx512 == {
        "model": "AMD EPYC",
        "flags": ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"],
        "avx512": True,
        "amx": False,
        "emulated": None,
    }
    avx2 = host.cpu_identity(AVX2_CPUINFO, environ={})
    assert (avx2["avx512"], avx2["amx"], avx2["flags"]) == (False, False, ["avx2", "fma", "f16c"])
    assert host.cpu_identity(AMX_CPUINFO, environ={})["amx"] is True
    assert host.cpu_identity("", environ={})["model"] is None, "an unreadable cpuinfo is an unknown CPU, not a crash"


def test_the_fp8_path_forecast_follows_cpu_emulation_and_the_switch() -> None:
    on = {"B70LAB_EMULATE_CPU": "avx2"}
    cases = [
        (AVX512_CPUINFO, {}, "native"),
        (AMX_CPUINFO, {}, "native"),
        (AVX2_CPUINFO, {}, "portable"),
        (AVX512_CPUINFO, on, "portable"),
        (AVX512_CPUINFO, {"B70LAB_FP8_ATTENTION": "portable"}, "portable"),
    ]
    for cpuinfo, environ, path in cases:
        identity = host.cpu_identity(cpuinfo, environ=environ)
        assert host.fp8_path("cpu", "fp8", identity, environ)[0] == path, (cpuinfo, environ)
    identity = host.cpu_identity(AVX2_CPUINFO, environ={})
    assert host.fp8_path("xpu", "fp8", identity, {})[0] == "native", "the B70's kernels are not the CPU's"
    assert host.fp8_path("cpu", "auto", identity, {})[0] == "none"
    why = host.fp8_path("cpu", "fp8", host.cpu_identity(AVX512_CPUINFO, environ=on), on)[1]
    assert why == "vLLM's CPU ops refuse an FP8 cache on AMD EPYC (AVX-512, no AMX), emulating AVX2"
