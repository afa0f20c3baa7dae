"""vLLM worker extension (`--worker-extension-cls pytest_b70lab.worker_ext.AuditExtension`).

vLLM mixes this class into every worker, so its methods run on every rank; with VLLM_SERVER_DEV_MODE=1
they are reachable as `POST /collective_rpc {"method": "b70lab_audit"}`, one JSON result per rank. The
audit reads what the kernels will actually use (the `_k_scale_float` a layer hands to attention, the KV
tensor's dtype), not what the configuration asked for.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import psutil

from . import no_ray


def _call(fn, default=None):
    try:
        return fn()
    except Exception as e:  # an audit reports what it could not read instead of failing the whole call
        return default if default is not None else f"unavailable: {type(e).__name__}: {e}"


def _oom_score_adj() -> int:
    with open("/proc/self/oom_score_adj") as f:
        return int(f.read())


# At most this much of a tensor is on the host at once while it is hashed: a production rank holds
# gigabytes of weights, and a whole-tensor host copy (plus its bytes() copy) would double the largest.
HASH_CHUNK_BYTES = 64 << 20
_hashed = {"bytes": 0, "seconds": 0.0}


def _tensor_sha256(t) -> str:
    """SHA-256 of the tensor's bytes, streamed in chunks (the same digest as hashing them at once)."""
    import torch

    t0 = time.perf_counter()
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    digest = hashlib.sha256()
    for start in range(0, flat.numel(), HASH_CHUNK_BYTES):
        digest.update(flat[start : start + HASH_CHUNK_BYTES].cpu().numpy().data)
    _hashed["bytes"] += flat.numel()
    _hashed["seconds"] += time.perf_counter() - t0
    return digest.hexdigest()


def _parameters(model) -> dict[str, dict[str, Any]]:
    """Every parameter: dtype, shape, sha256 of its bytes, and its moments as loaded. Layers that vLLM
    post-processed after loading (repacked, moved into a kernel handle, emptied) report the moments
    observe stored just before that step, including parameters the step removed."""
    from .observe import LOADED_MOMENTS_ATTR, moments

    out = {}
    for module_name, module in model.named_modules():
        loaded = getattr(module, LOADED_MOMENTS_ATTR, None) or {}
        present = dict(module.named_parameters(recurse=False))
        for name in sorted(set(present) | set(loaded)):
            full = f"{module_name}.{name}" if module_name else name
            p = present.get(name)
            entry: dict[str, Any] = {
                "dtype": None if p is None else str(p.dtype).removeprefix("torch."),
                "shape": None if p is None else list(p.shape),
                "sha256": None if p is None else _tensor_sha256(p),
            }
            if name in loaded:
                entry["moments"], entry["moments_from"] = loaded[name], "load"
            else:
                entry["moments"], entry["moments_from"] = moments(p), "parameter"
            out[full] = entry
    return out


def _attention_layer(layer) -> dict[str, Any]:
    kv = getattr(layer, "kv_cache", None)
    if isinstance(kv, (list, tuple)):
        kv = kv[0] if kv else None
    return {
        "kv_cache_dtype": getattr(layer, "kv_cache_dtype", None),
        "k_scale": _call(lambda: float(layer._k_scale_float)),
        "v_scale": _call(lambda: float(layer._v_scale_float)),
        "calculate_kv_scales": getattr(layer, "calculate_kv_scales", None),
        "backend": _call(lambda: layer.attn_backend.get_name()),
        "impl": _call(lambda: type(layer.impl).__name__),
        "isa": getattr(layer.impl, "isa", getattr(layer, "isa", None)) if hasattr(layer, "impl") else None,
        "quant_method": type(getattr(layer, "quant_method", None)).__name__,
        "kv_tensor": None
        if kv is None or not hasattr(kv, "dtype")
        else {"dtype": str(kv.dtype).removeprefix("torch."), "shape": list(kv.shape)},
        "num_heads": getattr(layer, "num_heads", None),
        "num_kv_heads": getattr(layer, "num_kv_heads", None),
        "head_size": getattr(layer, "head_size", None),
    }


def _plain(value):
    """JSON-safe copy of a config value (quantization configs may be dicts or objects)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    return str(value)


def _compile_counters() -> dict[str, Any]:
    """vLLM's compilation counter and Dynamo's own counts, as this worker process saw them."""
    from torch._dynamo.utils import counters
    from vllm.compilation.counter import compilation_counter

    return {
        "vllm": {k: v for k, v in vars(compilation_counter).items() if isinstance(v, (int, float))},
        "dynamo_unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "dynamo_graph_breaks": int(sum(counters["graph_break"].values())),
        "dynamo_graph_break_reasons": sorted(map(str, counters["graph_break"]))[:20],
    }


def _compiled_modules(models: dict[str, Any]) -> list[dict[str, Any]]:
    """Each torch.compile'd module of the target and the draft, and whether this start compiled it or loaded
    it from vLLM's AOT compile cache: a loaded module is traced by no one, so Dynamo counts no graph for it."""
    found = []
    for owner, model in models.items():
        for module in model.modules() if model is not None else ():
            if not hasattr(module, "was_aot_compile_fn_loaded_from_disk"):
                continue
            artifacts = getattr(getattr(module, "aot_compiled_fn", None), "_artifacts", None)
            source = (
                "loaded"
                if module.was_aot_compile_fn_loaded_from_disk
                else "compiled"
                if getattr(module, "compiled", False)
                else "not compiled"
            )
            found.append(
                {
                    "owner": owner,
                    "class": type(module).__name__,
                    "tag": getattr(module, "_compile_tag", "") or None,
                    "source": source,
                    "aot_backend": getattr(artifacts, "backend_name", None),
                }
            )
    return found


def _backend_name(backend) -> str | None:
    """The attention backend the configuration forces (an enum member's name), or None for automatic."""
    return None if backend is None else getattr(backend, "name", str(backend))


def _runtime_fixes() -> dict[str, str]:
    """What each of the package's runtime fixes of vLLM did in this process ("applied", "not needed",
    "disabled"): recorded at start time, so that a sealed record says which were active, not what the checkout
    holds when it is sealed. Read, never applied here: a fix registered this late would change the engine."""
    from . import dflash_fix, fixes

    found = dict(fixes.registered() or {})
    found[dflash_fix.FIX_NAME] = dflash_fix.registered() or "not registered"
    return found


def _fp8_attention() -> dict[str, Any]:
    """Which FP8 attention ran on this rank: vLLM's own ops or the portable path, the op library this process
    mapped (`_C`, `_C_AVX512`, `_C_AVX2`: the ISA name alone reads `vec` on both kinds of CPU), and the CPU
    emulation in force."""
    import torch

    from . import cpu_emulation, portable_fp8

    return {
        **portable_fp8.state(),
        "op_library": cpu_emulation.loaded_op_library(),
        "native_supported": portable_fp8.native_fp8_supported(),
        "emulated_cpu": cpu_emulation.applied(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _int4_weights() -> dict[str, Any]:
    """Which path this rank's INT4 layers run: the portable one or vLLM's kernel by name, counted per layer
    kind, with the reasons (none of it where no INT4 layer was created)."""
    from . import cpu_emulation, portable_int4

    return {**portable_int4.state(), "op_library": cpu_emulation.loaded_op_library()}


class AuditExtension:
    """Methods vLLM adds to each worker. `self` is the worker (model_runner, vllm_config, rank...)."""

    # The worker's own attributes, as far as these methods read them (vLLM's types are not followed).
    model_runner: Any
    vllm_config: Any

    def b70lab_audit(self) -> dict[str, Any]:
        from vllm.distributed import parallel_state as ps
        from vllm.model_executor.layers.attention import Attention

        # Which start this rank belongs to: the nonce its launch handed it, and its process's own creation
        # time (with the pid, what a copy of another start's audit cannot have).
        out: dict[str, Any] = {
            "pid": os.getpid(),
            "global_rank": getattr(self, "rank", None),
            "start_nonce": os.environ.get("B70LAB_START_NONCE"),
            "process_started": _call(lambda: psutil.Process().create_time()),
            # What a fleet must not change (issue 50): the rank's scheduling priority and OOM score as it runs,
            # and whether Ray got into it after all (in_engine/no_ray.py keeps it out).
            "process": {
                "niceness": _call(lambda: os.getpriority(os.PRIO_PROCESS, 0)),
                "oom_score_adj": _call(_oom_score_adj),
                "ray_loaded": no_ray.loaded(),
            },
        }
        for key, getter in (("tp", "get_tp_group"), ("ep", "get_ep_group"), ("pp", "get_pp_group")):
            group = _call(lambda g=getter: getattr(ps, g)(), default=None)
            out[f"{key}_rank"] = getattr(group, "rank_in_group", None)
            out[f"{key}_size"] = getattr(group, "world_size", None)

        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        # The forward context holds the draft's attention layers too; the target's are the model's own.
        target_layers = {getattr(m, "layer_name", None) for m in model.modules() if isinstance(m, Attention)}
        context = runner.compilation_config.static_forward_context
        out["attention_layers"] = {
            name: {**_attention_layer(layer), "owner": "target" if name in target_layers else "draft"}
            for name, layer in sorted(context.items())
            if isinstance(layer, Attention)
        }
        out["router_bias"] = {
            name: [float(x) for x in p.detach().float().flatten().tolist()]
            for name, p in model.named_parameters()
            if name.endswith("e_score_correction_bias")
        }
        _hashed.update(bytes=0, seconds=0.0)
        t0 = time.perf_counter()
        out["parameters"] = _parameters(model)
        drafter = getattr(runner, "drafter", None)
        draft_model = getattr(drafter, "model", None)
        out["draft_parameters"] = _parameters(draft_model) if draft_model is not None else None
        # What the weight audit cost on this rank: its bytes hashed, the hashing time, the whole walk.
        out["audit_cost"] = {
            "bytes_hashed": _hashed["bytes"],
            "hash_seconds": round(_hashed["seconds"], 4),
            "parameters_seconds": round(time.perf_counter() - t0, 4),
        }
        out.update(_resolved_config(self.vllm_config, model, draft_model))
        return out


def _resolved_config(cfg, model, draft_model) -> dict[str, Any]:
    """What the engine resolved of its configuration, as the launch-flags, scale and compile gates read it."""
    out: dict[str, Any] = {}
    out["cache_config"] = {
        "cache_dtype": cfg.cache_config.cache_dtype,
        "block_size": cfg.cache_config.block_size,
        "enable_prefix_caching": cfg.cache_config.enable_prefix_caching,
        "calculate_kv_scales": getattr(cfg.cache_config, "calculate_kv_scales", None),
    }
    out["scheduler_config"] = {
        "async_scheduling": cfg.scheduler_config.async_scheduling,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
    }
    par = cfg.parallel_config
    out["parallel_config"] = {
        "tensor_parallel_size": par.tensor_parallel_size,
        "enable_expert_parallel": par.enable_expert_parallel,
        "pipeline_parallel_size": par.pipeline_parallel_size,
    }
    spec = cfg.speculative_config
    out["speculative_config"] = (
        None
        if spec is None
        else {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "model": getattr(spec, "model", None),
        }
    )
    out["target_quantization"] = _call(lambda: _plain(getattr(cfg.model_config.hf_config, "quantization_config", None)))
    out["draft_quantization"] = (
        None
        if spec is None
        else _call(lambda: _plain(getattr(spec.draft_model_config.hf_config, "quantization_config", None)))
    )
    cc = cfg.compilation_config
    out["compilation"] = {
        "mode": str(cc.mode),
        "backend": cc.backend,
        "cudagraph_mode": str(cc.cudagraph_mode),
        "splitting_ops": list(cc.splitting_ops or []),
    }
    out["compile_counters"] = _call(_compile_counters)
    out["compiled_modules"] = _call(lambda: _compiled_modules({"target": model, "draft": draft_model}))
    out["model_dtype"] = str(cfg.model_config.dtype).removeprefix("torch.")
    # What the launch-flags gate compares with the contract, field by field, as the engine resolved it.
    mc = cfg.model_config
    out["model_config"] = {
        "max_model_len": mc.max_model_len,
        "seed": mc.seed,
        "enforce_eager": mc.enforce_eager,
        "dtype": out["model_dtype"],
    }
    out["device_type"] = _call(lambda: str(cfg.device_config.device_type))
    out["attention_config"] = _call(lambda: {"backend": _backend_name(cfg.attention_config.backend)})
    out["fp8_attention"] = _call(_fp8_attention)
    out["int4"] = _call(_int4_weights)
    out["runtime_fixes"] = _call(_runtime_fixes)
    return out
