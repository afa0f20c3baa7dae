"""The promotion gates: pure functions from evidence (and the contract) to a verdict with its reasons.

No gate launches anything or reads anything but its arguments, so a saved run can be judged again on
any machine. Each verdict carries the observed values, which the tests attach as JUnit properties.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .contract import Contract
from .evidence import Evidence, sha256_ids
from .mini import kv_scale_digest

# Every gate a promotion needs (a run that did not evaluate one of them is not promotable).
CATALOGUE = ("target-scale-audit", "draft-cache-audit", "engine-resolution", "metrics-agree", "teacher-exactness",
             "cold-prompt", "compile-topology", "fresh-start-reproduction", "launch-flags", "load-audit",
             "spec-counters", "token-count")
FP8_KV_DTYPES = {"fp8", "fp8_e4m3"}
FP8_STORAGE_DTYPES = {"uint8", "float8_e4m3fn"}


@dataclass
class Verdict:
    gate: str
    subject: str
    passed: bool
    reasons: list[str] = field(default_factory=list)
    observed: dict[str, Any] = field(default_factory=dict)

    def explain(self) -> str:
        head = f"{self.gate} [{self.subject}]: {'PASS' if self.passed else 'FAIL'}"
        return head + "".join(f"\n  - {r}" for r in self.reasons)


class _Check:
    """Collects failed expectations; a verdict passes when none failed."""

    def __init__(self, gate: str, subject: str):
        self.verdict = Verdict(gate, subject, True)

    def expect(self, ok: bool, reason: str) -> bool:
        if not ok:
            self.verdict.passed = False
            self.verdict.reasons.append(reason)
        return ok

    def observe(self, **values: Any) -> None:
        self.verdict.observed.update(values)

    def done(self) -> Verdict:
        return self.verdict


def _started(check: _Check, start: Evidence) -> bool:
    return check.expect(start.status == "ok",
                        f"start-{start.start_index} did not complete: "
                        f"{start.failure.message.splitlines()[0] if start.failure else 'no failure recorded'}")


def _request(check: _Check, start: Evidence, prompt_id: str):
    """The start's request for `prompt_id`, or None (and a failed check) when the start or the request is
    missing."""
    if not _started(check, start):
        return None
    request = start.request(prompt_id)
    check.expect(request is not None, f"no request for prompt {prompt_id!r} in start-{start.start_index}")
    return request


def _rank_audit(check: _Check, start: Evidence, rank: int) -> dict[str, Any] | None:
    """The start's audit from TP rank `rank`, or None (and a failed check) when the start or the audit is
    missing."""
    if not _started(check, start):
        return None
    audits = [a for a in start.audits if a.get("tp_rank") == rank]
    if not check.expect(len(audits) == 1, f"start-{start.start_index}: {len(audits)} audits from TP rank {rank} "
                                          f"(ranks seen: {sorted(a.get('tp_rank') for a in start.audits)})"):
        return None
    return audits[0]


def _layers(audit: dict[str, Any], owner: str) -> dict[str, dict[str, Any]]:
    return {n: layer for n, layer in audit.get("attention_layers", {}).items() if layer.get("owner") == owner}


# --- 1. target scale audit ---------------------------------------------------------------------------

def target_scale_audit(start: Evidence, rank: int, contract: Contract,
                       calibrated: dict[str, dict[str, float]] | None = None) -> Verdict:
    """Every target attention layer holds FP8 KV with the checkpoint's calibrated scalar scales; their
    count and digest are the contract's; nothing calculates scales at run time. `calibrated` (the mini
    manifest's per-layer values, when known) names the layer that differs."""
    c = _Check("target-scale-audit", f"start-{start.start_index} rank-{rank}")
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    layers = _layers(audit, "target")
    scales = {n: (layer["k_scale"], layer["v_scale"]) for n, layer in layers.items()}
    digest = kv_scale_digest(scales) if all(isinstance(v, float) for pair in scales.values() for v in pair) else None
    c.observe(scale_count=2 * len(layers), scale_digest=digest)
    c.expect(2 * len(layers) == contract.expect.target_kv_scale_count,
             f"{2 * len(layers)} K/V scales on {len(layers)} target layers, the contract expects "
             f"{contract.expect.target_kv_scale_count}")
    for name, layer in sorted(layers.items()):
        c.expect(layer.get("kv_cache_dtype") in FP8_KV_DTYPES,
                 f"{name}: KV cache dtype {layer.get('kv_cache_dtype')!r}, expected FP8")
        c.expect(layer.get("calculate_kv_scales") in (False, None),
                 f"{name}: calculates KV scales at run time")
        if scales[name] == (1.0, 1.0):
            c.expect(False, f"{name}: K and V scale are 1.0: the calibrated scales did not load")
        if calibrated is not None and name in calibrated:
            want = (calibrated[name]["k_scale"], calibrated[name]["v_scale"])
            c.expect(scales[name] == want, f"{name}: engine scales (k, v) = {scales[name]}, checkpoint has {want}")
    c.expect(digest == contract.expect.target_kv_scale_digest,
             f"scale digest {digest} != contract's {contract.expect.target_kv_scale_digest}")
    c.expect(audit.get("cache_config", {}).get("calculate_kv_scales") in (False, None),
             "the engine's cache config calculates KV scales at run time")
    return c.done()


# --- 2. draft cache audit ----------------------------------------------------------------------------

def draft_cache_audit(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """The draft's cache layers: the contract's count, FP8, unit scale; the draft declares no KV scheme."""
    c = _Check("draft-cache-audit", f"start-{start.start_index} rank-{rank}")
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    layers = _layers(audit, "draft")
    c.observe(draft_cache_layers=len(layers))
    c.expect(len(layers) == contract.expect.draft_unit_scale_layers,
             f"{len(layers)} draft cache layers, the contract expects {contract.expect.draft_unit_scale_layers}")
    for name, layer in sorted(layers.items()):
        c.expect(layer.get("kv_cache_dtype") in FP8_KV_DTYPES,
                 f"{name}: draft KV cache dtype {layer.get('kv_cache_dtype')!r}, expected FP8")
        c.expect((layer.get("k_scale"), layer.get("v_scale")) == (1.0, 1.0),
                 f"{name}: draft scales (k, v) = {(layer.get('k_scale'), layer.get('v_scale'))}, expected unit scale")
    quant = audit.get("draft_quantization")
    declares = isinstance(quant, dict) and quant.get("kv_cache_scheme") is not None
    c.expect(not declares, f"the draft checkpoint declares a KV calibration: {quant.get('kv_cache_scheme') if declares else ''}")
    return c.done()


# --- 3. engine resolution ----------------------------------------------------------------------------

def engine_resolution(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """Every target and draft layer resolved FP8 KV storage and the intended backend, with no fallback."""
    c = _Check("engine-resolution", f"start-{start.start_index} rank-{rank}")
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    want = contract.expect.attention_backend
    layers = audit.get("attention_layers", {})
    c.observe(backends=sorted({str(layer.get("backend")) for layer in layers.values()}))
    c.expect(bool(layers), "the audit found no attention layers")
    for name, layer in sorted(layers.items()):
        c.expect(layer.get("backend") == want, f"{name} ({layer.get('owner')}): backend {layer.get('backend')!r}, "
                                               f"expected {want!r}")
        c.expect(layer.get("kv_cache_dtype") == contract.engine.kv_cache_dtype,
                 f"{name}: KV dtype {layer.get('kv_cache_dtype')!r}, contract says {contract.engine.kv_cache_dtype!r}")
        tensor = layer.get("kv_tensor") or {}
        c.expect(tensor.get("dtype") in FP8_STORAGE_DTYPES,
                 f"{name}: KV cache tensor is {tensor.get('dtype')!r}, not 8-bit FP8 storage")
    fallbacks = start.log_findings.get("backend_fallback", [])
    c.expect(not fallbacks, f"backend fallback in the log: {fallbacks[0] if fallbacks else ''}")
    return c.done()


def metrics_agree(start: Evidence, contract: Contract) -> Verdict:
    """`vllm:cache_config_info` reports the contract's KV dtype, block size and prefix caching off."""
    c = _Check("metrics-agree", f"start-{start.start_index}")
    if not _started(c, start):
        return c.done()
    labels = _info_labels(start.metrics_after, "vllm:cache_config_info")
    c.observe(cache_config_info=labels)
    if not c.expect(labels is not None, "/metrics has no vllm:cache_config_info"):
        return c.done()
    c.expect(labels.get("cache_dtype") == contract.engine.kv_cache_dtype,
             f"/metrics cache_dtype={labels.get('cache_dtype')!r}, contract says {contract.engine.kv_cache_dtype!r}")
    c.expect(labels.get("block_size") == str(contract.engine.block_size),
             f"/metrics block_size={labels.get('block_size')!r}, contract says {contract.engine.block_size}")
    c.expect(labels.get("enable_prefix_caching") == "False",
             f"/metrics enable_prefix_caching={labels.get('enable_prefix_caching')!r}, expected False")
    return c.done()


# --- metrics helpers ---------------------------------------------------------------------------------

def _families(text: str | None):
    from prometheus_client.parser import text_string_to_metric_families

    return list(text_string_to_metric_families(text or ""))


def _info_labels(text: str | None, name: str) -> dict[str, str] | None:
    for family in _families(text):
        for sample in family.samples:
            if sample.name in (name, name.removesuffix("_info")) or family.name in (name, name.removesuffix("_info")):
                return dict(sample.labels)
    return None


def counter_total(text: str | None, name: str, **labels: str) -> float:
    """Sum of a counter's samples (its `_total` series) whose labels include `labels`."""
    total = 0.0
    for family in _families(text):
        if family.name != name.removesuffix("_total"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def counter_by_label(text: str | None, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in _families(text):
        if family.name != name.removesuffix("_total"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and label in sample.labels:
                out[sample.labels[label]] = out.get(sample.labels[label], 0.0) + sample.value
    return out


# --- 5. cold prompts ---------------------------------------------------------------------------------

def cold_prompt(start: Evidence, prompt_id: str) -> Verdict:
    """The prompt was computed from scratch: no cached tokens, and the prefix-cache hit counter did not move
    during the run."""
    c = _Check("cold-prompt", f"start-{start.start_index} {prompt_id}")
    if (request := _request(c, start, prompt_id)) is None:
        return c.done()
    hits = (counter_total(start.metrics_after, "vllm:prefix_cache_hits_total")
            - counter_total(start.metrics_before, "vllm:prefix_cache_hits_total"))
    c.observe(cached_tokens=request.cached_tokens, prefix_cache_hits_delta=hits)
    c.expect(request.cached_tokens == 0, f"{prompt_id}: {request.cached_tokens} cached prompt tokens, expected 0")
    c.expect(hits == 0, f"the prefix-cache hit counter moved by {hits:g} during the run")
    return c.done()


# --- 6. compile topology -----------------------------------------------------------------------------

def compile_topology(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """Graphs = the compiled pieces vLLM saw (piecewise graphs, or whole graphs where nothing is split);
    breaks = the split points between them plus Dynamo graph breaks."""
    c = _Check("compile-topology", f"start-{start.start_index} rank-{rank}")
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    counters = audit.get("compile_counters")
    if not c.expect(isinstance(counters, dict) and "vllm" in counters,
                    f"the audit has no compile counters ({counters!r})"):
        return c.done()
    graphs, breaks = topology(counters)
    c.observe(compile_graphs=graphs, compile_breaks=breaks, compilation_mode=audit.get("compilation", {}).get("mode"))
    c.expect(graphs == contract.expect.compile_graphs,
             f"{graphs} compiled graphs, the contract expects {contract.expect.compile_graphs}")
    c.expect(breaks == contract.expect.compile_breaks,
             f"{breaks} graph breaks, the contract expects {contract.expect.compile_breaks} "
             f"(Dynamo reasons: {counters.get('dynamo_graph_break_reasons')})")
    return c.done()


def topology(counters: dict[str, Any]) -> tuple[int, int]:
    """(graphs, breaks) from one rank's counters. Piecewise compilation (GPU/XPU) counts the pieces and the
    split points between them; where nothing is split (vLLM's CPU build traces each model once, the target
    and the draft), the graphs are Dynamo's unique graphs. Dynamo graph breaks always count as breaks."""
    v = counters["vllm"]
    whole = int(v.get("num_graphs_seen", 0))
    pieces = int(v.get("num_piecewise_graphs_seen", 0))
    if pieces:
        graphs, splits = pieces, max(pieces - max(whole, 1), 0)
    else:
        graphs, splits = whole or int(counters.get("dynamo_unique_graphs", 0)), 0
    return graphs, splits + int(counters.get("dynamo_graph_breaks", 0))


# --- 7. fresh-start reproduction ---------------------------------------------------------------------

def reproduction(starts: list[Evidence], contract: Contract) -> Verdict:
    """Every later start reproduces the first one's output exactly and its endpoint median decode rate
    within the contract's relative tolerance."""
    c = _Check("fresh-start-reproduction", f"{len(starts)} starts")
    need = contract.reproduction.fresh_starts
    c.expect(len(starts) == need, f"{len(starts)} fresh starts recorded, the contract asks for {need}")
    if not all(_started(c, s) for s in starts) or len(starts) < 2:
        c.expect(len(starts) >= 2 or need < 2, "reproduction needs at least two starts")
        return c.done()
    first = starts[0]
    medians = [s.throughput.endpoint_median for s in starts]
    c.observe(endpoint_medians=medians)
    for later in starts[1:]:
        for r in first.requests:
            other = later.request(r.prompt_id)
            if not c.expect(other is not None, f"start-{later.start_index} has no request for {r.prompt_id}"):
                continue
            if other.token_ids != r.token_ids:
                at = next((i for i, (a, b) in enumerate(zip(r.token_ids, other.token_ids)) if a != b),
                          min(len(r.token_ids), len(other.token_ids)))
                c.expect(False, f"{r.prompt_id}: start-{later.start_index} differs from start-1 at token {at}")
            c.expect(other.text_sha256 == r.text_sha256,
                     f"{r.prompt_id}: decoded text differs between start-1 and start-{later.start_index}")
        m0, m1 = first.throughput.endpoint_median, later.throughput.endpoint_median
        if c.expect(m0 is not None and m1 is not None and m0 > 0, "an endpoint median is missing"):
            drift = abs(m1 - m0) / m0
            c.observe(**{f"throughput_drift_start{later.start_index}": round(drift, 4)})
            c.expect(drift <= contract.reproduction.throughput_tolerance,
                     f"endpoint median {m1:.2f} tok/s at start-{later.start_index} vs {m0:.2f} at start-1: "
                     f"{drift:.1%} apart, tolerance {contract.reproduction.throughput_tolerance:.0%}")
    return c.done()


# --- beyond the seed ---------------------------------------------------------------------------------

def launch_flags(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """The engine's own view of its configuration equals the contract: any drift fails."""
    c = _Check("launch-flags", f"start-{start.start_index} rank-{rank}")
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    e = contract.engine
    seen = {
        "tensor_parallel": audit.get("parallel_config", {}).get("tensor_parallel_size"),
        "expert_parallel": audit.get("parallel_config", {}).get("enable_expert_parallel"),
        "kv_cache_dtype": audit.get("cache_config", {}).get("cache_dtype"),
        "block_size": audit.get("cache_config", {}).get("block_size"),
        "enable_prefix_caching": audit.get("cache_config", {}).get("enable_prefix_caching"),
        "async_scheduling": audit.get("scheduler_config", {}).get("async_scheduling"),
        "max_num_seqs": audit.get("scheduler_config", {}).get("max_num_seqs"),
        "speculative_method": (audit.get("speculative_config") or {}).get("method"),
        "num_speculative_tokens": (audit.get("speculative_config") or {}).get("num_speculative_tokens"),
        "dtype": audit.get("model_dtype"),
    }
    want = {
        "tensor_parallel": e.tensor_parallel, "expert_parallel": e.expert_parallel,
        "kv_cache_dtype": e.kv_cache_dtype, "block_size": e.block_size,
        "enable_prefix_caching": e.enable_prefix_caching, "async_scheduling": e.async_scheduling,
        "max_num_seqs": e.max_num_seqs,
        "speculative_method": contract.speculative.method if contract.speculative else None,
        "num_speculative_tokens": contract.speculative.num_speculative_tokens if contract.speculative else None,
        "dtype": e.dtype if e.dtype != "auto" else seen["dtype"],
    }
    c.observe(**{f"engine_{k}": v for k, v in seen.items()})
    for key, value in want.items():
        c.expect(seen[key] == value, f"{key}: engine has {seen[key]!r}, contract says {value!r}")
    return c.done()


def checkpoint_sources(engine_name: str, checkpoint: dict[str, dict[str, Any]]) -> list[str]:
    """The checkpoint tensors an engine parameter is made of (vLLM fuses q/k/v, gate/up and the experts)."""
    name = engine_name.replace(".routed_experts.", ".")
    for fused, parts in ((".qkv_proj.weight", (".q_proj.weight", ".k_proj.weight", ".v_proj.weight")),
                         (".gate_up_proj.weight", (".gate_proj.weight", ".up_proj.weight"))):
        if name.endswith(fused):
            stem = name[: -len(fused)]
            found = [stem + part for part in parts if stem + part in checkpoint]
            if found:
                return found
    for fused, parts in ((".experts.w13_weight", (".gate_proj.weight", ".up_proj.weight")),
                         (".experts.w2_weight", (".down_proj.weight",))):
        if name.endswith(fused):
            prefix = name[: -len(fused)] + ".experts."
            return sorted(k for k in checkpoint if k.startswith(prefix) and k.endswith(parts)
                          and k[len(prefix):].split(".")[0].isdigit())
    return [name] if name in checkpoint else []


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _moment_mismatches(per_rank: dict[Any, dict[str, dict[str, Any]]], checkpoint: dict[str, dict[str, Any]],
                       sources: Callable[[str], list[str]]) -> tuple[int, set[str], list[str]]:
    """Compare each engine parameter's moments with those of the checkpoint tensors it is made of: per rank
    where it is replicated, added over the ranks where it is sharded (zero padding adds nothing)."""
    covered: set[str] = set()
    problems: list[str] = []
    compared = 0
    for name in sorted({n for params in per_rank.values() for n in params}):
        parts = sources(name)
        if not parts:
            continue
        covered.update(parts)
        if any("moments" not in checkpoint[s] for s in parts):
            problems.append(f"{name}: the checkpoint manifest has no moments for {parts} (a model built by an "
                            f"older b70lab: rebuild with `b70lab mini build --force`)")
            continue
        want = {k: sum(checkpoint[s]["moments"][k] for s in parts) for k in ("sum", "sumsq", "numel")}
        seen = {rank: params[name].get("moments") for rank, params in per_rank.items() if name in params}
        if any(m is None for m in seen.values()):
            problems.append(f"{name}: the audit recorded no moments (evidence from an older b70lab audit)")
            continue
        compared += 1
        if all(m["numel"] == want["numel"] for m in seen.values()):
            for rank, m in sorted(seen.items()):
                if not (_close(m["sum"], want["sum"]) and _close(m["sumsq"], want["sumsq"])):
                    problems.append(f"{name} on rank {rank}: sum {m['sum']:.6g}, sum of squares {m['sumsq']:.6g}; "
                                    f"checkpoint {want['sum']:.6g}, {want['sumsq']:.6g}")
        else:
            total = {k: sum(m[k] for m in seen.values()) for k in ("sum", "sumsq", "numel")}
            if total["numel"] < want["numel"] or not (_close(total["sum"], want["sum"])
                                                       and _close(total["sumsq"], want["sumsq"])):
                problems.append(f"{name} over ranks {sorted(seen)}: sum {total['sum']:.6g}, sum of squares "
                                f"{total['sumsq']:.6g} over {total['numel']} values; checkpoint {want['sum']:.6g}, "
                                f"{want['sumsq']:.6g} over {want['numel']}")
    return compared, covered, problems


def load_audit(start: Evidence, target_tensors: dict[str, dict[str, Any]] | None,
               draft_tensors: dict[str, dict[str, Any]] | None = None,
               ignore_suffixes: tuple[str, ...] = (".k_scale", ".v_scale")) -> Verdict:
    """Every tensor of the target (and draft) checkpoint reached the engine with its values: the float64
    sum and sum of squares of what the ranks loaded equal those of the checkpoint tensors each engine
    parameter is made of. Moments see through tensor-parallel sharding, fusion, kernel repacking and zero
    padding; a tensor left at its initial value (a router bias at zero) or loaded from the wrong place
    changes them. KV scales are consumed at load and audited by the scale gate."""
    c = _Check("load-audit", f"start-{start.start_index}")
    if not _started(c, start):
        return c.done()
    if not c.expect(bool(target_tensors), "no checkpoint tensor digests to compare with (a hub model without a "
                                          "local manifest)"):
        return c.done()
    checks = [("target", target_tensors, {a.get("tp_rank"): a.get("parameters") or {} for a in start.audits},
               lambda n: checkpoint_sources(n, target_tensors))]
    if draft_tensors:
        # The draft's engine names carry a "model." prefix its checkpoint does not; embedding and lm_head
        # are shared from the target and have no draft tensor.
        checks.append(("draft", draft_tensors,
                       {a.get("tp_rank"): a.get("draft_parameters") or {} for a in start.audits},
                       lambda n: checkpoint_sources(n.removeprefix("model."), draft_tensors)))
    for label, tensors, per_rank, sources in checks:
        if not any(per_rank.values()):
            c.expect(False, f"{label}: the audit recorded no {label} parameters (evidence from an older b70lab audit)")
            continue
        compared, covered, problems = _moment_mismatches(per_rank, tensors, sources)
        missing = sorted(k for k in tensors if k not in covered and not k.endswith(ignore_suffixes))
        c.observe(**{f"{label}_parameters_compared": compared, f"{label}_tensors_covered": len(covered),
                     f"{label}_tensors": len(tensors), f"{label}_mismatched": len(problems)})
        c.expect(not problems, f"{label}: {len(problems)} mismatch(es) with the checkpoint: "
                               + "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else ""))
        c.expect(not missing, f"{label}: {len(missing)} checkpoint tensors never reached an engine parameter: "
                              + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
    return c.done()


def spec_counters(start: Evidence, contract: Contract) -> Verdict:
    """Speculative counters are consistent: draft tokens = k × drafts, per-position acceptance counts never
    increase with the position, and their sum is the accepted total."""
    c = _Check("spec-counters", f"start-{start.start_index}")
    if not _started(c, start):
        return c.done()
    if contract.speculative is None:
        return c.done()
    k = contract.speculative.num_speculative_tokens

    def delta(name: str) -> float:
        return counter_total(start.metrics_after, name) - counter_total(start.metrics_before, name)

    drafts = delta("vllm:spec_decode_num_drafts_total")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    before = counter_by_label(start.metrics_before, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    after = counter_by_label(start.metrics_after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    per_pos = [after.get(p, 0.0) - before.get(p, 0.0) for p in sorted(after, key=int)]
    c.observe(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted, accepted_per_position=per_pos)
    c.expect(drafts > 0, "no drafts were proposed: speculation did not run")
    c.expect(draft_tokens == k * drafts, f"draft tokens {draft_tokens:g} != {k} × drafts {drafts:g}")
    c.expect(all(a >= b for a, b in zip(per_pos, per_pos[1:])),
             f"per-position accepted counts increase somewhere: {per_pos}")
    c.expect(sum(per_pos) == accepted, f"per-position accepted sum {sum(per_pos):g} != accepted {accepted:g}")
    c.expect(len(per_pos) in (0, k), f"{len(per_pos)} acceptance positions, expected {k}")
    return c.done()


def token_count(start: Evidence, prompt_id: str, contract: Contract) -> Verdict:
    """The reported completion token count equals the token IDs received, and the contract's count."""
    c = _Check("token-count", f"start-{start.start_index} {prompt_id}")
    if (r := _request(c, start, prompt_id)) is None:
        return c.done()
    reported = r.usage.get("completion_tokens")
    c.observe(reported=reported, received=len(r.token_ids), chunk_tokens=sum(r.chunk_tokens))
    n = contract.decode.tokens_per_request
    c.expect(reported == len(r.token_ids), f"{prompt_id}: usage says {reported} tokens, {len(r.token_ids)} IDs received")
    c.expect(sum(r.chunk_tokens) == len(r.token_ids), f"{prompt_id}: chunks carried {sum(r.chunk_tokens)} tokens, "
                                                      f"{len(r.token_ids)} IDs received")
    c.expect(len(r.token_ids) == n, f"{prompt_id}: {len(r.token_ids)} tokens, the contract asks for {n}")
    c.expect(r.token_ids_sha256 == sha256_ids(r.token_ids), f"{prompt_id}: recorded token hash does not match the IDs")
    return c.done()


# --- 4. teacher exactness ----------------------------------------------------------------------------

def teacher_exactness(start: Evidence, prompt_id: str, contract: Contract, snapshot: dict[str, Any] | None,
                      snapshot_file: str) -> Verdict:
    """Token-ID hash and text hash equal the FP8 teacher's, and the snapshot is this contract's teacher:
    target-only, FP8, same engine version and model. A missing, stale, non-FP8 or foreign snapshot fails."""
    from . import teacher

    c = _Check("teacher-exactness", f"start-{start.start_index} {prompt_id}")
    record = teacher.RECORD_COMMAND.format(name=contract.name)
    if not _started(c, start):
        return c.done()
    if not c.expect(snapshot is not None, f"no teacher snapshot for {prompt_id} at {snapshot_file}; "
                                          f"record one with `{record}`"):
        return c.done()
    want = teacher.identity(contract, start)
    have = snapshot["teacher"]
    c.observe(teacher_output_digest=have.get("output_digest"), snapshot=snapshot_file)
    c.expect(have.get("kind") == "teacher" and not any(have.get("engine_speculative_config") or []),
             f"the snapshot was not recorded by a target-only teacher ({have.get('engine_speculative_config')})")
    fp8 = have.get("kv_cache_dtype") in FP8_KV_DTYPES and all(
        d in FP8_KV_DTYPES for d in have.get("engine_kv_cache_dtypes") or [None])
    c.expect(fp8, f"the teacher did not run an FP8 KV cache (contract {have.get('kv_cache_dtype')!r}, "
                  f"engine {have.get('engine_kv_cache_dtypes')!r})")
    c.expect(have.get("output_digest") == want["output_digest"],
             f"stale teacher: snapshot of a teacher with output digest {str(have.get('output_digest'))[:16]}..., "
             f"this contract's teacher is {want['output_digest'][:16]}... (models, engine arguments, prompts or "
             f"token count changed); re-record with `{record}`")
    c.expect(have.get("model_digest") == want["model_digest"],
             f"foreign teacher: recorded on model {have.get('model_digest')}, this run serves {want['model_digest']}")
    c.expect(have.get("engine_version") == want["engine_version"],
             f"teacher recorded on engine {have.get('engine_version')}, this run is {want['engine_version']}")
    c.expect(snapshot.get("prompt_id") == prompt_id, f"snapshot is of prompt {snapshot.get('prompt_id')!r}")
    if (r := _request(c, start, prompt_id)) is None:
        return c.done()
    c.observe(token_ids_sha256=r.token_ids_sha256, teacher_token_ids_sha256=snapshot["token_ids_sha256"])
    c.expect(len(r.token_ids) == snapshot["token_count"],
             f"{prompt_id}: {len(r.token_ids)} tokens, the teacher produced {snapshot['token_count']}")
    c.expect(r.token_ids_sha256 == snapshot["token_ids_sha256"],
             f"{prompt_id}: token IDs differ from the teacher (sha256 {r.token_ids_sha256[:16]}... vs "
             f"{snapshot['token_ids_sha256'][:16]}...)")
    c.expect(r.text_sha256 == snapshot["text_sha256"], f"{prompt_id}: decoded text differs from the teacher")
    return c.done()
