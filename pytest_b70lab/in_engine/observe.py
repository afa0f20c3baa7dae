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


PACKED_FIELD_BITS = 4  # compressed-tensors pack-quantized INT4: eight 4-bit fields per int32 word


def moments(tensor) -> dict:
    """float64 sum, sum of squares and element count; for an int32 tensor (pack-quantized weights) also the
    sum and sum of squares of its 4-bit fields, exact integers: a word's low fields are below the float64
    rounding of its own sum of squares, so a flipped low nibble would not move the word moments."""
    t = tensor.detach().to("cpu")
    d = t.double()
    out: dict = {"sum": float(d.sum()), "sumsq": float((d * d).sum()), "numel": int(t.numel())}
    if str(t.dtype) == "torch.int32":
        out["nibbles"] = nibble_moments(t)
    return out


def nibble_moments(words) -> dict[str, float]:
    bits = words.reshape(-1).long() & 0xFFFFFFFF  # the word's 32 bits, unsigned
    total = squares = 0
    for shift in range(0, 32, PACKED_FIELD_BITS):
        field = (bits >> shift) & ((1 << PACKED_FIELD_BITS) - 1)
        total += int(field.sum())
        squares += int((field * field).sum())
    return {"sum": float(total), "sumsq": float(squares)}


def add_moments(parts: list[dict]) -> dict:
    """The moments of a tensor from those of its pieces (row chunks, tensor-parallel shards, fused members)."""
    total: dict = {k: sum(p[k] for p in parts) for k in ("sum", "sumsq", "numel")}
    if parts and all("nibbles" in p for p in parts):
        total["nibbles"] = {k: sum(p["nibbles"][k] for p in parts) for k in ("sum", "sumsq")}
    return total


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
