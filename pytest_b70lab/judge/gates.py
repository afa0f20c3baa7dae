"""The promotion gates: pure functions from evidence (and the contract) to a verdict with its reasons.

No gate launches anything or reads anything but its arguments, so a saved run can be judged again on
any machine. Each verdict carries the observed values, which the tests attach as JUnit properties.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..contract.schema import Contract
from ..digests import add_moments, kv_scale_digest
from ..evidence import throughput
from ..evidence.metrics import counter_by_label, counter_total, has_counter, info_labels
from ..evidence.record import Evidence, Request, sha256_ids

# Every gate a promotion needs, and what it is judged per: each (start, rank), (start, prompt), start, or
# the run as a whole. The verdict derives the required (gate, subject) pairs from this and the contract.
GATE_SCOPES = {
    "target-scale-audit": "rank",
    "draft-cache-audit": "rank",
    "engine-resolution": "rank",
    "metrics-agree": "start",
    "teacher-exactness": "prompt",
    "cold-prompt": "prompt",
    "compile-topology": "rank",
    "fresh-start-reproduction": "run",
    "launch-flags": "rank",
    "load-audit": "start",
    "spec-counters": "start",
    "token-count": "prompt",
}
# The evidence checks: that each start left all the evidence a gate reads, and that nothing outlived it or
# could reach it. A promotion requires them per start like any gate, so a selection that drops one leaves the
# run incomplete instead of promotable.
EVIDENCE_CHECK_SCOPES = {
    "evidence-start": "start",
    "evidence-ranks": "start",
    "evidence-metrics": "start",
    "evidence-prompts": "start",
    "evidence-teardown": "start",
    "evidence-exposure": "start",
    "evidence-probe": "start",
    "evidence-logs": "start",
}
SCOPES = {**GATE_SCOPES, **EVIDENCE_CHECK_SCOPES}
CATALOGUE = tuple(SCOPES)
SPECULATIVE_GATES = frozenset({"draft-cache-audit", "spec-counters"})
FP8_ONLY_GATES = frozenset({"target-scale-audit", "teacher-exactness"})
FP8_KV_DTYPES = {"fp8", "fp8_e4m3"}
FP8_STORAGE_DTYPES = {"uint8", "float8_e4m3fn"}


def subject(start: int | None = None, rank: int | None = None, prompt: str | None = None) -> str:
    """The one spelling of a gate's subject, shared by the gates, the tests' collection and the verdict."""
    if start is None:
        return "run"
    if rank is not None:
        return f"start-{start} rank-{rank}"
    if prompt is not None:
        return f"start-{start} prompt:{prompt}"
    return f"start-{start}"


def inapplicable(gate: str, contract: Contract) -> str | None:
    """Why `contract` does not need `gate`, or None: no speculation, no draft gates; the unquantized-KV
    reference (kind "reference") stores no FP8 and has no calibrated scales to audit, and its tokens are not
    held to the FP8 teacher (what FP8 KV changes is what it is there to measure)."""
    if contract.speculative is None and gate in SPECULATIVE_GATES:
        return (
            "the contract has no draft" if gate == "draft-cache-audit" else "the contract has no speculative decoding"
        )
    if contract.kind == "reference" and gate in FP8_ONLY_GATES:
        if gate == "teacher-exactness":
            return "the unquantized-KV reference is not held to the FP8 teacher"
        return "the unquantized-KV reference has no calibrated KV scales"
    return None


def applicable_gates(contract: Contract) -> list[str]:
    """The catalogue less what the contract makes inapplicable (`inapplicable`)."""
    return [g for g in CATALOGUE if inapplicable(g, contract) is None]


SCOPE_NAMES = ("rank", "prompt", "start", "run")


def required_subjects(
    contract: Contract, prompt_ids: list[str], extra_gates: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """Every (gate, subject) pair a promotion of `contract` needs, from the contract alone: its fresh starts,
    tensor-parallel ranks and prompt set; `extra_gates` ({name: scope}) are the gates other plugins add
    (hookspec `pytest_b70lab_gates`), required for every subject of their scope like the catalogue's."""
    starts = range(1, contract.reproduction.fresh_starts + 1)
    per = {
        "rank": [subject(s, rank=r) for s in starts for r in range(contract.engine.tensor_parallel)],
        "prompt": [subject(s, prompt=p) for s in starts for p in prompt_ids],
        "start": [subject(s) for s in starts],
        "run": [subject()],
    }
    scopes = {**{gate: SCOPES[gate] for gate in applicable_gates(contract)}, **(extra_gates or {})}
    return [(gate, subj) for gate, scope in scopes.items() for subj in per[scope]]


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
    return check.expect(
        start.status == "ok",
        f"start-{start.start_index} did not complete: "
        f"{start.failure.message.splitlines()[0] if start.failure else 'no failure recorded'}",
    )


def _request(check: _Check, start: Evidence, prompt_id: str) -> Request | None:
    """The start's request for `prompt_id`, or None (and a failed check) when the start or the request is
    missing."""
    if not _started(check, start):
        return None
    request = start.request(prompt_id)
    check.expect(request is not None, f"no request for prompt {prompt_id!r} in start-{start.start_index}")
    return request


def _every_pass(start: Evidence, prompt_id: str) -> list[tuple[str, Request]]:
    """Every request of the prompt (the interleaved schedule's later passes and attempts too), each labelled
    for a message: the output gates judge them all under the one (start, prompt) subject."""
    found = start.every_request(prompt_id)
    return [(prompt_id if i == 0 else f"{prompt_id} (request {i + 1} of {len(found)})", r) for i, r in enumerate(found)]


def _rank_audit(check: _Check, start: Evidence, rank: int) -> dict[str, Any] | None:
    """The start's audit from TP rank `rank`, or None (and a failed check) when the start or the audit is
    missing."""
    if not _started(check, start):
        return None
    audits = [a for a in start.audits if a.get("tp_rank") == rank]
    if not check.expect(
        len(audits) == 1,
        f"start-{start.start_index}: {len(audits)} audits from TP rank {rank} "
        f"(ranks seen: {sorted((a.get('tp_rank') for a in start.audits), key=_rank_order)})",
    ):
        return None
    return audits[0]


def _rank_order(rank: object) -> tuple[bool, int, str]:
    """Ranks in numeric order, then what is not a rank number (a missing or malformed tp_rank) by its text."""
    return (False, rank, "") if isinstance(rank, int) else (True, 0, repr(rank))


def _layers(audit: dict[str, Any], owner: str) -> dict[str, dict[str, Any]]:
    return {n: layer for n, layer in audit.get("attention_layers", {}).items() if layer.get("owner") == owner}


# --- evidence checks ---------------------------------------------------------------------------------


def evidence_start(start: Evidence) -> Verdict:
    """The start completed and became ready after a positive, finite time."""
    c = _Check("evidence-start", subject(start.start_index))
    if _started(c, start):
        ready = start.ready_s
        c.observe(ready_s=ready)
        c.expect(
            isinstance(ready, float | int) and math.isfinite(ready) and ready > 0,
            f"start-{start.start_index}: ready after {ready!r} s: the launch recorded no time to ready",
        )
    return c.done()


def evidence_ranks(start: Evidence, contract: Contract, log_sizes: Mapping[str, int] | None = None) -> Verdict:
    """Every tensor-parallel rank answered the audit once and has its own log. `log_sizes` ({log name:
    bytes}) are the run folder's rank logs where it keeps them (a replayed bundle may not): none may be
    empty."""
    c = _Check("evidence-ranks", subject(start.start_index))
    tp = contract.engine.tensor_parallel
    ranks = sorted((a.get("tp_rank") for a in start.audits), key=_rank_order)
    c.observe(audited_ranks=ranks)
    c.expect(
        ranks == list(range(tp)),
        f"start-{start.start_index}: audits from TP ranks {ranks}, expected one from each of 0..{tp - 1}",
    )
    want = {rank_log_name(contract, r) for r in range(tp)}
    missing = sorted(name.removeprefix("rank:") for name in want - set(start.logs))
    c.expect(not missing, f"start-{start.start_index}: no log of {', '.join(missing)}; logs: {sorted(start.logs)}")
    for name in sorted(want & set(start.logs)):
        if log_sizes is not None:
            size = log_sizes.get(start.logs[name])
            c.expect(
                bool(size),
                f"start-{start.start_index}: the log {start.logs[name]} of "
                f"{name.removeprefix('rank:')} is {'empty' if size == 0 else 'missing'}",
            )
    return c.done()


def evidence_metrics(start: Evidence) -> Verdict:
    """/metrics was scraped before and after the prompts (the counter gates subtract the two)."""
    c = _Check("evidence-metrics", subject(start.start_index))
    if _started(c, start):
        for when, text in (("before", start.metrics_before), ("after", start.metrics_after)):
            c.expect(
                bool(text) and "vllm:cache_config_info" in str(text),
                f"start-{start.start_index}: no /metrics scrape {when} the prompts (or one without "
                f"vllm:cache_config_info)",
            )
    return c.done()


def evidence_prompts(start: Evidence, prompt_ids: Sequence[str], contract: Contract) -> Verdict:
    """One request per prompt of the set, no other, each with the contract's token count."""
    c = _Check("evidence-prompts", subject(start.start_index))
    if not _started(c, start):
        return c.done()
    seen = [r.prompt_id for r in start.requests]
    c.observe(requests=len(seen))
    missing = [p for p in prompt_ids if p not in seen]
    extra = sorted({p for p in seen if p not in prompt_ids or seen.count(p) > 1})
    c.expect(not missing, f"start-{start.start_index}: no request for {missing} of the prompt set")
    c.expect(not extra, f"start-{start.start_index}: requests outside the prompt set or repeated: {extra}")
    strays = sorted({r.prompt_id for r in start.repeats} - set(prompt_ids))
    c.expect(not strays, f"start-{start.start_index}: repeated requests for prompts outside the set: {strays}")
    n = contract.decode.tokens_per_request
    short = {r.prompt_id: len(r.token_ids) for r in start.requests if len(r.token_ids) != n}
    c.expect(not short, f"start-{start.start_index}: prompts without the contract's {n} tokens: {short}")
    return c.done()


def evidence_teardown(start: Evidence) -> Verdict:
    """Teardown saw the start's processes and every one of them is gone (also for a start that failed)."""
    c = _Check("evidence-teardown", subject(start.start_index))
    teardown = start.teardown or {}
    processes = teardown.get("processes") or []
    c.observe(processes=len(processes))
    if not c.expect(
        bool(processes),
        f"start-{start.start_index}: the evidence records no teardown, or one that "
        f"saw no process: whether anything outlived the start cannot be told",
    ):
        return c.done()
    survivors = [
        f"pid {p.get('pid')} {p.get('name')} ({str(p.get('cmdline'))[:80]})"
        for p in processes
        if p.get("gone") is not True
    ]
    c.expect(not survivors, f"start-{start.start_index}: still running after teardown: {'; '.join(survivors)}")
    c.expect(
        teardown.get("clean") is True or bool(survivors),
        f"start-{start.start_index}: teardown says it was not clean ({teardown.get('clean')!r}), though "
        f"every process it lists is gone",
    )
    return c.done()


def evidence_exposure(start: Evidence) -> Verdict:
    """Only its owner could reach the engine: the API (and vLLM's development endpoints) on the 0700 private
    socket only, the ranks' rendezvous and Gloo sockets on loopback only. No record proves nothing: it fails."""
    c = _Check("evidence-exposure", subject(start.start_index))
    exposure = start.exposure
    if not c.expect(
        bool(exposure), f"start-{start.start_index}: the evidence does not record who could reach the engine"
    ):
        return c.done()
    assert exposure is not None
    problems = exposure.get("problems")
    c.expect(
        problems == [],
        f"start-{start.start_index}: "
        + ("; ".join(map(str, problems)) if problems else f"exposure problems recorded as {problems!r}"),
    )
    listening = exposure.get("listening")
    if c.expect(isinstance(listening, list), f"start-{start.start_index}: the exposure record lists no sockets"):
        assert isinstance(listening, list)
        exposed = [
            f"{s.get('process')} on {s.get('address')}:{s.get('port')}"
            for s in listening
            if s.get("loopback") is not True
        ]
        c.expect(not exposed, f"start-{start.start_index}: listening beyond loopback: {'; '.join(exposed)}")
    api = str(exposure.get("api"))
    c.expect(
        api.startswith("unix "), f"start-{start.start_index}: the API listened on {api}, not the private Unix socket"
    )
    c.expect(
        exposure.get("socket_dir_mode") == "0o700",
        f"start-{start.start_index}: the socket folder's mode is {exposure.get('socket_dir_mode')!r}, not 0o700",
    )
    return c.done()


# Every kind of log line the launcher records (engine.live.log_findings), and what judges it. A kind the evidence
# carries that is not here, or a kind here the evidence lacks (its log was not scanned for it), fails.
LOG_FINDING_KINDS = {
    "backend_fallback": "judged by engine-resolution: an undeclared fallback fails it",
    "native_crash": "judged by evidence-logs: a process crashed",
    "error_record": "judged by evidence-logs: vLLM logged an error",
    "exception": "judged by evidence-logs: a process raised an exception",
    "kv_scale_notice": "informational where it is vLLM's generic FP8 notice (KV_SCALE_NOTICE); any other line "
    "about KV scales is judged by evidence-logs",
}
FAILING_FINDINGS = ("native_crash", "error_record", "exception")
# vLLM prints this in every start with an FP8 KV cache, whether or not calibrated scales were loaded: it says
# nothing about this start's scales, which target-scale-audit reads from the engine itself.
KV_SCALE_NOTICE = re.compile(
    r"Using fp8 data type to store kv cache\. It reduces the GPU memory footprint and "
    r"boosts the performance\. Meanwhile, it may cause accuracy drop without a proper "
    r"scaling factor\.?\s*$"
)


def evidence_logs(start: Evidence) -> Verdict:
    """Nothing the launcher found in the server log is ignored: every kind was scanned for and is known, no
    process crashed, raised or logged an error, and every KV-scale line is vLLM's generic FP8 notice."""
    c = _Check("evidence-logs", subject(start.start_index))
    found = start.log_findings
    c.observe(log_findings={kind: len(lines) for kind, lines in sorted(found.items())})
    unscanned = sorted(set(LOG_FINDING_KINDS) - set(found))
    c.expect(
        not unscanned,
        f"start-{start.start_index}: the server log was not scanned for {', '.join(unscanned)} "
        f"(evidence recorded before b70lab looked for them): re-record the run",
    )
    unknown = sorted(set(found) - set(LOG_FINDING_KINDS))
    c.expect(
        not unknown, f"start-{start.start_index}: log findings of unknown kind {unknown}: nothing here judges them"
    )
    for kind in FAILING_FINDINGS:
        lines = found.get(kind) or []
        c.expect(
            not lines,
            f"start-{start.start_index}: {LOG_FINDING_KINDS[kind].split(': ', 1)[1]}: "
            f"{lines[0] if lines else ''}" + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""),
        )
    odd = [line for line in found.get("kv_scale_notice") or [] if not KV_SCALE_NOTICE.search(line)]
    c.expect(
        not odd,
        f"start-{start.start_index}: a log line about KV scales that is not vLLM's generic FP8 notice: "
        f"{odd[0] if odd else ''}",
    )
    return c.done()


def evidence_probe(start: Evidence, contract: Contract) -> Verdict:
    """The seed's rule: a run's engine starts only after a collective probe over all its ranks passed (or
    the evidence says that the session turned the probe off)."""
    c = _Check("evidence-probe", subject(start.start_index))
    probe = start.probe
    if not c.expect(
        bool(probe), f"start-{start.start_index}: the evidence does not record the preflight collective probe"
    ):
        return c.done()
    assert probe is not None
    if "skipped" in probe:
        c.observe(probe=f"skipped: {probe['skipped']}")
        return c.done()
    c.expect(probe.get("passed") is True, f"start-{start.start_index}: the probe did not pass: {probe.get('problems')}")
    ranks = [
        r.get("rank")
        for r in probe.get("ranks") or []
        if r.get("correct") is True and "torn_down" in (r.get("reached") or [])
    ]
    c.expect(
        ranks == list(range(contract.engine.tensor_parallel)),
        f"start-{start.start_index}: the probe's ranks that answered correctly and were torn down: {ranks}, "
        f"expected 0..{contract.engine.tensor_parallel - 1}",
    )
    return c.done()


# --- 1. target scale audit ---------------------------------------------------------------------------


def target_scale_audit(
    start: Evidence, rank: int, contract: Contract, calibrated: dict[str, dict[str, float]] | None
) -> Verdict:
    """Every target attention layer holds FP8 KV with the checkpoint's calibrated scalar scales; their
    count and digest are the contract's; nothing calculates scales at run time. `calibrated` is the
    checkpoint's per-layer table (engine layer -> k_scale, v_scale): without it the gate cannot say which
    layer holds what, and fails."""
    c = _Check("target-scale-audit", subject(start.start_index, rank=rank))
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    layers = _layers(audit, "target")
    scales = {n: (layer["k_scale"], layer["v_scale"]) for n, layer in layers.items()}
    digest = kv_scale_digest(scales) if all(isinstance(v, float) for pair in scales.values() for v in pair) else None
    c.observe(scale_count=2 * len(layers), scale_digest=digest)
    c.expect(
        2 * len(layers) == contract.expect.target_kv_scale_count,
        f"{2 * len(layers)} K/V scales on {len(layers)} target layers, the contract expects "
        f"{contract.expect.target_kv_scale_count}",
    )
    c.expect(
        calibrated is not None,
        "no checkpoint table of calibrated scales to compare the engine's with "
        "(the target checkpoint could not be read: see the load-audit gate)",
    )
    for name, layer in sorted(layers.items()):
        c.expect(
            layer.get("kv_cache_dtype") in FP8_KV_DTYPES,
            f"{name}: KV cache dtype {layer.get('kv_cache_dtype')!r}, expected FP8",
        )
        # None: the engine has no run-time scale calculation at all (vLLM 0.32); an absent key: not audited.
        c.expect("calculate_kv_scales" in layer, f"{name}: the audit did not record calculate_kv_scales")
        c.expect(layer.get("calculate_kv_scales") in (False, None), f"{name}: calculates KV scales at run time")
        if scales[name] == (1.0, 1.0):
            c.expect(False, f"{name}: K and V scale are 1.0: the calibrated scales did not load")
        if calibrated is not None:
            if not c.expect(name in calibrated, f"{name}: the checkpoint has no calibrated scales for this layer"):
                continue
            want = (calibrated[name]["k_scale"], calibrated[name]["v_scale"])
            c.expect(scales[name] == want, f"{name}: engine scales (k, v) = {scales[name]}, checkpoint has {want}")
    for name in sorted(set(calibrated or {}) - set(layers)):
        c.expect(False, f"{name}: calibrated in the checkpoint, but no such target attention layer in the engine")
    c.expect(
        digest == contract.expect.target_kv_scale_digest,
        f"scale digest {digest} != contract's {contract.expect.target_kv_scale_digest}",
    )
    cache_config = audit.get("cache_config") or {}
    c.expect("calculate_kv_scales" in cache_config, "the audit did not record the cache config's calculate_kv_scales")
    c.expect(
        cache_config.get("calculate_kv_scales") in (False, None),
        "the engine's cache config calculates KV scales at run time",
    )
    return c.done()


# --- 2. draft cache audit ----------------------------------------------------------------------------


def draft_cache_audit(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """The draft's cache layers: the contract's count, FP8, unit scale; the draft declares no KV scheme."""
    c = _Check("draft-cache-audit", subject(start.start_index, rank=rank))
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    layers = _layers(audit, "draft")
    c.observe(draft_cache_layers=len(layers))
    c.expect(
        len(layers) == contract.expect.draft_unit_scale_layers,
        f"{len(layers)} draft cache layers, the contract expects {contract.expect.draft_unit_scale_layers}",
    )
    for name, layer in sorted(layers.items()):
        c.expect(
            layer.get("kv_cache_dtype") in FP8_KV_DTYPES,
            f"{name}: draft KV cache dtype {layer.get('kv_cache_dtype')!r}, expected FP8",
        )
        c.expect(
            (layer.get("k_scale"), layer.get("v_scale")) == (1.0, 1.0),
            f"{name}: draft scales (k, v) = {(layer.get('k_scale'), layer.get('v_scale'))}, expected unit scale",
        )
    # None: the draft's config has no quantization_config; a dict: it has one; anything else (absent, or
    # the audit's "unavailable: ..." note) means nobody looked, which is not "declares none".
    if not c.expect("draft_quantization" in audit, "the audit did not record the draft's quantization config"):
        return c.done()
    quant = audit["draft_quantization"]
    if not c.expect(
        quant is None or isinstance(quant, dict), f"the draft's quantization config could not be read: {quant!r}"
    ):
        return c.done()
    declares = isinstance(quant, dict) and quant.get("kv_cache_scheme") is not None
    c.expect(
        not declares,
        f"the draft checkpoint declares a KV calibration: {quant.get('kv_cache_scheme') if declares else ''}",
    )
    return c.done()


# --- 3. engine resolution ----------------------------------------------------------------------------


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
    c = _Check("engine-resolution", subject(start.start_index, rank=rank))
    if (audit := _rank_audit(c, start, rank)) is None:
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


def _fp8_attention_path(c: _Check, audit: dict[str, Any], rank: int, accepted: str) -> None:
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


def _int4_path(c: _Check, audit: dict[str, Any], rank: int, accepted: str) -> None:
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
    c = _Check("metrics-agree", subject(start.start_index))
    if not _started(c, start):
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


# --- 5. cold prompts ---------------------------------------------------------------------------------


def cold_prompt(start: Evidence, prompt_id: str) -> Verdict:
    """The prompt was computed from scratch: no cached tokens, and the prefix-cache hit counter did not move
    during the run."""
    c = _Check("cold-prompt", subject(start.start_index, prompt=prompt_id))
    if (request := _request(c, start, prompt_id)) is None:
        return c.done()
    c.observe(cached_tokens=request.cached_tokens)
    for label, r in _every_pass(start, prompt_id):
        c.expect(r.cached_tokens == 0, f"{label}: {r.cached_tokens} cached prompt tokens, expected 0")
    hits = "vllm:prefix_cache_hits_total"
    for when, text in (("before", start.metrics_before), ("after", start.metrics_after)):
        if not c.expect(
            has_counter(text, hits),
            f"start-{start.start_index}: /metrics {when} the prompts has no "
            f"{hits}: whether the prefix cache was hit cannot be told",
        ):
            return c.done()
    delta = counter_total(start.metrics_after, hits) - counter_total(start.metrics_before, hits)
    c.observe(prefix_cache_hits_delta=delta)
    c.expect(delta == 0, f"the prefix-cache hit counter moved by {delta:g} during the run")
    return c.done()


# --- 6. compile topology -----------------------------------------------------------------------------


def compile_topology(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """Graphs = the compiled pieces vLLM saw (piecewise graphs, or whole graphs where nothing is split);
    breaks = the split points between them plus Dynamo graph breaks."""
    c = _Check("compile-topology", subject(start.start_index, rank=rank))
    if (audit := _rank_audit(c, start, rank)) is None:
        return c.done()
    counters = audit.get("compile_counters")
    if not c.expect(
        isinstance(counters, dict) and isinstance(counters.get("vllm"), dict),
        f"the audit has no compile counters ({counters!r})",
    ):
        return c.done()
    assert isinstance(counters, dict)
    needed = {"num_graphs_seen", "num_piecewise_graphs_seen"} - set(counters["vllm"])
    needed |= {"dynamo_unique_graphs", "dynamo_graph_breaks"} - set(counters)
    if not c.expect(not needed, f"the audit's compile counters lack {sorted(needed)}"):
        return c.done()
    graphs, breaks = topology(counters)
    c.observe(compile_graphs=graphs, compile_breaks=breaks, compilation_mode=audit.get("compilation", {}).get("mode"))
    modules = audit.get("compiled_modules")
    if isinstance(modules, list):  # bundles recorded before the audit listed its compiled modules lack it
        c.observe(
            compiled_modules={
                f"{m.get('owner')}/{m.get('tag') or m.get('class')}": m.get("source")
                for m in modules
                if isinstance(m, dict)
            }
        )
        loaded = sum(1 for m in modules if isinstance(m, dict) and m.get("source") == "loaded")
        counted = int(counters["vllm"].get("num_aot_artifacts_loaded", 0))
        c.expect(
            loaded == counted,
            f"the audit lists {loaded} modules loaded from the AOT compile cache, "
            f"vLLM's counter says {counted}: which graphs this start compiled is unknown",
        )
    c.expect(
        graphs == contract.expect.compile_graphs,
        f"{graphs} compiled graphs, the contract expects {contract.expect.compile_graphs}",
    )
    c.expect(
        breaks == contract.expect.compile_breaks,
        f"{breaks} graph breaks, the contract expects {contract.expect.compile_breaks} "
        f"(Dynamo reasons: {counters.get('dynamo_graph_break_reasons')})",
    )
    return c.done()


def topology(counters: dict[str, Any]) -> tuple[int, int]:
    """(graphs, breaks) from one rank's counters. Piecewise compilation (GPU/XPU) counts the pieces and the
    split points between them (a graph loaded from the AOT compile cache goes through vLLM's backend again,
    so it is counted the same way); where nothing is split (vLLM's CPU build traces each model once with
    torch's own backend, the target and the draft), the graphs are Dynamo's unique graphs plus the whole
    graphs loaded from the AOT cache, which Dynamo never sees. An AOT artifact is captured with fullgraph,
    so a loaded one has no graph break; Dynamo graph breaks always count as breaks."""
    v = counters["vllm"]
    whole = int(v.get("num_graphs_seen", 0))
    pieces = int(v.get("num_piecewise_graphs_seen", 0))
    if pieces:
        graphs, splits = pieces, max(pieces - max(whole, 1), 0)
    else:
        traced = int(counters.get("dynamo_unique_graphs", 0)) + int(v.get("num_aot_artifacts_loaded", 0))
        graphs, splits = whole or traced, 0
    return graphs, splits + int(counters.get("dynamo_graph_breaks", 0))


# --- 7. fresh-start reproduction ---------------------------------------------------------------------


def reproduction(starts: list[Evidence], contract: Contract) -> Verdict:
    """Every later start reproduces the first one's output exactly, its endpoint median decode rate within
    the contract's throughput tolerance, and its paired figure (the geometric mean of per-prompt
    start-N / start-1 decode-rate ratios, recomputed from the token arrival times) within the paired
    tolerance: a consistent per-prompt shift fails whatever the medians do. Under the interleaved schedule
    every pass of every prompt is output, and the figures come from the pairs measured side by side
    (throughput.interleaved_ratio); a pair measured while the other start was busy fails."""
    c = _Check("fresh-start-reproduction", subject())
    need = contract.reproduction.fresh_starts
    c.expect(len(starts) == need, f"{len(starts)} fresh starts recorded, the contract asks for {need}")
    if not all(_started(c, s) for s in starts) or len(starts) < 2:
        c.expect(len(starts) >= 2 or need < 2, "reproduction needs at least two starts")
        return c.done()
    first = starts[0]
    _fresh_starts(c, starts)
    if not c.expect(bool(first.requests), "start-1 recorded no requests: there is no output to reproduce"):
        return c.done()
    for later in starts[1:]:
        _same_output(c, first, later)
    if not _schedule_matches(c, starts, contract):
        return c.done()
    figures = speed_figures(starts, contract)
    for problem in figures.problems:
        c.expect(False, problem)
    c.observe(endpoint_medians=figures.medians)
    for later, later_median, later_paired in zip(starts[1:], figures.medians[1:], figures.paired, strict=True):
        _judge_speed(c, later.start_index, figures.medians[0], later_median, later_paired, contract)
    return c.done()


@dataclass(frozen=True)
class SpeedFigures:
    """What gate 7 judges of speed: each start's endpoint median, each later start's paired figure against
    start-1, and every reason a figure could not be trusted (a request without a rate, a pair measured while
    the other start was busy). The bench reads the same figures from here."""

    medians: list[float | None]
    paired: list[throughput.PairedRatio | None]
    problems: list[str]


def speed_figures(starts: list[Evidence], contract: Contract) -> SpeedFigures:
    """Every figure from the token arrival times, never from what the evidence says they came to: sequentially,
    each start's one request per prompt; interleaved, the pairs of each pass (_interleaved_figures)."""
    if contract.reproduction.schedule == "interleaved":
        return _interleaved_figures(starts)
    problems: list[str] = []
    rates = []
    for s in starts:
        found, why = throughput.arrival_rates(s.requests)
        problems += [f"start-{s.start_index} {prompt_id}: {reason}" for prompt_id, reason in why.items()]
        rates.append(found)
    medians = [throughput.endpoint_median(list(r.values())) if r else None for r in rates]
    return SpeedFigures(medians, [throughput.paired_ratio(rates[0], r) for r in rates[1:]], problems)


def _same_output(c: _Check, first: Evidence, later: Evidence) -> None:
    """Every request of `later` (every pass and attempt) gives start-1's tokens and text for its prompt; so does
    every later pass of start-1 itself."""
    n = later.start_index
    for r in first.requests:
        if not c.expect(later.request(r.prompt_id) is not None, f"start-{n} has no request for {r.prompt_id}"):
            continue
        others = [(f"start-{n}", o) for o in later.every_request(r.prompt_id)]
        others += [("a later pass of start-1", o) for o in first.repeats if o.prompt_id == r.prompt_id]
        for who, other in others:
            if (at := first_difference(other.token_ids, r.token_ids)) is not None:
                c.expect(False, f"{r.prompt_id}: {who} differs from start-1 at token {at}")
            elif other.text_sha256 != r.text_sha256:
                c.expect(False, f"{r.prompt_id}: decoded text differs between start-1 and {who}")


def _schedule_matches(c: _Check, starts: list[Evidence], contract: Contract) -> bool:
    """Each start was measured under the contract's schedule, by this b70lab's quiet rule."""
    want = contract.reproduction
    ok = True
    for s in starts:
        got = s.schedule
        where = f"start-{s.start_index} evidence.schedule"
        if want.schedule == "sequential":
            ok &= c.expect(
                got is None, f"{where} says {got.name if got else None}; the contract's schedule is sequential"
            )
            continue
        if not c.expect(got is not None, f"{where} is absent; the contract's schedule is interleaved"):
            ok = False
            continue
        assert got is not None
        ok &= c.expect(
            got.passes == want.passes, f"{where}.passes is {got.passes}; the contract asks for {want.passes}"
        )
        for problem in got.rule_differences():
            ok &= c.expect(False, f"start-{s.start_index}: {problem}")
    return ok


def _interleaved_figures(starts: list[Evidence]) -> SpeedFigures:
    """Per start, the endpoint median over prompts of each prompt's median rate over the passes; per later
    start, its figure against start-1 from the pairs of each (pass, prompt) (throughput.interleaved_ratio).
    Every counted measurement must be clean: one measured while the other start was busy is named."""
    problems: list[str] = []
    rates: list[dict[tuple[int, str], float]] = []
    for s in starts:
        kept = s.counted()
        schedule = s.schedule
        assert schedule is not None
        problems += [
            f"start-{s.start_index} {prompt_id} pass {pass_index}: {dirty}, in all {m.attempt} attempts: no clean "
            f"measurement"
            for (pass_index, prompt_id), (m, _r) in sorted(kept.items())
            if (dirty := schedule.contamination(m)) is not None
        ]
        found, why = throughput.counted_rates(s)
        problems += [f"start-{s.start_index} {key[1]} pass {key[0]}: {reason}" for key, reason in why.items()]
        rates.append(found)
    medians = [throughput.pass_endpoint(found) for found in rates]
    paired = []
    for found in rates[1:]:
        both = [k for k in rates[0] if k in found]
        paired.append(throughput.interleaved_ratio(throughput.by_prompt([(rates[0][k], found[k]) for k in both], both)))
    return SpeedFigures(medians, paired, problems)


def _judge_speed(
    c: _Check,
    n: int,
    m0: float | None,
    m1: float | None,
    paired: throughput.PairedRatio | None,
    contract: Contract,
) -> None:
    tolerance, paired_tolerance = contract.reproduction.throughput_tolerance, contract.reproduction.paired
    if c.expect(
        m0 is not None and m1 is not None and m0 > 0,
        f"start-1 or start-{n}: no request has a decode rate from its arrival times, so no endpoint median",
    ):
        assert m0 is not None and m1 is not None
        drift = abs(m1 - m0) / m0
        c.observe(**{f"throughput_drift_start{n}": round(drift, 4)})
        c.expect(
            drift <= tolerance,
            f"endpoint median {m1:.2f} tok/s at start-{n} vs {m0:.2f} at start-1: "
            f"{drift:.1%} apart, tolerance {tolerance:.0%}",
        )
    if c.expect(paired is not None, f"no prompt has a decode rate at both start-1 and start-{n}: no paired figure"):
        assert paired is not None
        c.observe(
            **{
                f"paired_ratio_start{n}": round(paired.ratio, 4),
                f"paired_interval_start{n}": [round(paired.low, 4), round(paired.high, 4)],
            }
        )
        c.expect(
            paired.drift <= paired_tolerance,
            f"paired figure start-{n} / start-1 {paired.line()}: the geometric mean of the per-prompt "
            f"decode-rate ratios is {paired.drift:.1%} from 1, tolerance {paired_tolerance:.0%}",
        )


def _fresh_starts(c: _Check, starts: list[Evidence]) -> None:
    """Each start is a start of its own: it has an identity, every rank echoes its nonce (and no other start's),
    and no two starts share a nonce, a launch time or a rank process (pid and creation time)."""
    owner: dict[str, int] = {s.identity.nonce: s.start_index for s in starts if s.identity is not None}
    seen_nonce: dict[str, int] = {}
    seen_launch: dict[str, int] = {}
    seen_process: dict[tuple[Any, Any], int] = {}
    for s in starts:
        n = s.start_index
        if not c.expect(
            s.identity is not None,
            f"start-{n} records no start identity (evidence recorded before each start got a nonce): "
            f"nothing shows that it was a fresh start; re-record the run",
        ):
            continue
        assert s.identity is not None
        nonce = s.identity.nonce
        if (other := seen_nonce.setdefault(nonce, n)) != n:
            c.expect(
                False,
                f"start-{n} has start-{other}'s identity (nonce {nonce[:12]}...): a copy of one start, "
                f"not a second fresh start",
            )
            continue
        if (other := seen_launch.setdefault(s.identity.launched_at, n)) != n:
            c.expect(
                False,
                f"start-{n} was launched at {s.identity.launched_at}, as start-{other} was: not a "
                f"fresh start of its own",
            )
        for audit in s.audits:
            rank, echoed = audit.get("tp_rank"), audit.get("start_nonce")
            if echoed != nonce:
                whose = f"start-{owner[echoed]}'s" if echoed in owner else "another"
                c.expect(
                    False,
                    f"start-{n} rank {rank} echoes {whose} nonce ({str(echoed)[:12]}...), not its own "
                    f"start's ({nonce[:12]}...): its audit is not of this start",
                )
            process = (audit.get("pid"), audit.get("process_started"))
            if not c.expect(
                isinstance(process[1], float),
                f"start-{n} rank {rank}: the audit records no process creation time ({process[1]!r})",
            ):
                continue
            if (other := seen_process.setdefault(process, n)) != n:
                c.expect(
                    False,
                    f"start-{n} rank {rank} is process {process[0]} created at {process[1]}, a rank of "
                    f"start-{other}: the same engine, not a fresh start",
                )


# --- beyond the seed ---------------------------------------------------------------------------------


def launch_flags(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """The engine's own view of its configuration equals the contract, field by field: every engine field
    of the contract is compared with what the engine resolved; a field the audit did not record fails."""
    c = _Check("launch-flags", subject(start.start_index, rank=rank))
    if (audit := _rank_audit(c, start, rank)) is None:
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


def checkpoint_sources(engine_name: str, checkpoint: dict[str, dict[str, Any]]) -> list[str]:
    """The checkpoint tensors an engine parameter is made of. vLLM fuses q/k/v and gate/up, and stacks the
    experts (`experts.w13_<part>` = every expert's gate and up `<part>`); quantized layers keep the
    checkpoint's part names (`weight_packed`, `weight_scale`, ...), so the part carries through."""
    name = engine_name.replace(".routed_experts.", ".")
    for fused, members in (
        (".qkv_proj.", (".q_proj.", ".k_proj.", ".v_proj.")),
        (".gate_up_proj.", (".gate_proj.", ".up_proj.")),
    ):
        if fused in name:
            stem, part = name.rsplit(fused, 1)
            found = [stem + m + part for m in members if stem + m + part in checkpoint]
            if found:
                return found
    stem, _, leaf = name.rpartition(".experts.")
    for stacked, stacked_members in (("w13_", (".gate_proj.", ".up_proj.")), ("w2_", (".down_proj.",))):
        if stem and leaf.startswith(stacked):
            prefix, part = stem + ".experts.", leaf.removeprefix(stacked)
            return sorted(
                k
                for k in checkpoint
                if k.startswith(prefix)
                and k[len(prefix) :].split(".")[0].isdigit()
                and any(k.endswith(m + part) for m in stacked_members)
            )
    return [name] if name in checkpoint else []


# Checkpoint tensors the engine consumes at load instead of keeping as a parameter, and where they are
# audited instead.
CONSUMED_AT_LOAD = {
    "*.self_attn.k_scale": "KV scale, consumed at load: audited by target-scale-audit",
    "*.self_attn.v_scale": "KV scale, consumed at load: audited by target-scale-audit",
    "*.self_attn.k_proj.output_scale": "KV scale, consumed at load: audited by target-scale-audit",
    "*.self_attn.v_proj.output_scale": "KV scale, consumed at load: audited by target-scale-audit",
}


def _sources_in(
    checkpoint: dict[str, dict[str, Any]], to_checkpoint: Callable[[str], str]
) -> Callable[[str], list[str]]:
    """checkpoint_sources of an engine name, renamed as its checkpoint names it."""
    return lambda name: checkpoint_sources(to_checkpoint(name), checkpoint)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _same_values(seen: dict[str, Any], want: dict[str, Any]) -> bool:
    """Sums and sums of squares agree, and so do the packed words' 4-bit fields where both sides have them
    (a flipped low nibble moves only those)."""
    if not (_close(seen["sum"], want["sum"]) and _close(seen["sumsq"], want["sumsq"])):
        return False
    a, b = seen.get("nibbles"), want.get("nibbles")
    return not (isinstance(a, dict) and isinstance(b, dict)) or (a["sum"] == b["sum"] and a["sumsq"] == b["sumsq"])


def _described(m: dict[str, Any]) -> str:
    fields = f", 4-bit fields {m['nibbles']['sum']:.0f} / {m['nibbles']['sumsq']:.0f}" if "nibbles" in m else ""
    return f"sum {m['sum']:.6g}, sum of squares {m['sumsq']:.6g}{fields}"


def loaded_alternatives(engine_name: str, parts: list[str]) -> list[list[str]]:
    """What an engine parameter may hold of its checkpoint tensors: all of them (added up), except a fused or
    stacked layer's `weight_shape`. vLLM keeps one weight_shape per fused layer ([2]) and per stacked expert
    ([experts, 2]), and each member's load overwrites it: the member loaded last wins, in the checkpoint's file
    order (notes/2026-12-04-int4-weight-shape-last-member-wins.md). No kernel reads it; the audit accepts the
    shape of any one member, and of one member for every expert alike."""
    if not engine_name.endswith("weight_shape") or len(parts) < 2:
        return [parts]
    members = sorted({p.rsplit(".", 2)[-2] for p in parts})  # q_proj / k_proj / v_proj, gate_proj / up_proj
    return [[p for p in parts if p.rsplit(".", 2)[-2] == m] for m in members]


def _moment_mismatches(
    per_rank: dict[Any, dict[str, dict[str, Any]]],
    checkpoint: dict[str, dict[str, Any]],
    sources: Callable[[str], list[str]],
) -> tuple[int, set[str], list[str]]:
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
            problems.append(f"{name}: the checkpoint table has no moments for {parts}")
            continue
        wants = [add_moments([checkpoint[s]["moments"] for s in alt]) for alt in loaded_alternatives(name, parts)]
        recorded = {rank: params[name].get("moments") for rank, params in per_rank.items() if name in params}
        seen = {rank: m for rank, m in recorded.items() if m is not None}
        if len(seen) != len(recorded):
            problems.append(f"{name}: the audit recorded no moments (evidence from an older b70lab audit)")
            continue
        compared += 1
        want = wants[-1]
        if all(m["numel"] == want["numel"] for m in seen.values()):
            for rank, m in sorted(seen.items()):
                if not any(_same_values(m, w) for w in wants):
                    problems.append(f"{name} on rank {rank}: {_described(m)}; checkpoint {_described(want)}")
        else:
            problems += _sharded_mismatches(name, seen, loaded_alternatives(name, parts), checkpoint, wants)
    return compared, covered, problems


def _rank_shares(
    parts: list[str], checkpoint: dict[str, dict[str, Any]], ranks: int, rank: int
) -> list[tuple[dict[str, Any], str]]:
    """What one rank of `ranks` may hold of these checkpoint tensors: its equal part along either dimension
    (tensor parallel: the table's shard moments), or its block of whole routed experts (expert parallel,
    vLLM's linear placement). Each as (moments, how it was cut)."""
    shares = []
    for dim in ("0", "1"):
        pieces = [checkpoint[p].get("shards", {}).get(dim, {}).get(str(ranks)) for p in parts]
        if all(isinstance(piece, list) and len(piece) == ranks for piece in pieces):
            shares.append(
                (add_moments([piece[rank] for piece in pieces]), f"part {rank + 1} of {ranks} along dim {dim}")
            )
    experts = sorted({int(m.group(1)) for p in parts if (m := re.search(r"\.experts\.(\d+)\.", p))})
    if experts and len(experts) % ranks == 0:
        block = experts[rank * len(experts) // ranks : (rank + 1) * len(experts) // ranks]
        owned = [p for p in parts if any(f".experts.{e}." in p for e in block)]
        shares.append((add_moments([checkpoint[p]["moments"] for p in owned]), f"experts {block[0]}-{block[-1]}"))
    return shares


def _sharded_mismatches(
    name: str,
    seen: dict[Any, dict[str, Any]],
    alternatives: list[list[str]],
    checkpoint: dict[str, dict[str, Any]],
    wants: list[dict[str, Any]],
) -> list[str]:
    """A parameter split over the ranks: each rank against its own share of the checkpoint where the table
    lets the audit cut it (so the rank that differs is named), and the ranks together against the whole (an
    uneven split, such as a padded vocabulary, is judged by the whole alone)."""
    total = add_moments(list(seen.values()))
    whole_ok = total["numel"] >= wants[-1]["numel"] and any(_same_values(total, w) for w in wants)
    ranks = sorted(seen)
    shares = {
        r: [s for alt in alternatives for s in _rank_shares(alt, checkpoint, len(ranks), i)]
        for i, r in enumerate(ranks)
    }
    fits = {r: any(_same_values(seen[r], m) for m, _ in shares[r]) for r in ranks}
    if all(shares.values()) and any(fits.values()) and not all(fits.values()):
        return [
            f"{name} on rank {r}: {_described(seen[r])}; its share of the checkpoint "
            + " or ".join(f"({how}) {_described(m)}" for m, how in shares[r])
            for r in ranks
            if not fits[r]
        ]
    if whole_ok:
        return []
    return [
        f"{name} over ranks {ranks}: {_described(total)} over {total['numel']} values; checkpoint "
        f"{_described(wants[-1])} over {wants[-1]['numel']}"
    ]


def load_audit(
    start: Evidence,
    contract: Contract,
    target: dict[str, Any] | None,
    draft: dict[str, Any] | None,
    problems: dict[str, str] | None = None,
) -> Verdict:
    """Every tensor of the target (and draft) checkpoint reached the engine with its values: the float64
    sum and sum of squares of what the ranks loaded equal those of the checkpoint tensors each engine
    parameter is made of. Moments see through tensor-parallel sharding, fusion, kernel repacking and zero
    padding; a tensor left at its initial value (a router bias at zero) or loaded from the wrong place
    changes them. `target` / `draft` are checkpoint tables (pytest_b70lab.evidence.checkpoint); a checkpoint tensor
    that no parameter is made of fails, unless the contract exempts it by name with a reason."""
    c = _Check("load-audit", subject(start.start_index))
    if not _started(c, start):
        return c.done()
    exempt = {**CONSUMED_AT_LOAD, **contract.expect.load_audit_exempt}
    parts: list[tuple[str, dict[str, Any] | None, str, Callable[[str], str]]] = [
        ("target", target, "parameters", lambda n: n)
    ]
    if contract.speculative is not None:
        # The draft's engine names carry a "model." prefix its checkpoint does not; embedding and lm_head
        # are shared from the target and have no draft tensor.
        parts.append(("draft", draft, "draft_parameters", lambda n: n.removeprefix("model.")))
    for label, table, key, to_checkpoint in parts:
        tensors = (table or {}).get("tensors")
        why = (problems or {}).get(label) or "the checkpoint was not read"
        if not c.expect(bool(tensors), f"{label}: no checkpoint table to compare the engine with: {why}"):
            continue
        assert table is not None and tensors
        served = start.target if label == "target" else start.draft
        if served is not None and served.digest is not None:
            c.expect(
                served.digest == table.get("digest"),
                f"{label}: the engine served checkpoint {served.digest[:16]}..., the checkpoint table is of "
                f"{str(table.get('digest'))[:16]}...: the table is not of the served model",
            )
        per_rank = {a.get("tp_rank"): a.get(key) or {} for a in start.audits}
        if not c.expect(any(per_rank.values()), f"{label}: the audit recorded no {label} parameters"):
            continue
        compared, covered, mismatches = _moment_mismatches(per_rank, tensors, _sources_in(tensors, to_checkpoint))
        uncovered = sorted(k for k in tensors if k not in covered)
        exempted = {
            k: reason
            for k in uncovered
            if (reason := next((r for pattern, r in exempt.items() if fnmatch.fnmatchcase(k, pattern)), None))
        }
        missing = [k for k in uncovered if k not in exempted]
        c.observe(
            **{
                f"{label}_parameters_compared": compared,
                f"{label}_tensors_covered": len(covered),
                f"{label}_tensors": len(tensors),
                f"{label}_coverage": f"{len(covered)}/{len(tensors)}",
                f"{label}_exempted": len(exempted),
                f"{label}_mismatched": len(mismatches),
            }
        )
        c.expect(
            not mismatches,
            f"{label}: {len(mismatches)} mismatch(es) with the checkpoint: "
            + "; ".join(mismatches[:3])
            + (f"; and {len(mismatches) - 3} more" if len(mismatches) > 3 else ""),
        )
        c.expect(
            not missing,
            f"{label}: {len(missing)} of {len(tensors)} checkpoint tensors never reached an engine "
            f"parameter (and the contract does not exempt them): "
            + ", ".join(missing[:5])
            + (" ..." if len(missing) > 5 else ""),
        )
    return c.done()


def spec_counters(start: Evidence, contract: Contract) -> Verdict:
    """Speculative counters are consistent: draft tokens = k × drafts, per-position acceptance counts never
    increase with the position, and their sum is the accepted total."""
    c = _Check("spec-counters", subject(start.start_index))
    if not _started(c, start):
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


def token_count(start: Evidence, prompt_id: str, contract: Contract) -> Verdict:
    """The reported completion token count equals the token IDs received, and the contract's count."""
    c = _Check("token-count", subject(start.start_index, prompt=prompt_id))
    if (first := _request(c, start, prompt_id)) is None:
        return c.done()
    c.observe(reported=first.usage.get("completion_tokens"), received=len(first.token_ids))
    c.observe(chunk_tokens=sum(first.chunk_tokens))
    n = contract.decode.tokens_per_request
    for label, r in _every_pass(start, prompt_id):
        reported = r.usage.get("completion_tokens")
        c.expect(
            reported == len(r.token_ids), f"{label}: usage says {reported} tokens, {len(r.token_ids)} IDs received"
        )
        c.expect(
            sum(r.chunk_tokens) == len(r.token_ids),
            f"{label}: chunks carried {sum(r.chunk_tokens)} tokens, {len(r.token_ids)} IDs received",
        )
        c.expect(len(r.token_ids) == n, f"{label}: {len(r.token_ids)} tokens, the contract asks for {n}")
        c.expect(r.token_ids_sha256 == sha256_ids(r.token_ids), f"{label}: recorded token hash does not match the IDs")
    return c.done()


# --- 4. teacher exactness ----------------------------------------------------------------------------

TEACHER_IDENTITY_FIELDS = (
    "kind",
    "output_digest",
    "model_digest",
    "kv_cache_dtype",
    "engine_kv_cache_dtypes",
    "engine_speculative_config",
    "engine_version",
)


def first_difference(mine: Sequence[object], theirs: Sequence[object]) -> int | None:
    """The first position where two sequences (token IDs, texts) differ (the shorter one's end counts), or
    None."""
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
    return None if at == len(mine) == len(theirs) else at


def _around(text: str, other: str, width: int = 30) -> tuple[str, str]:
    """Both texts around their first differing character, for a message a person can read."""
    at = first_difference(text, other)
    at = len(text) if at is None else at
    lo = max(0, at - width)
    return text[lo : at + width], other[lo : at + width]


def teacher_exactness(
    start: Evidence, prompt_id: str, contract: Contract, snapshot: dict[str, Any] | None, snapshot_file: str
) -> Verdict:
    """Token IDs and text equal the FP8 teacher's, and the snapshot is this contract's teacher: target-only,
    FP8, same engine version and target checkpoint (the draft is not part of a teacher). A missing, stale,
    non-FP8, foreign or incomplete snapshot fails."""
    from . import teacher

    c = _Check("teacher-exactness", subject(start.start_index, prompt=prompt_id))
    record = teacher.RECORD_COMMAND.format(name=contract.name)
    if not _started(c, start):
        return c.done()
    if not c.expect(
        snapshot is not None, f"no teacher snapshot for {prompt_id} at {snapshot_file}; record one with `{record}`"
    ):
        return c.done()
    assert snapshot is not None
    have = snapshot["teacher"]
    absent = [f for f in TEACHER_IDENTITY_FIELDS if f not in have]
    if not c.expect(
        not absent,
        f"the teacher snapshot {snapshot_file} lacks {absent}: what recorded it cannot be "
        f"told; re-record with `{record}`",
    ):
        return c.done()
    _teacher_identity_matches(c, have, teacher.identity(contract, start), snapshot_file, record)
    c.expect(snapshot.get("prompt_id") == prompt_id, f"snapshot is of prompt {snapshot.get('prompt_id')!r}")
    if _request(c, start, prompt_id) is None:
        return c.done()
    for label, r in _every_pass(start, prompt_id):
        _tokens_match_teacher(c, r, snapshot, label, snapshot_file, record)
    return c.done()


def _teacher_identity_matches(
    c: _Check, have: dict[str, Any], want: dict[str, Any], snapshot_file: str, record: str
) -> None:
    """The snapshot is of a target-only FP8 teacher of this contract: output digest, target, engine."""
    c.observe(teacher_output_digest=have["output_digest"], snapshot=snapshot_file)
    c.expect(
        have["kind"] == "teacher"
        and isinstance(have["engine_speculative_config"], list)
        and not any(have["engine_speculative_config"]),
        f"the snapshot {snapshot_file} was not recorded by a target-only teacher ({have['engine_speculative_config']})",
    )
    fp8 = (
        have["kv_cache_dtype"] in FP8_KV_DTYPES
        and bool(have["engine_kv_cache_dtypes"])
        and all(d in FP8_KV_DTYPES for d in have["engine_kv_cache_dtypes"])
    )
    c.expect(
        fp8,
        f"the teacher of {snapshot_file} did not run an FP8 KV cache (contract "
        f"{have['kv_cache_dtype']!r}, engine {have['engine_kv_cache_dtypes']!r})",
    )
    c.expect(
        have["output_digest"] == want["output_digest"],
        f"stale teacher: {snapshot_file} is of a teacher with output digest {str(have['output_digest'])[:16]}..., "
        f"this contract's teacher is {want['output_digest'][:16]}... (target, engine arguments, prompts or "
        f"token count changed); re-record with `{record}`",
    )
    c.expect(
        have["model_digest"] == want["model_digest"],
        f"foreign teacher: {snapshot_file} was recorded on target checkpoint {have['model_digest']}, this run "
        f"serves target "
        f"{want['model_digest']}; re-record with `{record}`",
    )
    c.expect(
        have["engine_version"] == want["engine_version"],
        f"teacher {snapshot_file} recorded on engine {have['engine_version']}, this run is {want['engine_version']}",
    )


def _tokens_match_teacher(
    c: _Check, r: Request, snapshot: dict[str, Any], prompt_id: str, snapshot_file: str, record: str
) -> None:
    """Token for token, then the hashes and the text: the first differing token is named with its context."""
    c.observe(token_ids_sha256=r.token_ids_sha256, teacher_token_ids_sha256=snapshot["token_ids_sha256"])
    ids = snapshot.get("token_ids")
    if not c.expect(
        isinstance(ids, list) and sha256_ids(ids) == snapshot["token_ids_sha256"],
        f"the teacher snapshot {snapshot_file} does not keep its token IDs (or they do not match its "
        f"hash): re-record with `{record}`",
    ):
        return
    assert isinstance(ids, list)
    c.expect(
        len(r.token_ids) == snapshot["token_count"] == len(ids),
        f"{prompt_id}: {len(r.token_ids)} tokens, the teacher produced {snapshot['token_count']}",
    )
    at = first_difference(r.token_ids, ids)
    if at is not None:
        mine, theirs = (r.token_ids[at] if at < len(r.token_ids) else None), (ids[at] if at < len(ids) else None)
        here, there = _around(r.text, snapshot.get("text", ""))
        c.observe(first_differing_token=at)
        c.expect(
            False,
            f"{prompt_id}: token IDs differ from the teacher from token {at} on (this run {mine}, "
            f"teacher {theirs}); text here {here!r}, teacher {there!r}",
        )
    c.expect(
        r.token_ids_sha256 == snapshot["token_ids_sha256"] or at is not None,
        f"{prompt_id}: token-ID hash {r.token_ids_sha256[:16]}... differs from the teacher's",
    )
    c.expect(r.text_sha256 == snapshot["text_sha256"], f"{prompt_id}: decoded text differs from the teacher")
