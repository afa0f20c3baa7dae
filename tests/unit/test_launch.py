"""Launch helpers that need no engine: thread binding, the serve command, the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_b70lab import launch


@pytest.mark.parametrize(("cores", "world", "expected"), [
    ({0, 1}, 1, "0"),            # TP1 on two cores: the other core serves the engine core and the client
    ({0, 1}, 2, "0|1"),          # no core to spare: every core, and the all-reduce blocks (gloo) instead of spinning
    ({0, 1}, 4, "0|1|0|1"),
    ({0}, 2, "0|0"),
    ({4, 5, 6, 7, 8, 9, 10, 11}, 4, "4|5|6|7"),
    ({2, 3, 9}, 3, "2|3|9"),
])
def test_thread_binding_gives_ranks_their_own_cores_where_it_can(monkeypatch, cores, world, expected) -> None:
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _pid: cores)
    assert launch.thread_binding(world) == expected


@pytest.mark.parametrize(("cores", "world", "blocking"), [
    ({0, 1}, 1, False),          # one rank: no all-reduce at all
    ({0, 1}, 2, True),           # two ranks + the engine core on two cores: a spinning rank starves its peer
    ({0, 1}, 4, True),
    ({0, 1, 2}, 2, False),       # a core per rank and one for the engine core: vLLM's SHM path is fastest
    (set(range(16)), 4, False),
])
def test_the_spinning_shm_allreduce_is_turned_off_when_ranks_lack_cores(monkeypatch, tmp_path, cores, world,
                                                                        blocking) -> None:
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda _pid: cores)
    assert launch.ranks_need_blocking_allreduce(world) is blocking
    env = launch.engine_environment(tmp_path, world, device="cpu", materialize=False)
    assert (env.get("VLLM_CPU_SHM_ALLREDUCE") == "0") is blocking
    assert "VLLM_CPU_SHM_ALLREDUCE" not in launch.engine_environment(tmp_path, world, device="xpu",
                                                                     materialize=False)


def test_the_benchmark_mode_listens_on_loopback_and_keeps_its_key_off_the_command_line(tmp_path: Path) -> None:
    tcp = launch.TcpListen.fresh()
    assert tcp.port > 0 and len(tcp.api_key) >= 24 and tcp != launch.TcpListen.fresh()
    cmd = launch.vllm_serve_command("m", tmp_path / "s.sock", ["--seed", "0"], tcp)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == str(tcp.port)
    assert "--uds" not in cmd and tcp.api_key not in " ".join(cmd) and "--api-key" not in cmd
    assert "--uds" in launch.vllm_serve_command("m", tmp_path / "s.sock", [])


def test_serve_arguments_fix_the_measurement_conditions(tmp_path: Path) -> None:
    config = launch.ServeConfig(model=tmp_path / "target", draft=tmp_path / "draft", tensor_parallel=2,
                                expert_parallel=True, attention_backend="FLASH_ATTN")
    args = config.args()
    for flag in ("--no-enable-prefix-caching", "--no-async-scheduling", "--enable-prompt-tokens-details",
                 "--enable-expert-parallel"):
        assert flag in args
    assert args[args.index("--max-num-seqs") + 1] == "1"
    assert args[args.index("--attention-backend") + 1] == "FLASH_ATTN"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": str((tmp_path / "draft").resolve()), "num_speculative_tokens": 11}
    cmd = launch.vllm_serve_command(config.model_ref, tmp_path / "s.sock", args)
    assert cmd[1:5] == ["-m", "pytest_b70lab.vllm_entry", "serve", str((tmp_path / "target").resolve())]


def test_engine_environment_keeps_caches_inside_the_state_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_SOMETHING_FROM_OUTSIDE", "x")
    env = launch.engine_environment(tmp_path, 2, device="cpu")
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH", "TMPDIR", "HF_HOME"):
        assert Path(env[var]).is_dir() and Path(env[var]).is_relative_to(tmp_path)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_SOMETHING_FROM_OUTSIDE" not in env, "the engine sees the contract's settings and nothing else"
    xpu = launch.engine_environment(tmp_path / "x", 4, device="xpu", offline=False, materialize=False)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in xpu and "HF_HUB_OFFLINE" not in xpu
    assert not (tmp_path / "x").exists()
