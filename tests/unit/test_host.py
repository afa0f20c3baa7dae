"""Which CPU a start ran on, and which FP8 attention path it would take there."""

from __future__ import annotations

from pathlib import Path

from pytest_b70lab.evidence import host

# The two kinds of machine this project has met, as their /proc/cpuinfo says it (abridged to the lines read).
AVX512_CPUINFO = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
    "stepping\t: 1\nflags\t\t: fpu sse2 avx f16c fma avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni\n\n"
    "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
)
AVX2_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx f16c fma avx2 bmi2 sha_ni\n"
AMX_CPUINFO = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
    "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
)


def test_identity_reads_the_model_and_the_flags_that_matter(tmp_path: Path) -> None:
    avx512 = host.cpu_identity(AVX512_CPUINFO, environ={}, drm=tmp_path / "no-drm")
    assert avx512 == {
        "model": "AMD EPYC",
        "vendor": "AuthenticAMD",
        "family": "25",
        "model_number": "17",
        "stepping": "1",
        "cores": 2,
        "flags": ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"],
        "avx512": True,
        "amx": False,
        "emulated": None,
        "gpus": [],
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


def _card(drm: Path, name: str, vendor: str, device: str, driver: str | None) -> None:
    folder = drm / name / "device"
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(f"0x{vendor}\n")
    (folder / "device").write_text(f"0x{device}\n")
    if driver:
        (drm / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (folder / "driver").symlink_to(drm / "drivers" / driver)


def test_gpus_are_read_by_pci_id_and_driver_and_connectors_are_not_cards(tmp_path: Path) -> None:
    drm = tmp_path / "drm"
    _card(drm, "card1", "8086", "e20b", "xe")
    _card(drm, "card0", "8086", "e20b", "xe")
    _card(drm, "card2", "1af4", "1050", None)
    (drm / "card0-DP-1").mkdir()
    (drm / "renderD128").mkdir()
    assert host.gpus(drm) == ["1af4:1050 (no driver)", "8086:e20b (xe)", "8086:e20b (xe)"]
    assert host.gpus(tmp_path / "absent") == []


def test_a_host_class_names_what_differs_and_reads_old_evidence_as_its_own_class(tmp_path: Path) -> None:
    epyc = host.cpu_identity(AVX512_CPUINFO, environ={}, drm=tmp_path)
    xeon = host.cpu_identity(AMX_CPUINFO, environ={}, drm=tmp_path)
    here = host.host_class(epyc, "native (_C)")
    assert here == host.host_class(dict(epyc), "native (_C) / native (_C)"), "recomputed, the same class"
    assert here.label == "AMD EPYC (AVX-512, no AMX), 2 cores, FP8 attention native"
    assert here.not_compared(host.host_class(epyc, "native (_C)")) is None
    why = here.not_compared(host.host_class(xeon, "native (_C)"), "sealed", "this run")
    assert why is not None and why.startswith("not compared: sealed on AMD EPYC (AVX-512, no AMX), 2 cores")
    assert "model: 'AMD EPYC' vs 'Intel(R) Xeon(R) Platinum 8481C'" in why and "amx: False vs True" in why
    assert "stepping: '1' vs None" in why
    emulated = host.host_class(
        host.cpu_identity(AVX512_CPUINFO, environ={"B70LAB_EMULATE_CPU": "avx2"}, drm=tmp_path),
        "portable (_C_AVX2, emulating avx2)",
    )
    assert here.differences(emulated) == ["emulated: None vs 'avx2'", "fp8 attention: 'native' vs 'portable'"]
    old = {k: v for k, v in epyc.items() if k in ("model", "flags", "avx512", "amx", "emulated")}
    assert host.host_class(old, "native (_C)").not_compared(here), "a start recorded before the fields is its own class"
    assert host.host_class(epyc, "native (_C) / portable (_C_AVX2)").label.endswith("FP8 attention mixed")


def test_a_box_is_named_by_its_label_and_told_apart_by_its_machine_id_and_kernel(tmp_path: Path) -> None:
    import os

    (tmp_path / "machine-id").write_text("0123456789abcdef\n")
    uname = os.uname_result(("Linux", "box-a", "6.1.0", "#1 SMP", "x86_64"))
    box = host.box_identity({"B70LAB_BOX": "b70-01"}, (tmp_path / "machine-id",), uname)
    assert box["label"] == "b70-01" and len(box["digest"]) == 16
    assert "0123456789abcdef" not in str(box), "the machine id is hashed, never written"
    assert host.box_identity({}, (tmp_path / "machine-id",), uname) == {"label": None, "digest": box["digest"]}
    (tmp_path / "other-id").write_text("fedcba9876543210\n")
    assert host.box_identity({}, (tmp_path / "other-id",), uname)["digest"] != box["digest"]
    rebuilt = os.uname_result(("Linux", "box-a", "6.1.0", "#2 SMP", "x86_64"))
    assert host.box_identity({}, (tmp_path / "machine-id",), rebuilt)["digest"] != box["digest"], "another kernel"
    assert host.describe_box(box) == f"box b70-01 [{box['digest']}]"
    assert host.box_of({"model": "AMD EPYC"}) is None, "evidence from before starts recorded their box"
    assert host.box_of({"box": box}) == box
    assert host.machine_line({"model": "AMD EPYC", "avx512": True, "box": box}) == (
        f"AMD EPYC (AVX-512, no AMX), box b70-01 [{box['digest']}]"
    )
    assert host.machine_line(None) == "CPU not recorded"
