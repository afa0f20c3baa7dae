"""Observation hook for the load audit, loaded by vLLM in every process (`vllm.general_plugins`).

On CPU, vLLM moves each linear layer's weight into a packed kernel handle after loading and leaves an
empty parameter behind, so a worker cannot show what it loaded. Just before that hand-over this hook
stores the weight's moments (float64 sum and sum of squares, element count) on the layer; the worker
audit reports them, and the load-audit gate compares them with the checkpoint's. Moments survive the
kernels' reordering and zero padding, and add up across tensor-parallel shards. It changes nothing the
engine computes.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.b70lab_observe")
MOMENTS_ATTR = "_b70lab_loaded_moments"
_registered = False


def moments(tensor) -> dict[str, float]:
    t = tensor.detach().to("cpu").double()
    return {"sum": float(t.sum()), "sumsq": float((t * t).sum()), "numel": int(t.numel())}


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from vllm.model_executor.layers import utils
    except ImportError as e:  # not a vLLM this hook knows: the audit then reports what it can
        log.info("b70lab load-moment hook not installed (pid %d): %s", os.getpid(), e)
        return
    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer, remove_weight, *args, **kwargs):
        weight = getattr(layer, "weight", None)
        if weight is not None and not weight.is_meta and weight.numel():
            setattr(layer, MOMENTS_ATTR, moments(weight))
        return original(layer, remove_weight, *args, **kwargs)

    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    log.info("b70lab load-moment hook installed (pid %d)", os.getpid())
