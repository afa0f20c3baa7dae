"""A portable INT4 weight path (W4A16, compressed-tensors `pack-quantized`) for vLLM's CPU build.

vLLM 0.32's CPU build serves compressed-tensors W4A16 linears with `CPUWNA16LinearKernel`, which calls
`cpu_gemm_wna16`: an op that only the AVX-512 op library registers (the AVX2 one has neither it nor
`convert_weight_packed_scale_zp`), and whose kernel asks nothing of `can_implement` about it, so an AVX2 rank
would pick it and fail at the first forward. Its INT4 MoE experts (`CPUExpertsInt4`) need AMX, refuse any
routing but softmax top-k (Laguna routes by biased sigmoid) and an expert map (expert parallel). The lab's
production target and draft are INT4 checkpoints; the embedded default serves an INT4 mini (mini/int4.py) on
any x86-64 CPU, so this module serves the same packed tensors in plain PyTorch:

- the checkpoint's parameters are vLLM's own, created and sharded by vLLM's loaders (tensor- and
  expert-parallel) exactly as for its kernels: the load audit sees them as loaded;
- after loading, each layer's weight is dequantized once from its packed codes and group scales
  (code - 8) * scale, in the layer's dtype: a linear then runs `F.linear`, the MoE experts vLLM's own
  unquantized CPU experts (routing, expert map and all-reduce as for the unquantized model).

Selection is per process and never silent: with `B70LAB_INT4_PATH=portable` every INT4 layer runs here;
otherwise (`auto`) a linear runs vLLM's kernel where vLLM picks one whose op this op library has, and the MoE
experts run vLLM's INT4 experts where vLLM's own selection accepts the layer. `state()` counts each layer's
path and keeps the reasons; every rank's audit reports it and gate 3 judges it against the contract.

The counting (which kernel vLLM gives each INT4 layer, replacing none) is installed on every platform by its own
`vllm.general_plugins` entry (`register`): an XPU rank's audit names vLLM's INT4 kernels, so a contract there
can expect `int4_path = "native"`. The portable path is installed by the vLLM plugin's CPU fix
(`fixes`, fix `cpu_int4_portable_weights`). Runs inside vLLM's processes: imports
only the standard library, torch and vLLM. The patch in `patches/` is the same change as a source delta.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch

ENV_FORCE = "B70LAB_INT4_PATH"  # "portable" forces this path; unset / "auto": only where vLLM's cannot run
FORCE_VALUES = ("auto", "portable")
IMPLEMENTATION = "b70lab-portable-int4"
NUM_BITS = 4
PACK_FACTOR = 32 // NUM_BITS
CODE_OFFSET = 8  # compressed-tensors stores a signed 4-bit code c as the unsigned nibble c + 8
# The op each of vLLM's CPU mixed-precision kernels calls, where an op library may lack it, and the activation
# dtypes that op has a kernel for: neither is asked by the kernel's can_implement (cpu_gemm_wna16 on float32
# activations fails the first forward with "not implemented for 'Float'").
KERNEL_OPS = {"CPUWNA16LinearKernel": ("cpu_gemm_wna16", ("torch.bfloat16", "torch.float16"))}
# "counting": vLLM's own selections are wrapped to count what each INT4 layer got (every platform, the plugin's
# entry point); "installed": the portable path may also take layers (the CPU fix).
_state: dict[str, Any] = {"installed": False, "counting": False, "linear": Counter(), "moe": Counter(), "reasons": {}}


def forced(environ=os.environ) -> bool:
    value = (environ.get(ENV_FORCE) or "auto").strip().lower()
    if value not in FORCE_VALUES:
        raise ValueError(f"{ENV_FORCE}={value!r}: expected one of {', '.join(FORCE_VALUES)}")
    return value == "portable"


def state() -> dict[str, Any]:
    """This process's INT4 layers by the path each runs ("portable" or vLLM's kernel by name), and why."""
    return {
        "installed": bool(_state["installed"]),
        "counting": bool(_state["counting"]),
        "implementation": IMPLEMENTATION,
        "forced": forced(),
        "linear": dict(sorted(_state["linear"].items())),
        "moe": dict(sorted(_state["moe"].items())),
        "reasons": dict(sorted(_state["reasons"].items())),
    }


def _count(kind: str, path: str, reason: str | None = None) -> None:
    _state[kind][path] += 1
    if reason:
        _state["reasons"].setdefault(f"{kind} {path}", reason)


# --- the numbers -------------------------------------------------------------------------------------------


def unpack_codes(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """Signed codes [..., in_features] (int8) of int32 words [..., in_features / 8]: nibble j of word i is
    column 8i + j, stored offset by 8."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(PACK_FACTOR, dtype=torch.int64, device=packed.device) * NUM_BITS
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF
    codes = nibbles.reshape(*packed.shape[:-1], -1)[..., :in_features] - CODE_OFFSET
    return codes.to(torch.int8)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight [..., out, in] that packed codes [..., out, in / 8] and group scales [..., out, groups]
    stand for: code * scale, computed in fp32 (exact for a scale of at most 20 significant bits, such as a bf16
    checkpoint's scale in an fp32 parameter), then `dtype`."""
    in_features = packed.shape[-1] * PACK_FACTOR
    groups = scale.shape[-1]
    if in_features % groups:
        raise ValueError(f"{in_features} input columns do not split into {groups} equal groups")
    codes = unpack_codes(packed, in_features).to(torch.float32)
    grouped = codes.reshape(*codes.shape[:-1], groups, in_features // groups)
    weight = grouped * scale.to(torch.float32).unsqueeze(-1)
    return weight.reshape(codes.shape).to(dtype)


# --- the linear kernel -------------------------------------------------------------------------------------

_classes: dict[str, type] = {}


def linear_kernel() -> type:
    """vLLM's mixed-precision linear kernel interface, served by dequantized weights and F.linear."""
    if "linear" in _classes:
        return _classes["linear"]
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearKernel
    from vllm.scalar_type import scalar_types

    class PortableInt4LinearKernel(MPLinearKernel):
        @classmethod
        def get_min_capability(cls) -> int:
            return -1

        @classmethod
        def can_implement(cls, c) -> tuple[bool, str | None]:
            if c.weight_type != scalar_types.uint4b8 or c.zero_points:
                return False, f"{IMPLEMENTATION} serves symmetric 4-bit weights only, not {c.weight_type}"
            in_per_rank = c.partition_weight_shape[0]
            if in_per_rank % PACK_FACTOR or (c.group_size > 0 and in_per_rank % c.group_size):
                return False, f"{in_per_rank} input columns per rank do not hold whole words and groups"
            return True, None

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            packed, scale = getattr(layer, self.w_q_name), getattr(layer, self.w_s_name)
            dense = dequantize(packed.data, scale.data, self.config.act_type)
            layer.register_parameter("b70lab_int4_dense", torch.nn.Parameter(dense, requires_grad=False))

        def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None):
            return torch.nn.functional.linear(x, layer.b70lab_int4_dense, bias)

    _classes["linear"] = PortableInt4LinearKernel
    return PortableInt4LinearKernel


def _op_library_has(op: str) -> bool:
    try:
        getattr(torch.ops._C, op)
    except (AttributeError, RuntimeError):
        return False
    return True


def _choose_linear(original):
    def choose_mp_linear_kernel(config, compute_capability=None):
        if not _state["installed"]:  # counting only: vLLM's choice as it is, on any platform
            kernel = original(config, compute_capability)
            _count("linear", kernel.__name__)
            return kernel
        portable = linear_kernel()
        if forced():
            _count("linear", "portable", f"{ENV_FORCE}=portable")
            return portable
        try:
            kernel = original(config, compute_capability)
        except ValueError as e:
            _count("linear", "portable", f"no vLLM kernel: {str(e).splitlines()[-1].strip()}")
            return portable
        op, dtypes = KERNEL_OPS.get(kernel.__name__, (None, ()))
        if op is not None and not _op_library_has(op):
            _count("linear", "portable", f"{kernel.__name__} calls {op}, which this op library does not register")
            return portable
        if op is not None and str(config.act_type) not in dtypes:
            _count("linear", "portable", f"{kernel.__name__}'s {op} has no {config.act_type} kernel")
            return portable
        _count("linear", kernel.__name__)
        return kernel

    choose_mp_linear_kernel._b70lab_fix = True  # type: ignore[attr-defined]
    return choose_mp_linear_kernel


# --- the MoE experts ---------------------------------------------------------------------------------------


def _portable_moe(method) -> bool:
    """A WNA16 MoE layer this module serves: vLLM never picks its EMULATION backend on a CPU; this module's
    selection returns it, with vLLM's unquantized CPU experts, as the mark."""
    from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend
    from vllm.platforms import current_platform

    return current_platform.is_cpu() and method.wna16_backend == WNA16MoEBackend.EMULATION


def _select_moe(original):
    def select_wna16_moe_backend(config, weight_key, quant_config, may_have_zp, may_have_bias, **kwargs):
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend
        from vllm.model_executor.layers.fused_moe.oracle.unquantized import select_unquantized_moe_backend
        from vllm.platforms import current_platform

        if not current_platform.is_cpu() or not _state["installed"]:  # counting only: vLLM's choice as it is
            backend, experts = original(config, weight_key, quant_config, may_have_zp, may_have_bias, **kwargs)
            _count("moe", experts.__name__)
            return backend, experts
        reason = f"{ENV_FORCE}=portable" if forced() else None
        if reason is None:
            try:
                backend, experts = original(config, weight_key, quant_config, may_have_zp, may_have_bias, **kwargs)
            except (NotImplementedError, ValueError) as e:
                reason = f"no vLLM INT4 experts for this layer: {e}"
            else:
                _count("moe", experts.__name__)
                return backend, experts
        if may_have_zp:
            raise NotImplementedError(f"{IMPLEMENTATION} serves symmetric INT4 experts only")
        _, unquantized = select_unquantized_moe_backend(config)
        _count("moe", "portable", reason)
        return WNA16MoEBackend.EMULATION, unquantized

    select_wna16_moe_backend._b70lab_fix = True  # type: ignore[attr-defined]
    return select_wna16_moe_backend


def _moe_weights_after_loading(original):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if not _portable_moe(self):
            return original(self, layer)
        from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
            UnquantizedMoeBackend,
            make_unquantized_moe_kernel,
        )

        dtype = layer.w13_weight_scale.dtype  # the layer's parameter dtype (the engine's activations)
        for stacked in ("w13", "w2"):
            dense = dequantize(
                getattr(layer, f"{stacked}_weight_packed").data, getattr(layer, f"{stacked}_weight_scale").data, dtype
            )
            layer.register_parameter(f"{stacked}_weight", torch.nn.Parameter(dense, requires_grad=False))
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)
        self.moe_kernel = make_unquantized_moe_kernel(
            quant_config=self.moe_quant_config,
            moe_config=self.moe,
            backend=UnquantizedMoeBackend.CPU,
            experts_cls=self.experts_cls,
            routing_tables=layer._expert_routing_tables(),
        )
        self.moe_kernel.fused_experts.process_weights_after_loading(layer)  # vLLM's CPU prepack

    process_weights_after_loading._b70lab_fix = True  # type: ignore[attr-defined]
    return process_weights_after_loading


def _moe_quant_config(original):
    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        if not _portable_moe(self):
            return original(self, layer)
        from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG

        return FUSED_MOE_UNQUANTIZED_CONFIG  # the experts see dense weights; no scales travel

    get_fused_moe_quant_config._b70lab_fix = True  # type: ignore[attr-defined]
    return get_fused_moe_quant_config


def install_counting() -> None:
    """Count which kernel vLLM gives each compressed-tensors W4A16 linear and MoE layer, replacing none: the
    audit's `int4` on every platform, so that a contract can expect `int4_path = "native"` on an XPU and gate
    3 judges it there. Idempotent; `install` builds on it."""
    if _state["counting"]:
        return
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as moe_wna16,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import compressed_tensors_wNa16 as wna16

    wna16.choose_mp_linear_kernel = _choose_linear(wna16.choose_mp_linear_kernel)
    moe_wna16.select_wna16_moe_backend = _select_moe(moe_wna16.select_wna16_moe_backend)
    _state["counting"] = True


def register() -> None:
    """`vllm.general_plugins` entry: the counting, in every vLLM process of every platform."""
    install_counting()


def install() -> None:
    """Route compressed-tensors W4A16 linear and MoE layers here where vLLM's CPU build cannot serve them."""
    if _state["installed"]:
        return
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as moe_wna16,
    )

    install_counting()
    method = moe_wna16.CompressedTensorsWNA16MoEMethod
    method.process_weights_after_loading = _moe_weights_after_loading(method.process_weights_after_loading)
    method.get_fused_moe_quant_config = _moe_quant_config(method.get_fused_moe_quant_config)
    _state["installed"] = True


def vllm_serves_cpu_int4() -> bool:
    """Whether this vLLM already serves W4A16 on any CPU without this module: never in 0.32 (see above). A
    vLLM whose op library registers cpu_gemm_wna16 everywhere and whose CPU INT4 experts take a biased sigmoid
    router and an expert map would not need it; until then the selection above decides per layer."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUExpertsInt4

    return _op_library_has("cpu_gemm_wna16") and bool(CPUExpertsInt4.supports_expert_map(None))
