"""Launch helpers that need no engine: thread binding, the serve command, the environment."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract_mod
from pytest_b70lab.engine import starts
from pytest_b70lab.engine.command import ServeConfig, TcpListen, vllm_serve_command
from pytest_b70lab.engine.environment import (
    XPU_CARDS_VARIABLE,
    XPU_DIST_BACKEND,
    XPU_PER_RANK_VARIABLES,
    engine_environment,
    ranks_need_blocking_allreduce,
    thread_binding,
    xpu_environment,
)


@pytest.mark.parametrize(
    ("cores", "world", "expected"),
    [
        ({0, 1}, 1, "0"),  # TP1 on two cores: the other core serves the engine core and the client
        ({0, 1}, 2, "0|1"),  # no core to spare: every core, and the all-reduce blocks (gloo) instead of spinning
        ({0, 1}, 4, "0|1|0|1"),
        ({0}, 2, "0|0"),
        ({4, 5, 6, 7, 8, 9, 10, 11}, 4, "4|5|6|7"),
        ({2, 3, 9}, 3, "2|3|9"),
    ],
)
def test_thread_binding_gives_ranks_their_own_cores_where_it_can(monkeypatch, cores, world, expected) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cores)
    assert thread_binding(world) == expected


@pytest.mark.parametrize(
    ("cores", "world", "blocking"),
    [
        ({0, 1}, 1, False),  # one rank: no all-reduce at all
        ({0, 1}, 2, True),  # two ranks + the engine core on two cores: a spinning rank starves its peer
        ({0, 1}, 4, True),
        ({0, 1, 2}, 2, False),  # a core per rank and one for the engine core: vLLM's SHM path is fastest
        (set(range(16)), 4, False),
    ],
)
def test_the_spinning_shm_allreduce_is_turned_off_when_ranks_lack_cores(
    monkeypatch, tmp_path, cores, world, blocking
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cores)
    assert ranks_need_blocking_allreduce(world) is blocking
    env = engine_environment(tmp_path, world, device="cpu", materialize=False)
    assert (env.get("VLLM_CPU_SHM_ALLREDUCE") == "0") is blocking
    assert "VLLM_CPU_SHM_ALLREDUCE" not in engine_environment(tmp_path, world, device="xpu", materialize=False)


def test_the_benchmark_mode_listens_on_loopback_and_keeps_its_key_off_the_command_line(tmp_path: Path) -> None:
    tcp = TcpListen.fresh()
    assert tcp.port > 0 and len(tcp.api_key) >= 24 and tcp != TcpListen.fresh()
    cmd = vllm_serve_command("m", tmp_path / "s.sock", ["--seed", "0"], tcp)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == str(tcp.port)
    assert "--uds" not in cmd and tcp.api_key not in " ".join(cmd) and "--api-key" not in cmd
    assert "--uds" in vllm_serve_command("m", tmp_path / "s.sock", [])


def test_serve_arguments_fix_the_measurement_conditions(tmp_path: Path) -> None:
    config = ServeConfig(
        model=tmp_path / "target",
        draft=tmp_path / "draft",
        tensor_parallel=2,
        expert_parallel=True,
        attention_backend="FLASH_ATTN",
    )
    args = config.args()
    for flag in (
        "--no-enable-prefix-caching",
        "--no-async-scheduling",
        "--enable-prompt-tokens-details",
        "--enable-expert-parallel",
    ):
        assert flag in args
    assert args[args.index("--max-num-seqs") + 1] == "1"
    assert args[args.index("--attention-backend") + 1] == "FLASH_ATTN"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": str((tmp_path / "draft").resolve()), "num_speculative_tokens": 11}
    cmd = vllm_serve_command(config.model_ref, tmp_path / "s.sock", args)
    assert cmd[1:5] == ["-m", "pytest_b70lab.vllm_entry", "serve", str((tmp_path / "target").resolve())]


def test_engine_environment_keeps_caches_inside_the_state_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_SOMETHING_FROM_OUTSIDE", "x")
    env = engine_environment(tmp_path, 2, device="cpu")
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH", "TMPDIR", "HF_HOME"):
        assert Path(env[var]).is_dir() and Path(env[var]).is_relative_to(tmp_path)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_SOMETHING_FROM_OUTSIDE" not in env, "the engine sees the contract's settings and nothing else"
    xpu = engine_environment(tmp_path / "x", 4, device="xpu", offline=False, materialize=False)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in xpu and "HF_HUB_OFFLINE" not in xpu
    assert not (tmp_path / "x").exists()


# --- the B70 launch profile: the production contract's dry run carries every contract setting -------------

PRODUCTION = "laguna-s-2.1-int4-fp8kv-b70"


def _dry_run(tmp_path: Path, monkeypatch) -> tuple[contract_mod.Contract, list[str], dict[str, str], str]:
    """The production contract, and the command and environment its dry run shows (read back from the text)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))  # the hub models are absent: nothing is read
    monkeypatch.delenv(XPU_CARDS_VARIABLE, raising=False)
    c = contract_mod.load(PRODUCTION)
    text = starts.describe(c, tmp_path / "cache")
    lines = text.splitlines()
    command = shlex.split(lines[lines.index("command:") + 1])
    at = next(i for i, line in enumerate(lines) if line.startswith("environment"))
    env = {}
    for line in lines[at + 1 :]:
        if not line.startswith("  "):
            break
        key, _, value = line.strip().partition("=")
        env[key] = value
    return c, command, env, text


def _value(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, f"{flag} appears {command.count(flag)} times in {command}"
    return command[command.index(flag) + 1]


def test_the_production_dry_run_carries_every_contract_setting(tmp_path: Path, monkeypatch) -> None:
    c, command, env, _ = _dry_run(tmp_path, monkeypatch)
    e, spec = c.engine, c.speculative
    assert c.draft is not None and spec is not None and c.chat is not None
    speculative = json.loads(_value(command, "--speculative-config"))

    def switch(flag: str, on: bool) -> bool:
        return (flag in command) is on

    def device_profile() -> bool:  # the device: its cards, one per rank, and its executor
        cards = env.get("ZE_AFFINITY_MASK", "").split(",")
        return (
            e.device == "xpu"
            and len(set(cards)) == e.tensor_parallel
            and switch("--distributed-executor-backend", True)
        )

    # Every engine and speculative field of the contract, and what it must produce; derived from the
    # contract's values, so a field added to the contract without a launch mapping fails here.
    engine_fields = {
        "device": device_profile,
        "dtype": lambda: _value(command, "--dtype") == e.dtype,
        "kv_cache_dtype": lambda: _value(command, "--kv-cache-dtype") == e.kv_cache_dtype,
        "block_size": lambda: _value(command, "--block-size") == str(e.block_size),
        "tensor_parallel": lambda: _value(command, "--tensor-parallel-size") == str(e.tensor_parallel),
        "expert_parallel": lambda: switch("--enable-expert-parallel", e.expert_parallel),
        "enable_prefix_caching": lambda: switch("--no-enable-prefix-caching", not e.enable_prefix_caching),
        "async_scheduling": lambda: switch("--no-async-scheduling", not e.async_scheduling),
        "max_num_seqs": lambda: _value(command, "--max-num-seqs") == str(e.max_num_seqs),
        "calculate_kv_scales": lambda: switch("--calculate-kv-scales", e.calculate_kv_scales),
        "max_model_len": lambda: _value(command, "--max-model-len") == str(e.max_model_len),
        "compile_mode": lambda: switch("--enforce-eager", e.compile_mode == "eager"),
        "attention_backend": lambda: _value(command, "--attention-backend") == e.attention_backend,
        "seed": lambda: _value(command, "--seed") == str(e.seed),
    }
    speculative_fields = {
        "method": lambda: speculative["method"] == spec.method,
        "num_speculative_tokens": lambda: speculative["num_speculative_tokens"] == spec.num_speculative_tokens,
        # not a flag: the verification block is the drafted tokens plus the target's own
        "verify_width": lambda: speculative["num_speculative_tokens"] + 1 == spec.verify_width,
    }
    assert set(engine_fields) == set(type(e).model_fields), "an engine field of the contract has no launch check"
    assert set(speculative_fields) == set(type(spec).model_fields)
    for name, check in {**engine_fields, **{f"speculative.{k}": v for k, v in speculative_fields.items()}}.items():
        assert check(), f"contract field {name} is not carried by the dry run: {command} {env}"

    # The models, by hub id and the contract's revisions.
    assert command[command.index("serve") + 1] == c.target.hub_id
    assert _value(command, "--revision") == c.target.revision
    assert (speculative["model"], speculative["revision"]) == (c.draft.hub_id, c.draft.revision)
    assert _value(command, "--tool-call-parser") == c.chat.tool_call_parser
    assert set(speculative) == {"method", "model", "revision", "num_speculative_tokens"}


def test_the_production_dry_run_selects_four_cards_and_xccl(tmp_path: Path, monkeypatch) -> None:
    c, command, env, text = _dry_run(tmp_path, monkeypatch)
    cards = env["ZE_AFFINITY_MASK"].split(",")
    assert c.engine.device == "xpu" and cards == [str(i) for i in range(c.engine.tensor_parallel)] == list("0123")
    assert env["ONEAPI_DEVICE_SELECTOR"] == "level_zero:gpu"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert (env["CCL_ATL_TRANSPORT"], env["CCL_ZE_IPC_EXCHANGE"]) == ("ofi", "sockets")
    assert _value(command, "--distributed-executor-backend") == "mp"
    assert f"torch.distributed backend {XPU_DIST_BACKEND}" in text and XPU_DIST_BACKEND == "xccl"
    assert not [k for k in env if k.startswith("VLLM_CPU_")], "no CPU setting reaches the XPU engine"


def test_the_profiles_backend_is_the_one_vllms_xpu_platform_uses() -> None:
    """vLLM picks xccl itself (no flag): the dry run's claim is checked against the installed vLLM's source."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here")
    source = (Path(spec.origin).parent / "platforms" / "xpu.py").read_text()
    assert re.search(rf'dist_backend: str = "{XPU_DIST_BACKEND}"', source)
    assert 'device_control_env_var: str = "ZE_AFFINITY_MASK"' in source


def test_the_xpu_profile_keeps_per_rank_variables_of_the_caller_away(tmp_path: Path, monkeypatch) -> None:
    for var in XPU_PER_RANK_VARIABLES:
        monkeypatch.setenv(var, "7")
    env = engine_environment(tmp_path, 4, device="xpu", materialize=False)
    assert not set(XPU_PER_RANK_VARIABLES) & set(env)
    assert env["ZE_AFFINITY_MASK"] == "0,1,2,3"
    assert xpu_environment(2, devices=[3, 1])["ZE_AFFINITY_MASK"] == "3,1"
    monkeypatch.setenv(XPU_CARDS_VARIABLE, "1,2,3,4")  # a host whose first Level Zero GPU is not a B70
    assert engine_environment(tmp_path, 4, device="xpu", materialize=False)["ZE_AFFINITY_MASK"] == "1,2,3,4"
    for bad in ([0, 1, 2], [0, 0, 1, 2], [-1, 0, 1, 2]):
        with pytest.raises(ValueError, match="4 distinct card indices"):
            xpu_environment(4, devices=bad)
    cpu = ServeConfig(model="m", tensor_parallel=4).args()
    assert _value(cpu, "--distributed-executor-backend") == "mp", "an installed Ray must not become the executor"
    assert "--distributed-executor-backend" not in ServeConfig(model="m", tensor_parallel=1).args()
