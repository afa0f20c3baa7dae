"""Real faults, injected into a real engine for the harness's own fault tests: a vLLM general plugin that does
nothing unless `B70LAB_FAULT` names a fault.

    B70LAB_FAULT=NAME[:RANK[:AT]]

  collective-stall:R     rank R never completes its first collective (the seed's stall)
  die-loading:R          rank R dies (exit 17) while loading weights
  raise-loading:R        rank R raises InjectedFault (this module's) while loading weights
  raise-kv-cache:R       rank R raises NotImplementedError while its KV cache is allocated, where vLLM's CPU
                         attention refuses an FP8 cache on a CPU without AVX-512 or AMX (`_get_attn_isa`)
  die-decode:R[:N]       rank R is SIGKILLed at its N-th model step after the engine is serving (default 20)
  engine-core-exit[:N]   the engine core process exits (code 3) at its N-th busy step (default 20)
  stream-cut[:N]         the API server exits after sending N chunks of a streamed completion (default 10)
  memory-cgroup:R        rank R moves itself into the memory cgroup named by B70LAB_FAULT_CGROUP (a folder the
                         test made, with its limit) as it begins to load its weights: what it allocates from
                         then on counts against that limit, and the kernel's OOM killer kills it there
  slow-decode:R:P[:S]    rank R sleeps P % of each model step's own time after the step, in start S only
                         (every start without S): a real slowdown to factor 1 + P/100 of every step, since the
                         other ranks wait for R in the step's collectives

A start is known by the engine's working directory, the start's folder `start-S` of the run (the launcher
runs the server there; its ranks inherit it).

(A server that never becomes ready needs no hook: the fault tests give the start a deadline it cannot meet.)

Each fault writes one line `b70lab fault injected: ...` to its process's log when it fires, so a rank's last
lines in the evidence show where it happened. Everything is patched in the process that the fault concerns:
vLLM loads general plugins in the API server, the engine core and every worker.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

ENV = "B70LAB_FAULT"
CGROUP_ENV = "B70LAB_FAULT_CGROUP"
FAULTS = (
    "memory-cgroup",
    "collective-stall",
    "die-loading",
    "raise-loading",
    "raise-kv-cache",
    "die-decode",
    "engine-core-exit",
    "stream-cut",
    "slow-decode",
)
log = logging.getLogger("vllm.b70lab_faults")


class InjectedFault(Exception):
    """What raise-loading raises: an exception class of no list (a traceback names it with its module)."""


@dataclass(frozen=True)
class Fault:
    name: str
    rank: int | None = None
    at: int | None = None
    start: int | None = None  # the start (1, 2, ...) the fault is armed in; None: every start


def parse(spec: str | None) -> Fault | None:
    if not spec:
        return None
    parts = spec.split(":")
    if parts[0] not in FAULTS:
        raise ValueError(f"{ENV}={spec!r}: unknown fault {parts[0]!r}; known: {', '.join(FAULTS)}")
    if parts[0] in ("engine-core-exit", "stream-cut"):
        return Fault(parts[0], None, int(parts[1]) if len(parts) > 1 else None)
    if len(parts) < 2:
        raise ValueError(f"{ENV}={spec!r}: {parts[0]} needs a rank ({parts[0]}:RANK)")
    if parts[0] == "slow-decode":
        if len(parts) < 3 or int(parts[2]) <= 0:
            raise ValueError(
                f"{ENV}={spec!r}: slow-decode needs a rank and a positive percentage (slow-decode:RANK:PERCENT[:START])"
            )
        return Fault(parts[0], int(parts[1]), int(parts[2]), int(parts[3]) if len(parts) > 3 else None)
    return Fault(parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else None)


def this_start() -> int | None:
    """The start this engine process belongs to, from its working directory (`start-S`), or None."""
    name = os.path.basename(os.getcwd())
    prefix, _, index = name.rpartition("-")
    return int(index) if prefix == "start" and index.isdigit() else None


def _fired(what: str) -> None:
    log.warning("b70lab fault injected: %s (pid %d)", what, os.getpid())
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()


def _tp_rank() -> int | None:
    try:
        from vllm.distributed import parallel_state as ps

        return ps.get_tp_group().rank_in_group
    except Exception:  # before the groups exist
        return None


def _collective_stall(fault: Fault) -> None:
    """Rank R blocks forever in its first collective of any group, at the communicator: under expert
    parallelism a Laguna layer's reduction goes through the EP group's dispatch/combine, not a TP all_reduce."""
    import torch.distributed as dist
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    names = ("all_reduce", "all_gather", "gather", "reduce_scatter", "dispatch", "combine", "dispatch_router_logits")
    for cls in (CpuCommunicator, DeviceCommunicatorBase):
        for name in names:
            original = cls.__dict__.get(name)
            if original is None:
                continue

            def stalled(self, *args, _original=original, _name=name, **kwargs):
                if self.world_size > 1 and dist.is_initialized() and dist.get_rank() == fault.rank:
                    _fired(f"rank {fault.rank} never completes its first collective ({_name})")
                    while True:
                        time.sleep(3600)
                return _original(self, *args, **kwargs)

            setattr(cls, name, stalled)


def _die_loading(fault: Fault) -> None:
    from vllm.v1.worker.gpu_worker import Worker

    original = Worker.load_model

    def load_model(self, *args, **kwargs):
        if getattr(self, "rank", None) == fault.rank:
            _fired(f"rank {fault.rank} dies while loading weights")
            os._exit(17)
        return original(self, *args, **kwargs)

    Worker.load_model = load_model


def _raise_loading(fault: Fault) -> None:
    from vllm.v1.worker.gpu_worker import Worker

    original = Worker.load_model

    def load_model(self, *args, **kwargs):
        if getattr(self, "rank", None) == fault.rank:
            _fired(f"rank {fault.rank} raises while loading weights")
            raise InjectedFault(f"b70lab fault injected: rank {fault.rank} cannot load its weights")
        return original(self, *args, **kwargs)

    Worker.load_model = load_model


def _memory_cgroup(fault: Fault) -> None:
    """Charges made after the move count against the cgroup's limit (neither cgroup v1 nor v2 moves what the
    process held before by default): the weights and the KV cache allocated next are what exhaust it."""
    from vllm.v1.worker.gpu_worker import Worker

    folder = os.environ.get(CGROUP_ENV)
    if not folder:
        raise ValueError(f"{ENV}=memory-cgroup needs {CGROUP_ENV}, the memory cgroup's folder")
    original = Worker.load_model

    def load_model(self, *args, **kwargs):
        if getattr(self, "rank", None) == fault.rank:
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            _fired(f"rank {fault.rank} moved into memory cgroup {folder} before loading its weights")
        return original(self, *args, **kwargs)

    Worker.load_model = load_model


def _raise_kv_cache(fault: Fault) -> None:
    """Rank R raises where the real refusal is raised: the CPU attention's ISA choice, made as each attention
    group's metadata builder is built while the worker allocates its KV cache."""
    import torch.distributed as dist
    from vllm.v1.attention.backends import cpu_attn

    original = cpu_attn._get_attn_isa

    def _get_attn_isa(*args, **kwargs):
        if dist.is_initialized() and dist.get_rank() == fault.rank:
            _fired(f"rank {fault.rank} raises while its KV cache is allocated")
            raise NotImplementedError(
                f"b70lab fault injected: rank {fault.rank} refuses its FP8 KV cache, as "
                f"vLLM's CPU attention does on a CPU without AVX-512 or AMX"
            )
        return original(*args, **kwargs)

    cpu_attn._get_attn_isa = _get_attn_isa


def _die_decode(fault: Fault) -> None:
    from vllm.v1.worker.gpu_worker import Worker

    original = Worker.execute_model
    at = fault.at or 20
    seen = {"steps": 0}

    def execute_model(self, *args, **kwargs):
        if getattr(self, "rank", None) == fault.rank:
            seen["steps"] += 1
            if seen["steps"] == at:
                _fired(f"rank {fault.rank} is killed at its model step {at}")
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)

    Worker.execute_model = execute_model


def _engine_core_exit(fault: Fault) -> None:
    from vllm.v1.engine.core import EngineCore

    at = fault.at or 20
    seen = {"steps": 0}
    for name in ("step", "step_with_batch_queue"):
        original = getattr(EngineCore, name)

        def step(self, *args, _original=original, **kwargs):
            result = _original(self, *args, **kwargs)
            if result and result[1]:  # a step that ran the model
                seen["steps"] += 1
                if seen["steps"] == at:
                    _fired(f"the engine core exits at its busy step {at}")
                    os._exit(3)
            return result

        setattr(EngineCore, name, step)


def _stream_cut(fault: Fault) -> None:
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    original = OpenAIServingCompletion.completion_stream_generator
    at = fault.at or 10

    async def completion_stream_generator(self, *args, **kwargs):
        sent = 0
        async for chunk in original(self, *args, **kwargs):
            yield chunk
            sent += 1
            if sent == at:
                _fired(f"the API server exits after {at} streamed chunks")
                os._exit(5)

    OpenAIServingCompletion.completion_stream_generator = completion_stream_generator


def _slow_decode(fault: Fault) -> None:
    """Rank R stretches each of its model steps by P % of the step's own time: a relative delay, so every prompt
    slows by the same factor whatever its step time (a fixed sleep would slow fast prompts more)."""
    from vllm.v1.worker.gpu_worker import Worker

    original = Worker.execute_model
    factor = (fault.at or 0) / 100
    announced = {"done": False}

    def execute_model(self, *args, **kwargs):
        if getattr(self, "rank", None) != fault.rank:
            return original(self, *args, **kwargs)
        t0 = time.perf_counter()
        result = original(self, *args, **kwargs)
        if not announced["done"]:
            announced["done"] = True
            _fired(f"rank {fault.rank} stretches every model step by {fault.at} % of its own time")
        time.sleep((time.perf_counter() - t0) * factor)
        return result

    Worker.execute_model = execute_model


INSTALL = {
    "collective-stall": _collective_stall,
    "die-loading": _die_loading,
    "raise-loading": _raise_loading,
    "raise-kv-cache": _raise_kv_cache,
    "memory-cgroup": _memory_cgroup,
    "die-decode": _die_decode,
    "engine-core-exit": _engine_core_exit,
    "stream-cut": _stream_cut,
    "slow-decode": _slow_decode,
}
_installed: Fault | None = None


def register() -> None:
    global _installed
    fault = parse(os.environ.get(ENV))
    if fault is None or _installed is not None:
        return
    if fault.start is not None and this_start() != fault.start:
        log.info(
            "b70lab fault %s not armed in pid %d: it targets start-%d, this is start-%s",
            fault.name,
            os.getpid(),
            fault.start,
            this_start(),
        )
        return
    try:
        INSTALL[fault.name](fault)
    except ImportError as e:  # a process without that part of vLLM (a probe rank has no API server)
        log.info("b70lab fault %s not armed in pid %d: %s", fault.name, os.getpid(), e)
        return
    _installed = fault
    log.info("b70lab fault armed in pid %d: %s", os.getpid(), fault)
