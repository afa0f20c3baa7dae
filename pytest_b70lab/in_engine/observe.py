"""Observation hook for the load audit, loaded by vLLM in every process (`vllm.general_plugins`).

After loading, vLLM hands each layer that has a quantization method (unquantized linear and MoE layers
have one too) to `process_weights_after_loading`, which may repack, re-quantize or move its weights into
kernel handles and leave empty parameters behind (vLLM's CPU backend does this to every linear weight;
INT4 kernels repack `weight_packed`). So a worker cannot show afterwards what it loaded. Just before that
step this hook stores each such layer's parameters' moments (float64 sum and sum of squares, element
count) on the layer, in their checkpoint form as loaded; the worker audit reports them, and the
load-audit gate compares them with the checkpoint's. Moments add up across tensor-parallel shards. It
changes nothing the engine computes.

Imports nothing else of the package: it runs inside vLLM's processes.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.b70lab_observe")
LOADED_MOMENTS_ATTR = "_b70lab_loaded_moments"
_registered = False


def moments(tensor) -> dict[str, float]:
    t = tensor.detach().to("cpu").double()
    return {"sum": float(t.sum()), "sumsq": float((t * t).sum()), "numel": int(t.numel())}


def record_loaded_moments(model) -> int:
    """Store, on every layer vLLM is about to post-process, its own parameters' moments; returns how many."""
    count = 0
    for module in model.modules():
        if getattr(module, "quant_method", None) is None:
            continue
        loaded = {name: moments(p) for name, p in module.named_parameters(recurse=False) if not p.is_meta and p.numel()}
        if loaded:
            setattr(module, LOADED_MOMENTS_ATTR, loaded)
            count += len(loaded)
    return count


GC_LOG_ENV = "B70LAB_GC_LOG"  # milliseconds: log every garbage collection of a vLLM process that took as long


def log_gc_pauses(threshold_ms: float) -> None:
    """An experiment's eye on the engine's own pauses (notes/2026-12-03-interleaved-reproduction.md): each
    collection of this process's garbage collector that took `threshold_ms` or more is one INFO line."""
    import gc
    import time

    started: dict[str, float] = {}

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            ms = (time.perf_counter() - started.pop("t")) * 1000
            if ms >= threshold_ms:
                log.info("b70lab gc pause %.0f ms (generation %d, pid %d)", ms, info.get("generation", -1), os.getpid())

    gc.callbacks.append(timed)


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    if threshold := os.environ.get(GC_LOG_ENV):
        log_gc_pauses(float(threshold))
    try:
        from vllm.model_executor.model_loader import base_loader
    except ImportError as e:  # not a vLLM this hook knows: the audit then reports what it can
        log.info("b70lab load-moment hook not installed (pid %d): %s", os.getpid(), e)
        return
    original = base_loader.process_weights_after_loading

    def process_weights_after_loading(model, *args, **kwargs):
        record_loaded_moments(model)
        return original(model, *args, **kwargs)

    base_loader.process_weights_after_loading = process_weights_after_loading
    log.info("b70lab load-moment hook installed (pid %d)", os.getpid())
