"""The preflight collective probe: the seed's rule that a fabric is trusted again only after "a single
corrected probe passes with four clean teardowns".

`probe_collectives` starts the contract's rank count as plain processes (no engine, no model), each in its
own process group, and has them run one all_reduce with a known answer through the communicator the
engine's tensor-parallel all_reduce uses: vLLM's own TP group (on CPU its CpuCommunicator, shared memory or,
where launch turns that off, gloo; `xccl` on the B70), initialised with the same environment an engine
start gets. Each rank writes what it reached to its own file as it goes (started, initialised, entered,
completed with the right sum, torn down), so a stall says which rank stopped where, within seconds, and
every process is killed and checked gone at the end whatever happened.

Run as `python -m pytest_b70lab.engine.probe RANK WORLD INIT_METHOD OUT_DIR [STALL_RANK]` it is one rank.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..contract.defaults import PROBE_DEADLINE_S
from ..errors import LabError
from ..isolation import processes

# The module each rank runs as (`python -m`): what the fault matrix looks for in process command lines.
RANK_MODULE = "pytest_b70lab.engine.probe"
TEARDOWN_GRACE_S = 10.0  # how long a rank's process group may outlive the rank before the probe fails
STAGES = ("started", "initialized", "entered", "completed", "torn_down")
PROBE_FILE = "probe.json"


@dataclass
class RankState:
    rank: int
    pid: int | None = None
    reached: list[str] = field(default_factory=list)
    communicator: str | None = None
    value: float | None = None
    correct: bool | None = None
    error: str | None = None
    exit_code: int | None = None
    gone: bool = False

    @property
    def last(self) -> str:
        return self.reached[-1] if self.reached else "not started"

    def describe(self) -> str:
        if self.error:
            return f"rank {self.rank}: failed after {self.last}: {self.error}"
        if "completed" in self.reached and not self.correct:
            return f"rank {self.rank}: all_reduce returned {self.value}, not the expected sum"
        if "torn_down" in self.reached:
            return f"rank {self.rank}: ok ({self.communicator})"
        nxt = STAGES[STAGES.index(self.last) + 1] if self.last in STAGES[:-1] else STAGES[0]
        return f"rank {self.rank}: stopped after {self.last}, never {nxt.replace('_', ' ')}"


@dataclass
class ProbeResult:
    world_size: int
    passed: bool
    seconds: float
    ranks: list[RankState]
    problems: list[str]
    injected: str | None = None

    def as_dict(self) -> dict:
        return {**asdict(self), "ranks": [asdict(r) for r in self.ranks]}

    def lines(self) -> list[str]:
        head = (
            f"collective probe, {self.world_size} ranks: "
            + ("passed" if self.passed else "FAILED")
            + f" in {self.seconds:.1f} s"
            + (f" (injected: {self.injected})" if self.injected else "")
        )
        return [head, *("  " + r.describe() for r in self.ranks), *("  " + p for p in self.problems)]


class ProbeError(LabError, RuntimeError):
    """The probe did not pass: its message is the per-rank account."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return events


def _state(rank: int, events: list[dict]) -> RankState:
    state = RankState(rank)
    for e in events:
        stage = e.get("stage")
        if stage in STAGES and stage not in state.reached:
            state.reached.append(stage)
        state.pid = e.get("pid", state.pid)
        state.communicator = e.get("communicator", state.communicator)
        if stage == "completed":
            state.value, state.correct = e.get("value"), e.get("correct")
        if stage == "error":
            state.error = e.get("error")
    return state


def _watch(
    procs: list[subprocess.Popen],
    out_dir: Path,
    world_size: int,
    t0: float,
    deadline_s: float,
    collective_s: float,
    problems: list[str],
) -> None:
    """Until every rank has exited, or a deadline: the whole probe's, or the all_reduce's from the moment
    the first rank entered it."""
    entered_at: float | None = None
    while not all(p.poll() is not None for p in procs):
        states = [_state(r, _read_events(out_dir / f"rank-{r}.jsonl")) for r in range(world_size)]
        now = time.monotonic()
        if entered_at is None and any("entered" in s.reached for s in states):
            entered_at = now
        if entered_at is not None and now - entered_at > collective_s:
            problems.append(f"the all_reduce did not complete within {collective_s:g} s of the first rank entering it")
            return
        if now - t0 > deadline_s:
            problems.append(f"the probe did not finish within its {deadline_s:g} s deadline")
            return
        time.sleep(0.2)


def probe_collectives(
    world_size: int,
    out_dir: Path,
    env: dict[str, str],
    *,
    deadline_s: float = PROBE_DEADLINE_S,
    collective_s: float = 20.0,
    stall_rank: int | None = None,
) -> ProbeResult:
    """Run the probe; never raises for a failed probe (see ProbeResult.passed). `deadline_s` bounds the whole
    probe (imports and rendezvous included); `collective_s` bounds the all_reduce itself, from the moment
    the first rank enters it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("rank-*.jsonl"):
        old.unlink()
    init = f"tcp://127.0.0.1:{_free_port()}"
    # vLLM's group set-up binds ZMQ IPC sockets under VLLM_RPC_BASE_PATH; AF_UNIX paths hold ~107 bytes.
    ipc = tempfile.mkdtemp(prefix="b70probe-")
    env = {**env, "VLLM_RPC_BASE_PATH": ipc}
    t0 = time.monotonic()
    procs = []
    for rank in range(world_size):
        args = [sys.executable, "-m", RANK_MODULE, str(rank), str(world_size), init, str(out_dir)]
        if stall_rank is not None:
            args.append(str(stall_rank))
        with open(out_dir / f"rank-{rank}.log", "w") as log:
            procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    problems: list[str] = []
    try:
        _watch(procs, out_dir, world_size, t0, deadline_s, collective_s, problems)
    finally:  # also on Ctrl-C or SIGTERM: no rank outlives the probe
        for p in procs:
            if p.poll() is None:
                processes.end_group(p)
        shutil.rmtree(ipc, ignore_errors=True)
    states = [_state(r, _read_events(out_dir / f"rank-{r}.jsonl")) for r in range(world_size)]
    for state, p in zip(states, procs, strict=False):
        state.exit_code = p.returncode
        state.gone = processes.group_gone_within(p.pid, TEARDOWN_GRACE_S)
        if not state.gone:
            left = [f"{m.pid} {m.name}" for m in processes.group_members(p.pid)]
            processes.signal_group(p.pid)  # the rank itself is gone, so nothing waits on it: kill what it left
            problems.append(
                f"rank {state.rank}: process group {p.pid} still had processes "
                f"{TEARDOWN_GRACE_S:g} s after the rank exited (killed: {', '.join(left) or '?'})"
            )
    ok = all("torn_down" in s.reached and s.correct and s.exit_code == 0 and not s.error for s in states)
    injected = f"rank {stall_rank} stalls before the all_reduce" if stall_rank is not None else None
    result = ProbeResult(world_size, ok and not problems, round(time.monotonic() - t0, 2), states, problems, injected)
    (out_dir / PROBE_FILE).write_text(json.dumps(result.as_dict(), indent=1) + "\n")
    return result


# --- one rank ---------------------------------------------------------------------------------------------


def _rank_main(argv: list[str]) -> int:
    rank, world, init, out = int(argv[0]), int(argv[1]), argv[2], Path(argv[3])
    stall_rank = int(argv[4]) if len(argv) > 4 else None
    events = open(out / f"rank-{rank}.jsonl", "a", encoding="utf-8")

    def note(stage: str, **extra) -> None:
        events.write(json.dumps({"stage": stage, "pid": os.getpid(), "t": time.time(), **extra}) + "\n")
        events.flush()

    note("started")
    try:
        import torch
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.distributed import parallel_state as ps
        from vllm.platforms import current_platform
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # the project's vLLM fixes, as in an engine start (the all-reduce switch)
        # The engine's own choices: the platform's backend (gloo on CPU, xccl on XPU) and, on a device,
        # rank i on the i-th visible card (vLLM's workers set their local rank's device the same way).
        device = torch.device("cpu")
        if current_platform.device_type != "cpu":
            device = torch.device(current_platform.device_type, rank)
            getattr(torch, current_platform.device_type).set_device(device)
        with set_current_vllm_config(VllmConfig()):
            ps.init_distributed_environment(world, rank, init, rank, backend=current_platform.dist_backend)
            ps.ensure_model_parallel_initialized(world, 1)
            group = ps.get_tp_group()
            comm = group.device_communicator
            dist = getattr(comm, "dist_module", None)  # torch.distributed (gloo) or vLLM's SHM all-reduce
            path = getattr(dist, "__name__", type(dist).__name__)
            note("initialized", communicator=f"{type(comm).__name__} via {path}")
            if rank == stall_rank:  # the seed's stall: one rank never reaches its first collective
                while True:
                    time.sleep(3600)
            note("entered")
            total = group.all_reduce(torch.full((8,), float(rank + 1), device=device)).cpu()
            expected = world * (world + 1) / 2
            note("completed", value=float(total[0]), correct=bool(torch.all(total == expected)), device=str(device))
            ps.destroy_model_parallel()
            ps.destroy_distributed_environment()
        note("torn_down")
        return 0
    except Exception as e:  # recorded for the parent, which reports it per rank
        note("error", error=f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
