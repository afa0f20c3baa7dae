"""The evidence checks: that each start left all the evidence a gate reads, and that nothing outlived it or
could reach it. A promotion requires them per start like any gate."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from ..contract.schema import Contract
from ..evidence.record import Evidence
from .engine_resolution import rank_log_name
from .rules import (
    Check,
    Verdict,
    rank_order,
    started,
    subject,
)


def evidence_start(start: Evidence) -> Verdict:
    """The start completed and became ready after a positive, finite time."""
    c = Check("evidence-start", subject(start.start_index))
    if started(c, start):
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
    c = Check("evidence-ranks", subject(start.start_index))
    tp = contract.engine.tensor_parallel
    ranks = sorted((a.get("tp_rank") for a in start.audits), key=rank_order)
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
    c = Check("evidence-metrics", subject(start.start_index))
    if started(c, start):
        for when, text in (("before", start.metrics_before), ("after", start.metrics_after)):
            c.expect(
                bool(text) and "vllm:cache_config_info" in str(text),
                f"start-{start.start_index}: no /metrics scrape {when} the prompts (or one without "
                f"vllm:cache_config_info)",
            )
    return c.done()


def evidence_prompts(start: Evidence, prompt_ids: Sequence[str], contract: Contract) -> Verdict:
    """One request per prompt of the set, no other, each with the contract's token count."""
    c = Check("evidence-prompts", subject(start.start_index))
    if not started(c, start):
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
    c = Check("evidence-teardown", subject(start.start_index))
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
    c = Check("evidence-exposure", subject(start.start_index))
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
    c = Check("evidence-logs", subject(start.start_index))
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
    c = Check("evidence-probe", subject(start.start_index))
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
