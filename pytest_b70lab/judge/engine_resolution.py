"""Gate 3 and what the engine reports of itself: every layer resolved FP8 KV and the intended attention backend
(and INT4 path) with no fallback, /metrics agrees, the launch flags are the contract's, the speculative counters
are consistent."""

from __future__ import annotations

from typing import Any

from ..contract.schema import Contract
from ..evidence.metrics import counter_by_label, counter_total, has_counter, info_labels
from ..evidence.record import Evidence
from .rules import (
    FP8_KV_DTYPES,
    FP8_STORAGE_DTYPES,
    Check,
    Verdict,
    rank_audit,
    started,
    subject,
)


def rank_log_name(contract: Contract, rank: int) -> str:
    """The evidence's log entry for a TP rank (vLLM tags worker lines `Worker`, `Worker_TP1` or
    `Worker_TP1_EP1`)."""
    e = contract.engine
    if e.tensor_parallel == 1:
        return "rank:Worker"
    return f"rank:Worker_TP{rank}_EP{rank}" if e.expert_parallel else f"rank:Worker_TP{rank}"


def engine_resolution(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """Every target and draft layer resolved FP8 KV storage and the intended backend, with no fallback
    (vLLM logs a fallback once, at INFO, and runs another backend: the scanned server log must exist)."""
    c = Check("engine-resolution", subject(start.start_index, rank=rank))
    if (audit := rank_audit(c, start, rank)) is None:
        return c.done()
    want = contract.expect.attention_backend
    layers = audit.get("attention_layers", {})
    c.observe(backends=sorted({str(layer.get("backend")) for layer in layers.values()}))
    c.expect(bool(layers), "the audit found no attention layers")
    for name, layer in sorted(layers.items()):
        c.expect(
            layer.get("backend") == want,
            f"{name} ({layer.get('owner')}): backend {layer.get('backend')!r}, expected {want!r}",
        )
        c.expect(
            layer.get("kv_cache_dtype") == contract.engine.kv_cache_dtype,
            f"{name}: KV dtype {layer.get('kv_cache_dtype')!r}, contract says {contract.engine.kv_cache_dtype!r}",
        )
        tensor = layer.get("kv_tensor") or {}
        if contract.engine.kv_cache_dtype in FP8_KV_DTYPES:
            c.expect(
                tensor.get("dtype") in FP8_STORAGE_DTYPES,
                f"{name}: KV cache tensor is {tensor.get('dtype')!r}, not 8-bit FP8 storage",
            )
        else:  # "auto": the cache is stored in the model's dtype
            c.expect(
                str(tensor.get("dtype")).removeprefix("torch.") == contract.engine.dtype,
                f"{name}: KV cache tensor is {tensor.get('dtype')!r}, the contract's KV dtype "
                f"{contract.engine.kv_cache_dtype!r} stores it as {contract.engine.dtype!r}",
            )
    if contract.engine.kv_cache_dtype.startswith("fp8"):
        _fp8_attention_path(c, audit, rank, contract.expect.fp8_attention)
    if contract.expect.int4_path is not None:
        _int4_path(c, audit, rank, contract.expect.int4_path)
    c.expect(
        "server" in start.logs,
        f"start-{start.start_index}: no server log recorded, so a backend fallback could not be looked for",
    )
    rank_log = rank_log_name(contract, rank)
    c.expect(
        rank_log in start.logs,
        f"start-{start.start_index}: no log of rank {rank} ({rank_log.removeprefix('rank:')}) "
        f"recorded; logs: {sorted(start.logs)}",
    )
    if c.expect(
        "backend_fallback" in start.log_findings,
        f"start-{start.start_index}: the server log was not scanned for backend fallbacks",
    ):
        fallbacks = [line for line in start.log_findings["backend_fallback"] if not _declared_fallback(start, line)]
        c.expect(not fallbacks, f"backend fallback in the log: {fallbacks[0] if fallbacks else ''}")
    return c.done()


def _fp8_attention_path(c: Check, audit: dict[str, Any], rank: int, accepted: str) -> None:
    """Which FP8 attention the rank ran (vLLM's own ops or the portable path) is the contract's to accept:
    a switch between them is never silent."""
    path = audit.get("fp8_attention")
    if not c.expect(
        isinstance(path, dict) and isinstance(path.get("portable"), bool),
        f"rank {rank}: the audit does not say which FP8 attention implementation ran (fp8_attention: {path!r})",
    ):
        return
    assert isinstance(path, dict)
    ran = "portable" if path["portable"] else "native"
    c.observe(fp8_attention=ran, op_library=path.get("op_library"), emulated_cpu=path.get("emulated_cpu"))
    c.expect(
        ran == "portable" or path.get("native_supported") is not False,
        f"rank {rank}: the audit says vLLM's native FP8 attention ran, yet that this CPU cannot run it "
        f"(op library {path.get('op_library')}): the audit contradicts itself",
    )
    why = f" ({path['reason']})" if path.get("reason") else ""
    c.expect(
        accepted in ("either", ran),
        f"rank {rank}: FP8 attention ran {ran}: {path.get('implementation')}{why}, op library "
        f"{path.get('op_library')}; the contract accepts {accepted} only",
    )


def _int4_path(c: Check, audit: dict[str, Any], rank: int, accepted: str) -> None:
    """Which path the rank's INT4 layers ran (the portable one, or vLLM's kernels by name), layer by layer, is
    the contract's to accept: a layer that switched is never silent."""
    int4 = audit.get("int4")
    if not c.expect(
        isinstance(int4, dict) and isinstance(int4.get("linear"), dict) and isinstance(int4.get("moe"), dict),
        f"rank {rank}: the audit does not say which INT4 weight path ran (int4: {int4!r})",
    ):
        return
    assert isinstance(int4, dict)
    layers = {f"{kind} {path}": n for kind in ("linear", "moe") for path, n in sorted(int4[kind].items())}
    c.observe(int4_layers=layers, int4_op_library=int4.get("op_library"))
    if not c.expect(
        bool(layers),
        f"rank {rank}: the contract expects INT4 weights, and no layer of this rank was served as INT4 (was the "
        f"checkpoint's quantization_config applied?)",
    ):
        return
    portable = {k: n for k, n in layers.items() if k.endswith(" portable")}
    native = {k: n for k, n in layers.items() if not k.endswith(" portable")}
    reasons = int4.get("reasons") or {}
    if accepted == "portable":
        c.expect(
            not native,
            f"rank {rank}: INT4 layers ran vLLM's kernels ({', '.join(f'{n} {k}' for k, n in native.items())}); "
            f"the contract accepts the portable path only",
        )
    elif accepted == "native":
        c.expect(
            not portable,
            f"rank {rank}: INT4 layers ran the portable path ({', '.join(f'{n} {k}' for k, n in portable.items())}"
            f": {'; '.join(f'{k}: {r}' for k, r in reasons.items())}); the contract accepts vLLM's kernels only",
        )


# The launch turns vLLM's spinning CPU SHM all-reduce off when the ranks lack cores (launch.
# ranks_need_blocking_allreduce), and vLLM then logs that it falls back to torch.distributed. That one
# fallback is a declared choice when the start's recorded environment says so; undeclared, it still fails.
SHM_ALLREDUCE_FALLBACK = "CPU SHM communicator disabled for group"


def _declared_fallback(start: Evidence, line: str) -> bool:
    return SHM_ALLREDUCE_FALLBACK in line and start.engine.environment.get("VLLM_CPU_SHM_ALLREDUCE") == "0"


def metrics_agree(start: Evidence, contract: Contract) -> Verdict:
    """`vllm:cache_config_info` reports the contract's KV dtype, block size and prefix caching off."""
    c = Check("metrics-agree", subject(start.start_index))
    if not started(c, start):
        return c.done()
    labels = info_labels(start.metrics_after, "vllm:cache_config_info")
    c.observe(cache_config_info=labels)
    if not c.expect(labels is not None, "/metrics has no vllm:cache_config_info"):
        return c.done()
    assert labels is not None
    c.expect(
        labels.get("cache_dtype") == contract.engine.kv_cache_dtype,
        f"/metrics cache_dtype={labels.get('cache_dtype')!r}, contract says {contract.engine.kv_cache_dtype!r}",
    )
    c.expect(
        labels.get("block_size") == str(contract.engine.block_size),
        f"/metrics block_size={labels.get('block_size')!r}, contract says {contract.engine.block_size}",
    )
    c.expect(
        labels.get("enable_prefix_caching") == "False",
        f"/metrics enable_prefix_caching={labels.get('enable_prefix_caching')!r}, expected False",
    )
    return c.done()


def launch_flags(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """The engine's own view of its configuration equals the contract, field by field: every engine field
    of the contract is compared with what the engine resolved; a field the audit did not record fails."""
    c = Check("launch-flags", subject(start.start_index, rank=rank))
    if (audit := rank_audit(c, start, rank)) is None:
        return c.done()
    missing = object()

    def at(*path: str) -> object:
        node: Any = audit
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return missing
            node = node[key]
        return node

    e = contract.engine
    spec = contract.speculative
    engine_spec = at("speculative_config")
    compared = {
        # contract field: (what the engine resolved, what the contract says)
        "device": (at("device_type"), e.device),
        "dtype": (at("model_config", "dtype"), e.dtype),
        "kv_cache_dtype": (at("cache_config", "cache_dtype"), e.kv_cache_dtype),
        "block_size": (at("cache_config", "block_size"), e.block_size),
        "tensor_parallel": (at("parallel_config", "tensor_parallel_size"), e.tensor_parallel),
        "expert_parallel": (at("parallel_config", "enable_expert_parallel"), e.expert_parallel),
        "enable_prefix_caching": (at("cache_config", "enable_prefix_caching"), e.enable_prefix_caching),
        "async_scheduling": (at("scheduler_config", "async_scheduling"), e.async_scheduling),
        "max_num_seqs": (at("scheduler_config", "max_num_seqs"), e.max_num_seqs),
        # vLLM 0.32 has no run-time KV scale calculation: it reports None, which is "off".
        "calculate_kv_scales": (
            False if (calc := at("cache_config", "calculate_kv_scales")) is None else calc,
            e.calculate_kv_scales,
        ),
        "max_model_len": (at("model_config", "max_model_len"), e.max_model_len),
        "compile_mode": (at("model_config", "enforce_eager"), e.compile_mode == "eager"),
        "attention_backend": (at("attention_config", "backend"), e.attention_backend),
        "seed": (at("model_config", "seed"), e.seed),
        "speculative.method": (
            engine_spec.get("method") if isinstance(engine_spec, dict) else engine_spec,
            spec.method if spec else None,
        ),
        "speculative.num_speculative_tokens": (
            engine_spec.get("num_speculative_tokens") if isinstance(engine_spec, dict) else engine_spec,
            spec.num_speculative_tokens if spec else None,
        ),
    }
    c.observe(
        **{f"engine_{k.replace('.', '_')}": (None if seen is missing else seen) for k, (seen, _) in compared.items()}
    )
    for key, (seen, want) in compared.items():
        if not c.expect(
            seen is not missing,
            f"{key}: the audit did not record the engine's value (evidence from an older b70lab audit?)",
        ):
            continue
        if key == "compile_mode":
            c.expect(seen == want, f"compile_mode: engine has enforce_eager={seen!r}, contract says {e.compile_mode!r}")
        else:
            c.expect(seen == want, f"{key}: engine has {seen!r}, contract says {want!r}")
    return c.done()


def spec_counters(start: Evidence, contract: Contract) -> Verdict:
    """Speculative counters are consistent: draft tokens = k × drafts, per-position acceptance counts never
    increase with the position, and their sum is the accepted total; and where the contract sets
    expect.min_accepted_per_draft, the start's accepted tokens per draft reach it."""
    c = Check("spec-counters", subject(start.start_index))
    if not started(c, start):
        return c.done()
    if contract.speculative is None:
        return c.done()
    k = contract.speculative.num_speculative_tokens

    names = (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    )
    absent = [
        f"{n} ({when})"
        for n in names
        for when, text in (("before", start.metrics_before), ("after", start.metrics_after))
        if not has_counter(text, n)
    ]
    if not c.expect(
        not absent, f"start-{start.start_index}: the contract speculates, but /metrics lacks {', '.join(absent)}"
    ):
        return c.done()

    def delta(name: str) -> float:
        return counter_total(start.metrics_after, name) - counter_total(start.metrics_before, name)

    drafts = delta(names[0])
    draft_tokens = delta(names[1])
    accepted = delta(names[2])
    before = counter_by_label(start.metrics_before, names[3], "position")
    after = counter_by_label(start.metrics_after, names[3], "position")
    per_pos = [after.get(p, 0.0) - before.get(p, 0.0) for p in sorted(after, key=int)]
    c.observe(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted, accepted_per_position=per_pos)
    c.expect(drafts > 0, "no drafts were proposed: speculation did not run")
    floor = contract.expect.min_accepted_per_draft
    if drafts > 0:
        c.observe(accepted_per_draft=round(accepted / drafts, 4))
    if floor is not None and drafts > 0:
        c.expect(
            accepted / drafts >= floor,
            f"start-{start.start_index}: the target accepted {accepted / drafts:.3f} draft tokens per draft "
            f"({accepted:g} over {drafts:g} drafts), the contract expects at least {floor:g} "
            f"(expect.min_accepted_per_draft): the draft no longer predicts this target",
        )
    c.expect(draft_tokens == k * drafts, f"draft tokens {draft_tokens:g} != {k} × drafts {drafts:g}")
    c.expect(
        all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False)),
        f"per-position accepted counts increase somewhere: {per_pos}",
    )
    c.expect(sum(per_pos) == accepted, f"per-position accepted sum {sum(per_pos):g} != accepted {accepted:g}")
    c.expect(
        sorted(after, key=int) == [str(i) for i in range(k)],
        f"acceptance recorded at positions {sorted(after, key=int)}, expected 0..{k - 1}",
    )
    return c.done()
