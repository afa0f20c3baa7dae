"""Each vLLM CPU fix: the defect is there without it, and gone with it.

These call vLLM's own classes and the native CPU MoE kernel in this process. The class attributes a fix
replaces are restored by monkeypatch after each test, so every test starts from vLLM as installed.
The third fix (the router bias is never loaded) needs vLLM's weight loader and is shown on a real engine
start in tests/engine/test_parity.py.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm import _custom_ops  # noqa: E402
from vllm.compilation import decorators  # noqa: E402
from vllm.distributed.device_communicators import cpu_communicator, shm_broadcast  # noqa: E402
from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402
from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG  # noqa: E402
from vllm.model_executor.layers.fused_moe.experts import cpu_moe  # noqa: E402
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts  # noqa: E402
from vllm.model_executor.layers.fused_moe.router import cpu_router  # noqa: E402
from vllm.model_executor.layers.fused_moe.runner import moe_runner  # noqa: E402
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (  # noqa: E402
    compressed_tensors_moe_wna16 as moe_wna16,
)
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (  # noqa: E402
    compressed_tensors_wNa16 as wna16,
)
from vllm.scalar_type import scalar_types  # noqa: E402
from vllm.v1.attention.backends import cpu_attn  # noqa: E402

from pytest_b70lab.in_engine import fixes, portable_fp8, portable_int4  # noqa: E402


@pytest.fixture(autouse=True)
def pristine_vllm(monkeypatch: pytest.MonkeyPatch):
    """Undo whatever a fix patches, after the test."""
    monkeypatch.setattr(cpu_router.CPURouter, "_compute_routing", cpu_router.CPURouter._compute_routing)
    monkeypatch.setattr(cpu_moe.CPUUnquantizedExperts, "apply", cpu_moe.CPUUnquantizedExperts.apply)
    monkeypatch.setattr(moe_runner.MoERunner, "load_weights", moe_runner.MoERunner.load_weights)
    monkeypatch.setattr(
        cpu_communicator.CpuCommunicator,
        "_all_group_ranks_share_shm_group_name",
        cpu_communicator.CpuCommunicator._all_group_ranks_share_shm_group_name,
    )
    monkeypatch.setattr(decorators, "_try_load_aot_compiled_fn", decorators._try_load_aot_compiled_fn)
    monkeypatch.setattr(_custom_ops.CPUDNNLGEMMHandler, "__del__", _custom_ops.CPUDNNLGEMMHandler.__del__)
    monkeypatch.setattr(fixes, "_deferred_dnnl_handles", [])
    monkeypatch.setattr(fixes, "_registered", None)
    monkeypatch.setattr(cpu_attn, "_get_attn_isa", cpu_attn._get_attn_isa)
    monkeypatch.setattr(cpu_attn, "ops", cpu_attn.ops)
    monkeypatch.setattr(portable_fp8, "_state", dict(portable_fp8._state))
    monkeypatch.setattr(wna16, "choose_mp_linear_kernel", wna16.choose_mp_linear_kernel)
    monkeypatch.setattr(moe_wna16, "select_wna16_moe_backend", moe_wna16.select_wna16_moe_backend)
    method = moe_wna16.CompressedTensorsWNA16MoEMethod
    monkeypatch.setattr(method, "process_weights_after_loading", method.process_weights_after_loading)
    monkeypatch.setattr(method, "get_fused_moe_quant_config", method.get_fused_moe_quant_config)
    monkeypatch.setattr(portable_int4, "_state", copy.deepcopy(portable_int4._state))
    monkeypatch.setattr(shm_broadcast.SpinCondition, "wait", shm_broadcast.SpinCondition.wait)


def test_installed_vllm_has_all_the_defects(monkeypatch) -> None:
    """If this fails, vLLM changed: re-check which fixes are still needed (patches/README.md)."""
    monkeypatch.setenv(fixes.SHM_ALLREDUCE_ENV, "0")
    monkeypatch.setenv(portable_fp8.ENV_FORCE, "portable")  # on a CPU with AVX-512 the FP8 refusal is absent
    assert [f.name for f in fixes.FIXES if f.defect_present()] == list(fixes.FIX_NAMES)


# --- 1. sigmoid routing ------------------------------------------------------------------------------------


def reference_biased_sigmoid_topk(logits: torch.Tensor, bias: torch.Tensor, k: int):
    """Laguna's routing: select on sigmoid(logit) + bias, weigh by the unbiased sigmoid, renormalise."""
    scores = logits.float().sigmoid()
    ids = torch.topk(scores + bias, k, dim=-1).indices
    weights = scores.gather(1, ids)
    return weights / weights.sum(-1, keepdim=True), ids


def _sorted_by_expert(weights: torch.Tensor, ids: torch.Tensor):
    order = ids.long().argsort(dim=-1)
    return weights.gather(1, order), ids.long().gather(1, order)


def test_router_rejects_sigmoid_without_the_fix_and_routes_it_with_it() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 8, generator=gen)
    bias = torch.randn(8, generator=gen) * 0.5
    router = cpu_router.CPURouter(top_k=2, global_num_experts=8, scoring_func="sigmoid", e_score_correction_bias=bias)
    with pytest.raises(AssertionError):
        router._compute_routing(torch.zeros(16, 4), logits, None)
    assert fixes._router_rejects_sigmoid()

    fixes._fix_router_sigmoid()
    weights, ids = router._compute_routing(torch.zeros(16, 4), logits, None)
    ref_w, ref_ids = reference_biased_sigmoid_topk(logits, bias, 2)
    got_w, got_ids = _sorted_by_expert(weights, ids)
    want_w, want_ids = _sorted_by_expert(ref_w, ref_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)
    # The bias must matter on this input, or the test would not tell a dropped bias from a used one.
    assert not torch.equal(_sorted_by_expert(*reference_biased_sigmoid_topk(logits, bias * 0, 2))[1], want_ids)
    assert not fixes._router_rejects_sigmoid()


def test_router_fix_leaves_softmax_routing_alone() -> None:
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    router = cpu_router.CPURouter(top_k=2, global_num_experts=8)
    before = router._compute_routing(torch.zeros(4, 4), logits, None)
    fixes._fix_router_sigmoid()
    after = router._compute_routing(torch.zeros(4, 4), logits, None)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


# --- 2. expert_map under expert parallel ------------------------------------------------------------------

HIDDEN, INTER, GLOBAL_EXPERTS, LOCAL_EXPERTS = 64, 32, 8, 4
RANK = 1  # this rank holds global experts 4..7


def _experts_and_weights():
    from vllm._custom_ops import cpu_prepack_moe_weight

    gen = torch.Generator().manual_seed(2)
    w13 = torch.randn(LOCAL_EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.1
    w2 = torch.randn(LOCAL_EXPERTS, HIDDEN, INTER, generator=gen) * 0.1
    experts = object.__new__(cpu_moe.CPUUnquantizedExperts)  # the real class; only the state apply() reads
    experts._use_zentorch = False
    experts.quant_config = FUSED_MOE_UNQUANTIZED_CONFIG
    expert_map = torch.full((GLOBAL_EXPERTS,), -1, dtype=torch.int32)
    expert_map[RANK * LOCAL_EXPERTS : (RANK + 1) * LOCAL_EXPERTS] = torch.arange(LOCAL_EXPERTS, dtype=torch.int32)
    packed = (cpu_prepack_moe_weight(w13, experts.isa), cpu_prepack_moe_weight(w2, experts.isa))
    return experts, (w13, w2), packed, expert_map


def reference_local_moe(x, w13, w2, topk_weights, topk_ids, expert_map):
    """This rank's share: experts it holds, weighted; experts of other ranks contribute nothing here."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(topk_weights[t].tolist(), topk_ids[t].tolist(), strict=False):
            local = int(expert_map[e])
            if local < 0:
                continue
            gate_up = w13[local] @ x[t]
            hidden = torch.nn.functional.silu(gate_up[:INTER]) * gate_up[INTER:]
            out[t] += w * (w2[local] @ hidden)
    return out


def _run(experts, packed, x, topk_weights, topk_ids, expert_map):
    out = torch.zeros_like(x)
    experts.apply(
        out,
        x,
        packed[0],
        packed[1],
        topk_weights,
        topk_ids,
        MoEActivation.SILU,
        GLOBAL_EXPERTS,
        expert_map,
        None,
        None,
        torch.empty(0),
        torch.empty(0),
        None,
        False,
    )
    return out


def test_experts_ignore_expert_map_without_the_fix_and_honour_it_with_it() -> None:
    experts, (w13, w2), packed, expert_map = _experts_and_weights()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, HIDDEN, generator=gen)
    weights = torch.rand(6, 2, generator=gen)

    # Only experts 0..3, none of them on this rank: the right answer is zero. Ids stay < LOCAL_EXPERTS so
    # the unfixed kernel reads in bounds (ids >= 4 would index past the local weights and may crash).
    remote_ids = torch.tensor([[0, 1], [2, 3], [1, 3], [0, 2], [3, 0], [2, 1]], dtype=torch.int32)
    assert fixes._experts_ignore_expert_map()
    unfixed = _run(experts, packed, x, weights, remote_ids, expert_map)
    assert unfixed.abs().max() > 1e-3, "without the fix the kernel applies local experts 0..3 as if global"

    fixes._fix_experts_expert_map()
    assert not fixes._experts_ignore_expert_map()
    assert _run(experts, packed, x, weights, remote_ids, expert_map).abs().max() == 0

    mixed_ids = torch.tensor([[0, 5], [4, 7], [6, 2], [7, 1], [5, 6], [3, 4]], dtype=torch.int32)
    got = _run(experts, packed, x, weights, mixed_ids, expert_map)
    want = reference_local_moe(x, w13, w2, weights, mixed_ids, expert_map)
    # The native kernel and this reference sum in other orders (by ISA too). Any order, to first order: the
    # HIDDEN- and INTER-term reductions on an output's path, n u relative each (u = 2^-24), of the largest
    # output (0.57): (64 + 32) u * 0.57 = 3.3e-6, inside atol; measured 1.8e-7 (3 u), at AVX-512 and under
    # ATEN_CPU_CAPABILITY=avx2 alike.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_localize_expert_ids_maps_and_masks() -> None:
    expert_map = torch.tensor([-1, -1, 0, 1], dtype=torch.int32)
    ids, weights = fixes.localize_expert_ids(
        torch.tensor([[0, 2], [3, 1]], dtype=torch.int32), torch.tensor([[0.5, 0.25], [0.75, 1.0]]), expert_map
    )
    assert ids.tolist() == [[0, 0], [1, 0]]
    assert weights.tolist() == [[0.0, 0.25], [0.75, 0.0]]
    assert ids.dtype == torch.int32 and ids.is_contiguous() and weights.is_contiguous()


# --- 3. the router bias (loader side) ---------------------------------------------------------------------


def test_neither_loader_knows_the_router_bias() -> None:
    assert fixes._runner_drops_router_bias()
    fixes._fix_runner_router_bias()
    assert not fixes._runner_drops_router_bias()
    assert "e_score_correction_bias" not in __import__("inspect").getsource(RoutedExperts.load_weights)


# --- selection and registration ---------------------------------------------------------------------------


def test_selection_spec() -> None:
    assert [f.name for f in fixes.selected_fixes(None)] == list(fixes.FIX_NAMES)
    assert fixes.selected_fixes("none") == ()
    assert [f.name for f in fixes.selected_fixes(" moe_router_bias_load ,cpu_router_sigmoid")] == [
        "cpu_router_sigmoid",
        "moe_router_bias_load",
    ]
    with pytest.raises(ValueError, match="unknown fix router_typo; known: all, none, cpu_router_sigmoid"):
        fixes.selected_fixes("router_typo")


def test_register_applies_only_what_is_selected_and_says_so(monkeypatch, caplog) -> None:
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_router_sigmoid")
    with caplog.at_level("INFO", logger=fixes.log.name):
        status = fixes.register()
    assert status == {
        "cpu_router_sigmoid": "applied",
        "cpu_experts_expert_map": "disabled",
        "moe_router_bias_load": "disabled",
        "cpu_shm_allreduce_switch": "disabled",
        "aot_load_plain_function": "disabled",
        "cpu_fp8_portable_attention": "disabled",
        "cpu_int4_portable_weights": "disabled",
        "cpu_dnnl_handler_release": "disabled",
        "shm_reader_spin": "disabled",
    }
    assert getattr(cpu_router.CPURouter._compute_routing, fixes.PATCHED_MARK, False)
    assert not getattr(cpu_moe.CPUUnquantizedExperts.apply, fixes.PATCHED_MARK, False)
    lines = [r.getMessage() for r in caplog.records if "b70lab vLLM CPU fixes" in r.getMessage()]
    assert len(lines) == 1 and "cpu_router_sigmoid applied" in lines[0]
    # a second call in the same process changes nothing and logs nothing; the rank's audit reads what it decided
    assert fixes.register() is status and fixes.registered() is status
    assert len([r for r in caplog.records if "b70lab vLLM CPU fixes" in r.getMessage()]) == 1

    monkeypatch.setattr(fixes, "_registered", None)
    monkeypatch.setenv(fixes.ENV_SELECT, "all")
    status = fixes.register()
    assert status["cpu_router_sigmoid"] == "not needed", "a fixed router must be left alone"
    assert status["cpu_experts_expert_map"] == "applied"


# --- 4. the SHM all-reduce switch -------------------------------------------------------------------------


def test_shm_allreduce_switch_acts_only_when_the_environment_asks(monkeypatch) -> None:
    """Unset (a machine with a core per rank): vLLM keeps its SHM all-reduce. At 0 (launch sets it when the
    ranks and the engine core outnumber the cores): every rank skips the SHM path, before the group-name
    collective that would otherwise decide it."""
    monkeypatch.delenv(fixes.SHM_ALLREDUCE_ENV, raising=False)
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_shm_allreduce_switch")
    assert fixes.register() == {
        "cpu_router_sigmoid": "disabled",
        "cpu_experts_expert_map": "disabled",
        "moe_router_bias_load": "disabled",
        "cpu_shm_allreduce_switch": "not needed",
        "aot_load_plain_function": "disabled",
        "cpu_fp8_portable_attention": "disabled",
        "cpu_int4_portable_weights": "disabled",
        "cpu_dnnl_handler_release": "disabled",
        "shm_reader_spin": "disabled",
    }
    assert not getattr(
        cpu_communicator.CpuCommunicator._all_group_ranks_share_shm_group_name, fixes.PATCHED_MARK, False
    )

    monkeypatch.setattr(fixes, "_registered", None)
    monkeypatch.setenv(fixes.SHM_ALLREDUCE_ENV, "0")
    assert fixes.register()["cpu_shm_allreduce_switch"] == "applied"
    assert cpu_communicator.CpuCommunicator._all_group_ranks_share_shm_group_name(object()) is False


# --- 5. the AOT compile cache ------------------------------------------------------------------------------


class _TinyForward(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + 1


def test_aot_cache_of_a_torch_backend_loads_only_with_the_fix(tmp_path, monkeypatch) -> None:
    """The CPU build compiles with torch's Inductor, as here: its saved artifact is real, torch loads it, and
    vLLM's loader still throws it away ("no attribute 'finalize_loading'") and recompiles. With the fix the
    same file loads, and the loaded function computes what the module does."""
    from vllm.config import VllmConfig

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    module, x = _TinyForward(), torch.randn(4, 8)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(module.forward, fullgraph=True, dynamic=False, backend="inductor")
        compiled.aot_compile(((x,), {})).save_compiled_function(str(tmp_path / "model"))

    config = VllmConfig()
    owner = type(
        "Owner",
        (),
        {
            "vllm_config": config,
            "compilation_config": config.compilation_config,
            "_is_encoder": False,
            "forward": module.forward,
        },
    )()
    assert fixes._aot_load_requires_vllm_function()
    assert decorators._try_load_aot_compiled_fn(owner, str(tmp_path / "model")) is None

    fixes._fix_aot_load_plain_function()
    assert not fixes._aot_load_requires_vllm_function(), "a fixed loader must be left alone"
    loaded = decorators._try_load_aot_compiled_fn(owner, str(tmp_path / "model"))
    assert loaded is not None
    torch.testing.assert_close(loaded(module, x), module(x))


# --- 6. an FP8 cache without AVX-512 or AMX ----------------------------------------------------------------


def test_fp8_cache_is_refused_without_avx512_and_served_portably_with_the_fix(monkeypatch) -> None:
    """As vLLM sees an AVX2-only CPU (torch.cpu answers no, as under B70LAB_EMULATE_CPU=avx2): its CPU
    attention refuses an FP8 cache; with the fix it resolves the vec layout, and the backend module's FP8 op
    calls go to the portable path while every other op stays vLLM's."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.delenv(portable_fp8.ENV_FORCE, raising=False)
    with pytest.raises(NotImplementedError, match="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"):
        cpu_attn._get_attn_isa(torch.float32, 32, 64, "fp8")
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_fp8_portable_attention")
    assert fixes.register()["cpu_fp8_portable_attention"] == "applied"
    assert cpu_attn._get_attn_isa(torch.float32, 64, 64, "fp8") == "vec"
    assert cpu_attn._get_attn_isa(torch.float32, 32, 64, "auto") == "vec", "an unquantized cache keeps vLLM's answer"
    with pytest.raises(NotImplementedError, match="multiple of 32"):
        cpu_attn._get_attn_isa(torch.float32, 48, 64, "fp8")
    assert isinstance(cpu_attn.ops, portable_fp8.PortableFp8Ops)
    assert cpu_attn.ops.cpu_attn_get_scheduler_metadata is not None  # any other name: vLLM's own op
    assert portable_fp8.state() == {
        "implementation": portable_fp8.IMPLEMENTATION,
        "portable": True,
        "reason": "this CPU has neither AVX-512 nor AMX (as vLLM sees it)",
    }


def test_portable_path_stays_out_where_the_native_one_runs(monkeypatch) -> None:
    if not portable_fp8.native_fp8_supported():
        pytest.skip("this CPU has neither AVX-512 nor AMX: the native FP8 path cannot run here")
    monkeypatch.delenv(portable_fp8.ENV_FORCE, raising=False)
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_fp8_portable_attention")
    assert fixes.register()["cpu_fp8_portable_attention"] == "not needed"
    assert not isinstance(cpu_attn.ops, portable_fp8.PortableFp8Ops)
    monkeypatch.setattr(fixes, "_registered", None)
    monkeypatch.setenv(portable_fp8.ENV_FORCE, "portable")
    assert fixes.register()["cpu_fp8_portable_attention"] == "applied"
    assert portable_fp8.state()["reason"] == f"{portable_fp8.ENV_FORCE}=portable"


# --- 7. a oneDNN GEMM handler released while a graph is traced -----------------------------------------------


def _handlers_dying_while_traced() -> tuple[list[int], list[str]]:
    """Three handlers die inside a FakeTensorMode, as the garbage collector runs them while Dynamo traces: a
    fake copy of a real handle, a real handler, and (after the mode) the fake copy again; what was released
    (their dtor recorded) and what Python reported as an exception it ignored."""
    import gc
    import sys

    from torch._subclasses.fake_tensor import FakeTensorMode

    released: list[int] = []
    ignored: list[str] = []
    weight = torch.randn(64, 32)
    real = _custom_ops.create_onednn_mm(weight, 16)
    handle = int(real.handler_tensor.item())
    mode = FakeTensorMode()
    copies = []
    for _ in range(2):
        copy = _custom_ops.CPUDNNLGEMMHandler()
        copy.handler_tensor, copy.dtor = mode.from_tensor(real.handler_tensor), released.append
        copies.append(copy)
    real.dtor = released.append
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: ignored.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        with mode:
            del copy
            copies.pop(0)
            gc.collect()
            del real
            gc.collect()
        copies.clear()
        gc.collect()
    finally:
        sys.unraisablehook = hook
    return [handle, *released], ignored


@pytest.mark.skipif(not _custom_ops._supports_onednn, reason="this vLLM build has no oneDNN GEMM handler")
def test_a_handler_released_while_a_graph_is_traced_raises_nothing_and_frees_its_handle_once(monkeypatch) -> None:
    monkeypatch.setenv(fixes.ENV_SELECT, "none")
    _, ignored = _handlers_dying_while_traced()
    assert any(i.startswith("DataDependentOutputException") for i in ignored), ignored  # vLLM as installed
    assert any("Please convert all Tensors to FakeTensors" in i for i in ignored), ignored

    monkeypatch.setattr(fixes, "_registered", None)
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_dnnl_handler_release")
    assert fixes.register()["cpu_dnnl_handler_release"] == "applied"
    (handle, *released), ignored = _handlers_dying_while_traced()
    assert ignored == []
    assert released == [] and fixes._deferred_dnnl_handles == [handle], "released inside the tracing mode"
    survivor = _custom_ops.create_onednn_mm(torch.randn(64, 32), 16)
    own = int(survivor.handler_tensor.item())
    survivor.dtor = released.append
    del survivor
    import gc

    gc.collect()
    assert released == [handle, own] and fixes._deferred_dnnl_handles == []


# --- 8. INT4 (W4A16) weights without a CPU INT4 path ------------------------------------------------------


def _w4a16(act_type, out_features: int = 256) -> MPLinearLayerConfig:
    return MPLinearLayerConfig(
        full_weight_shape=(256, out_features),
        partition_weight_shape=(256, out_features),
        weight_type=scalar_types.uint4b8,
        act_type=act_type,
        group_size=128,
        zero_points=False,
    )


def test_vllm_picks_a_w4a16_kernel_it_cannot_run_and_the_fix_serves_the_layer_portably(monkeypatch) -> None:
    """vLLM's selection takes CPUWNA16LinearKernel for float32 activations, whose cpu_gemm_wna16 has no float32
    kernel (and on an AVX2 op library no kernel at all): the first forward would fail. With the fix the layer
    gets the portable kernel, counted with the reason; a layer vLLM's kernels cannot shape gets it too."""
    monkeypatch.delenv(portable_int4.ENV_FORCE, raising=False)
    assert wna16.choose_mp_linear_kernel(_w4a16(torch.float32)).__name__ == "CPUWNA16LinearKernel"
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_int4_portable_weights")
    assert fixes.register()["cpu_int4_portable_weights"] == "applied"
    portable = portable_int4.linear_kernel()
    assert wna16.choose_mp_linear_kernel(_w4a16(torch.float32)) is portable
    assert wna16.choose_mp_linear_kernel(_w4a16(torch.float32, out_features=4)) is portable  # g_proj: 4 rows a rank
    state = portable_int4.state()
    assert state["installed"] and state["linear"] == {"portable": 2}
    assert (
        "has no torch.float32 kernel" in state["reasons"]["linear portable"]
        or "does not register" in (state["reasons"]["linear portable"])
    )


def test_the_int4_fix_leaves_vllms_kernel_where_it_runs_unless_forced(monkeypatch) -> None:
    monkeypatch.delenv(portable_int4.ENV_FORCE, raising=False)
    monkeypatch.setenv(fixes.ENV_SELECT, "cpu_int4_portable_weights")
    fixes.register()
    chosen = wna16.choose_mp_linear_kernel(_w4a16(torch.bfloat16))
    has_op = portable_int4._op_library_has("cpu_gemm_wna16")
    if has_op:
        assert chosen.__name__ == "CPUWNA16LinearKernel", "bf16 on an op library that has the op: vLLM's kernel"
        assert portable_int4.state()["linear"] == {"CPUWNA16LinearKernel": 1}
    else:
        assert chosen is portable_int4.linear_kernel()
    monkeypatch.setenv(portable_int4.ENV_FORCE, "portable")
    assert wna16.choose_mp_linear_kernel(_w4a16(torch.bfloat16)) is portable_int4.linear_kernel()
    # A path's first reason is the one kept: on an op library without the op (vLLM's AVX2 one) that was the op.
    reason = portable_int4.state()["reasons"]["linear portable"]
    if has_op:
        assert reason == f"{portable_int4.ENV_FORCE}=portable", reason
    else:
        assert reason == "CPUWNA16LinearKernel calls cpu_gemm_wna16, which this op library does not register", reason
    monkeypatch.setenv(portable_int4.ENV_FORCE, "sometimes")
    with pytest.raises(ValueError, match="B70LAB_INT4_PATH='sometimes': expected one of auto, portable"):
        wna16.choose_mp_linear_kernel(_w4a16(torch.bfloat16))


def test_the_int4_counting_replaces_no_kernel_on_any_platform_and_counts_each_layer_once(monkeypatch) -> None:
    """The plugin's counting entry (every platform): vLLM's choice comes back unchanged and is counted by name;
    where the platform is not a CPU and vLLM has no kernel, vLLM's own error, never the portable path; with the
    CPU fix installed after it, a layer is counted once."""
    from vllm.platforms import current_platform

    monkeypatch.delenv(portable_int4.ENV_FORCE, raising=False)
    vllms_choice = wna16.choose_mp_linear_kernel(_w4a16(torch.float32))
    with monkeypatch.context() as not_a_cpu:
        not_a_cpu.setattr(type(current_platform), "is_cpu", lambda self: False)
        portable_int4.register()
        portable_int4.register()  # idempotent: one wrapper
        # vLLM's CPU kernels refuse a platform that is not a CPU: its own error, no portable stand-in
        with pytest.raises(ValueError, match="Failed to find a kernel"):
            wna16.choose_mp_linear_kernel(_w4a16(torch.float32))
        assert portable_int4.state()["linear"] == {}
    assert wna16.choose_mp_linear_kernel(_w4a16(torch.float32)) is vllms_choice
    state = portable_int4.state()
    assert state["counting"] and not state["installed"]
    assert state["linear"] == {vllms_choice.__name__: 1} and state["reasons"] == {}
    portable_int4.install()
    assert wna16.choose_mp_linear_kernel(_w4a16(torch.float32)) is portable_int4.linear_kernel()
    assert portable_int4.state()["linear"] == {vllms_choice.__name__: 1, "portable": 1}


# --- 9. the shared-memory queue reader's spin ----------------------------------------------------------------


def _reader() -> shm_broadcast.SpinCondition:
    import zmq

    context = zmq.Context.instance()
    address = f"inproc://b70lab-spin-{id(object())}"
    writer = shm_broadcast.SpinCondition(False, context, address)
    reader = shm_broadcast.SpinCondition(True, context, address)
    reader._writer = writer  # type: ignore[attr-defined]  # kept alive with the reader
    return reader


def test_a_reader_spins_a_second_without_the_fix_and_a_twentieth_with_it(monkeypatch) -> None:
    """Read 0.2 s ago: without the fix the reader still busy-loops (wait returns at once, never polling its
    notification socket); with it the reader is past its spin and polls, which the poller's timeout shows."""
    import time

    reader = _reader()
    polled: list[int | None] = []
    monkeypatch.setattr(reader.poller, "poll", lambda timeout=None: polled.append(timeout) or [])
    reader.last_read = time.monotonic() - 0.2
    reader.wait(timeout_ms=7)
    assert polled == [] and reader.busy_loop_s == 1

    monkeypatch.setenv(fixes.ENV_SELECT, "shm_reader_spin")
    assert fixes.register()["shm_reader_spin"] == "applied"
    reader.wait(timeout_ms=7)
    assert polled == [7] and reader.busy_loop_s == fixes.READER_SPIN_S
    reader.last_read = time.monotonic()
    reader.wait(timeout_ms=7)
    assert polled == [7], "just after a read it still spins, as between the steps of a request"
