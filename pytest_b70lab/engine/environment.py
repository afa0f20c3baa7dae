"""The environment an engine start gets: thread binding, the communicator switches, the XPU launch
profile, the caches under the cache root's engine-state/, the CPU emulation's variables."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..in_engine import cpu_emulation


def thread_binding(world_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `world_size` ranks on the cores this process may use.

    vLLM's `auto` gives each rank its own NUMA node, and a one-node machine has one: bind by hand. With
    more cores than ranks, each rank gets a core of its own and the rest serve the engine core, the API
    server and the measuring client. Otherwise the ranks share every core round-robin, and the launch turns
    vLLM's spinning SHM all-reduce off (ranks_need_blocking_allreduce), so that a waiting rank blocks and
    the engine core can use its core. Measured on 2 cores, TP2+EP2+DFlash with gloo: `0|1` 215 / 217 tok/s
    and 49 s starts against `0|0` 218 / ~210 tok/s and 87-95 s starts (the ranks then compile on one core);
    with the SHM all-reduce `0|0` was 16.5 tok/s (notes/2026-11-30-cpu-shm-allreduce-spins.md)."""
    cores = sorted(os.sched_getaffinity(0))
    usable = cores[:world_size] if len(cores) > world_size else cores
    return "|".join(str(usable[i % len(usable)]) for i in range(world_size))


def ranks_need_blocking_allreduce(world_size: int) -> bool:
    """Whether the ranks (plus the engine core and API server, which need a core too) outnumber the cores.
    vLLM's SHM all-reduce busy-waits without yielding, so then a rank spins out its time slice on every
    all-reduce while the peer it waits for cannot run; gloo blocks instead. Measured on 2 cores, TP2+EP2
    mini (notes/2026-11-30-cpu-shm-allreduce-spins.md): DFlash 111.6 -> 194.9 tok/s, target-only 27.2 -> 58.5."""
    return world_size > 1 and len(os.sched_getaffinity(0)) < world_size + 1


# The B70 launch profile (device "xpu"). Each setting names where it comes from; paths such as
# vllm/platforms/xpu.py are vLLM 0.32's sources (the vllm-cpu build in .venv carries the XPU build's Python files).
# torch.distributed backend of the ranks: vLLM's XPU platform fixes it (`XPUPlatform.dist_backend = "xccl"`,
# vllm/platforms/xpu.py, set when torch.distributed.is_xccl_available()); there is no flag or variable for it.
# vLLM's XPU installation docs ("distributed-backend"): torch-ccl below torch 2.8, the built-in xccl from 2.8.
XPU_DIST_BACKEND = "xccl"
# The rank processes, on every platform: vLLM's own multiprocessing executor on one host, pinned so that an
# installed Ray cannot change it (`--distributed-executor-backend`; vllm/config/parallel.py picks Ray when it is
# installed and the process is in a Ray placement group; mp is the XPU docs' single-node example).
EXECUTOR_BACKEND = "mp"
# Per-rank inheritance that must not reach the ranks: vLLM's XPU worker sets LOCAL_RANK per rank and keeps an
# inherited LOCAL_WORLD_SIZE (vllm/v1/worker/xpu_worker.py init_device), and torch's XCCL process group turns
# them into CCL_PROCESS_LAUNCHER=none, CCL_LOCAL_RANK, CCL_LOCAL_SIZE (ProcessGroupXCCL.cpp), as oneCCL's
# docs require without an MPI launcher ("CCL_PROCESS_LAUNCHER"). A value from the caller's shell would give
# every rank the same one.
XPU_PER_RANK_VARIABLES = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "CCL_LOCAL_RANK", "CCL_LOCAL_SIZE", "CCL_PROCESS_LAUNCHER")
# A host whose B70s are not Level Zero GPUs 0..N-1 (an integrated GPU listed first) names them, in rank order.
XPU_CARDS_VARIABLE = "B70LAB_XPU_CARDS"


def xpu_environment(world_size: int, devices: Iterable[int] | None = None) -> dict[str, str]:
    """The XPU variables of an engine start with `world_size` ranks, one card each: `devices`, else the cards
    listed in B70LAB_XPU_CARDS ("1,2,3,4"), else 0..N-1. Rank i runs on the i-th listed card: vLLM's XPU worker
    maps its local rank through ZE_AFFINITY_MASK (XPUPlatform.device_control_env_var, vllm/platforms/interface.py
    logical_device_id_to_visible_device_id), so the engine process sees all of them."""
    if devices is None and os.environ.get(XPU_CARDS_VARIABLE):
        devices = [int(d) for d in os.environ[XPU_CARDS_VARIABLE].split(",")]
    cards = list(range(world_size)) if devices is None else [int(d) for d in devices]
    if len(cards) != world_size or len(set(cards)) != world_size or min(cards, default=0) < 0:
        raise ValueError(f"the XPU profile needs {world_size} distinct card indices, one per rank; got {cards}")
    return {
        # Level Zero's device visibility (Level Zero specification, "Environment Variables"): the cards this
        # engine may use, in rank order. vLLM's device control variable on XPU (vllm/platforms/xpu.py).
        "ZE_AFFINITY_MASK": ",".join(map(str, cards)),
        # SYCL (so torch.xpu) sees Level Zero GPUs only (oneAPI DPC++ runtime docs, "Environment Variables",
        # ONEAPI_DEVICE_SELECTOR): no OpenCL or CPU device in the enumeration that the mask's indices refer to.
        "ONEAPI_DEVICE_SELECTOR": "level_zero:gpu",
        # vLLM starts its XPU workers with spawn only ("spawn is the only supported multiprocessing method on
        # XPU", vllm/platforms/xpu.py, which sets it when unset): said here, so the evidence records it.
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        # oneCCL's transport for the ranks' host-side exchange (oneCCL docs, "Environment Variables" /
        # "Transport Selection": mpi is the default and needs an MPI launcher; ofi is libfabric). vLLM's XPU
        # worker sets ofi when it is unset (vllm/v1/worker/xpu_worker.py).
        "CCL_ATL_TRANSPORT": "ofi",
        # How oneCCL hands Level Zero IPC handles between the ranks for the device all-reduce (oneCCL docs,
        # "CCL_ZE_IPC_EXCHANGE": drmfd, pidfd, sockets). The default pidfd (from 2021.14; Linux >= 5.6)
        # duplicates descriptors with pidfd_getfd, which needs ptrace access to the peer (pidfd_getfd(2)) and
        # Yama's default ptrace_scope=1 refuses it between sibling processes such as vLLM's workers; sockets
        # has no such precondition.
        "CCL_ZE_IPC_EXCHANGE": "sockets",
    }


def xpu_profile_summary(world_size: int) -> str:
    """One line for the dry run: what the XPU profile selects that the environment alone does not show."""
    return (
        f"xpu profile: {world_size} ranks on cards {xpu_environment(world_size)['ZE_AFFINITY_MASK']} "
        f"(rank i on the i-th), torch.distributed backend {XPU_DIST_BACKEND} (chosen by vLLM's XPU platform, "
        f"needs torch >= 2.8 built with XCCL), executor {EXECUTOR_BACKEND}"
    )


# What a Ray worker's environment carries that an engine started from it must not inherit (issue 50, Ray 2.60):
# Ray's own variables (RAY_*: the job, the raylet's pid, its auth mode and token), the thread count Ray forces on
# a worker (OMP_NUM_THREADS=1, ray/_private/utils.py set_omp_num_threads_if_unset) and the device masks its
# accelerator managers set for the task's resources (ray/_private/accelerators/*.py: an empty
# CUDA_VISIBLE_DEVICES for a task that asked for no GPU would hide every card). Written out rather than read from
# Ray, which this module never imports; tests/unit/test_fleet_environment.py holds the masks to the installed
# Ray's own list. Dropped only when the caller is a Ray worker (RAY_RAYLET_PID set), so that a lab's own
# OMP_NUM_THREADS or device mask outside Ray still reaches its engine as before.
RAY_WORKER_MARK = "RAY_RAYLET_PID"
RAY_SET_VARIABLES = ("OMP_NUM_THREADS",)
RAY_DEVICE_MASKS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "NEURON_RT_VISIBLE_CORES",
    "TPU_VISIBLE_CHIPS",
    "ASCEND_RT_VISIBLE_DEVICES",
    "HABANA_VISIBLE_MODULES",
    "FURIOSA_DEVICES",
    "RBLN_DEVICES",
    "QBRUNTIME_VISIBLE_DEVICES",
    "TT_VISIBLE_DEVICES",
)


def without_ray(env: dict[str, str]) -> dict[str, str]:
    """`env` less what Ray sets for its workers, when it is a Ray worker's; otherwise unchanged."""
    if RAY_WORKER_MARK not in env:
        return dict(env)
    dropped = set(RAY_SET_VARIABLES) | set(RAY_DEVICE_MASKS)
    return {k: v for k, v in env.items() if not k.startswith("RAY_") and k not in dropped}


def engine_environment(
    state_dir: Path,
    world_size: int,
    extra: dict[str, str] | None = None,
    *,
    device: str = "cpu",
    offline: bool = True,
    materialize: bool = True,
) -> dict[str, str]:
    """The engine's environment: the caller's less what Ray sets for a worker (without_ray), every cache inside
    `state_dir`, dev endpoints on; on CPU, the KV budget and thread binding; on XPU, the B70 profile (xpu_environment). With materialize=False nothing is created
    (to show a dry run's environment)."""
    caches = {
        "VLLM_CACHE_ROOT": "vllm",
        "TORCHINDUCTOR_CACHE_DIR": "inductor",
        "TRITON_CACHE_DIR": "triton",
        "XDG_CACHE_HOME": "xdg",
        "TMPDIR": "tmp",
        "VLLM_RPC_BASE_PATH": "ipc",
    }
    if offline:  # a hub model keeps the caller's HF_HOME: that is where its weights are
        caches["HF_HOME"] = "hf"
    state_dir = Path(state_dir).resolve() if materialize else Path(state_dir)
    emulation = cpu_emulation.requested() if device == "cpu" else None
    if emulation:  # compiled code of the real CPU must never be loaded into the emulated one, nor the reverse
        state_dir = state_dir / f"emulate-{emulation}"
    env = {k: v for k, v in without_ray(dict(os.environ)).items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_"))}
    for var, sub in caches.items():
        path = state_dir / sub
        if materialize:
            path.mkdir(parents=True, exist_ok=True)
        env[var] = str(path)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"})
    if offline:
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if device == "cpu":
        env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": thread_binding(world_size)})
        if ranks_need_blocking_allreduce(world_size):
            env["VLLM_CPU_SHM_ALLREDUCE"] = "0"  # in_engine.fixes (patch 0006) reads it
    elif device == "xpu":
        for var in XPU_PER_RANK_VARIABLES:
            env.pop(var, None)
        env.update(xpu_environment(world_size))
    if emulation:  # read by torch, oneDNN and Inductor as they load: the in-process part is in_engine.cpu_emulation's
        env.update(cpu_emulation.EMULATION_ENVIRONMENT[emulation])
    if os.environ.get("B70LAB_VLLM_FIXES"):
        env["B70LAB_VLLM_FIXES"] = os.environ["B70LAB_VLLM_FIXES"]
    env.update(extra or {})
    return env
