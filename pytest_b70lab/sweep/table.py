"""One row per variant of a sweep, read back from its run folder: the verdict its replay recorded (never
more favourable than promotion.json, and incomplete when the sweep ran fewer starts than the contract's
fresh_starts), its decode rate and paired ratio to the base (compare.compare_runs: one implementation with
`b70lab evidence diff`), speculative acceptance, the KV capacity the engine reported, and when each start
was launched and became ready. Everything is recomputed from the evidence; the page and the terminal only
show it."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..contract.variants import Variant
from ..evidence import host, metrics, run_folder, throughput
from ..evidence.record import Evidence, EvidenceError
from ..evidence.run_folder import Run
from ..judge import compare
from ..judge import verdict as verdict_mod
from .plan import variant_dir


@dataclass
class StartFacts:
    index: int
    status: str
    launched_at: str | None
    ready_s: float | None
    decode_median: float | None
    graphs: str  # "compiled" (this start traced its graphs), "loaded" (from the AOT cache) or "n/a"
    box: str | None = None  # the box it ran on ("box LABEL [digest]"); None: recorded before starts named theirs


@dataclass
class Row:
    variant: str
    kind: str
    changes: dict[str, Any]
    contract_digest: str
    judged_against: str
    folder: str
    verdict: str  # pass / fail / incomplete / none
    verdict_line: str
    promotable: bool
    starts_required: int
    starts: list[StartFacts] = field(default_factory=list)
    decode_median: float | None = None
    paired_to_base: dict[str, Any] | None = None  # ratio, low, high, prompts, confidence
    measured: str = "sequential"  # or "interleaved, N passes": how its starts were served
    medians_to_base: float | None = None
    outputs_identical_to_base: str | None = None  # "6/6"
    accepted_per_draft: float | None = None
    acceptance_per_position: dict[int, float] = field(default_factory=dict)
    kv_blocks: int | None = None
    kv_tokens: int | None = None
    kv_memory_bytes: int | None = None
    kv_cache_dtype: str | None = None
    notes: list[str] = field(default_factory=list)
    # A fleet sweep's row: the shard it was measured in (its paired figure is against that shard's base), the
    # box and host class its starts ran on. None on one machine.
    shard: str | None = None
    host_class: str | None = None
    is_base: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rows(
    out: Path,
    base: Variant,
    variants: list[Variant],
    judged: dict[str, str] | None = None,
    alone: dict[str, str] | None = None,
) -> list[Row]:
    """The table, base first. `judged`: why a variant's replay wrote no verdict; `alone`: why an interleaved
    variant was measured one start at a time (both the runner's outcome)."""
    runs = {v.name: _read(variant_dir(out, v.name)) for v in variants}
    base_run = runs.get(base.name)
    out_rows = [_row(v, base, runs[v.name], base_run, (judged or {}).get(v.name, ""), out) for v in variants]
    for row in out_rows:
        row.is_base = row.variant == base.name
    for row in out_rows:
        if row.measured == "sequential" and (why := (alone or {}).get(row.variant)):
            row.measured = f"sequential: {why}"
    return out_rows


def _read(folder: Path) -> Run | str:
    try:
        return run_folder.read(folder)
    except EvidenceError as e:
        return str(e)


def _row(v: Variant, base: Variant, run: Run | str, base_run: Run | str | None, unjudged: str, out: Path) -> Row:
    c = v.contract
    row = Row(
        variant=v.name,
        kind=c.kind,
        changes=v.changes,
        contract_digest=c.digest,
        judged_against=v.judged_against(base.contract),
        folder=str(variant_dir(out, v.name).relative_to(out)),
        verdict="none",
        verdict_line="",
        promotable=False,
        starts_required=c.reproduction.fresh_starts,
    )
    if isinstance(run, str):
        row.verdict, row.verdict_line = "fail", f"NOT PROMOTABLE: {run}"
        return row
    row.starts = [_start_facts(s) for s in run.starts]
    row.verdict, row.verdict_line = _verdict(run, row, unjudged)
    row.promotable = row.verdict == "pass"
    ok = [s for s in run.starts if s.status == "ok"]
    if ok and all(s.schedule is not None for s in ok):
        row.measured = f"interleaved, {ok[0].schedule.passes if ok[0].schedule else '?'} passes"
    medians = [m for s in ok if (m := start_median(s)) is not None]
    row.decode_median = statistics.median(medians) if medians else None
    if isinstance(base_run, Run) and base_run is not run and ok and any(s.status == "ok" for s in base_run.starts):
        _against_base(row, base_run, run)
    _acceptance(row, ok)
    _capacity(row, ok)
    return row


def _start_facts(s: Evidence) -> StartFacts:
    sources = {m.get("source") for a in s.audits for m in (a.get("compiled_modules") or []) if isinstance(m, dict)}
    graphs = "compiled" if "compiled" in sources else "loaded" if sources == {"loaded"} else "n/a"
    return StartFacts(
        s.start_index,
        s.status,
        s.identity.launched_at if s.identity else s.created_at,
        s.ready_s,
        start_median(s) if s.status == "ok" else None,
        graphs,
        host.describe_box(box) if (box := host.box_of(s.host)) else None,
    )


def _verdict(run: Run, row: Row, unjudged: str) -> tuple[str, str]:
    """The replay's recorded verdict; a sweep of fewer rounds than the contract's fresh starts is incomplete
    whatever its gates said of the starts that ran (their failures are still named)."""
    if unjudged:
        return "none", f"NOT JUDGED: {unjudged}"
    kind, line = verdict_mod.recorded_headline(run.promotion, run.starts, run.folder)
    ran = len(run.starts)
    if ran >= row.starts_required or kind == "fail" and any(s.status != "ok" for s in run.starts):
        return kind, line
    p = run.promotion or {}
    required = {tuple(pair) for pair in p.get("required") or []}
    # The gate tests of the starts that ran and that a promotion requires (a draft gate skipped for a contract
    # without a draft is not one of them).
    judged = [
        g
        for g in p.get("gates") or []
        if isinstance(g, dict)
        and _start_of(g.get("subject")) in range(1, ran + 1)
        and (g.get("gate"), g.get("subject")) in required
    ]
    failed = sorted({g["gate"] for g in judged if g.get("outcome") != "passed"})
    on_them = (
        f"; on {'it' if ran == 1 else 'them'}: {sum(g.get('outcome') == 'passed' for g in judged)} of "
        f"{len(judged)} required gate tests passed" + (f", failed: {', '.join(failed)}" if failed else "")
    )
    return ("fail" if failed else "incomplete"), (
        f"NOT PROMOTABLE (incomplete) - contract {run.starts[0].contract.name}: {_count(ran, 'fresh start')} of "
        f"{row.starts_required} (--rounds {ran}){on_them}"
    )


def _start_of(subject: Any) -> int | None:
    if isinstance(subject, str) and subject.startswith("start-"):
        head = subject.split(" ", 1)[0].removeprefix("start-")
        return int(head) if head.isdigit() else None
    return None


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def start_median(s: Evidence) -> float | None:
    """A start's endpoint figure as its verdict says it: under interleaving, over every pass."""
    return throughput.pass_endpoint(pass_rates(s)) if s.schedule is not None else throughput.arrival_median(s.requests)


def pass_rates(s: Evidence) -> dict[tuple[int, str], float]:
    """Each counted (pass, prompt) request's rate, from its arrival times."""
    return throughput.counted_rates(s)[0]


def interleaved_to_base(base_run: Run, run: Run) -> throughput.PairedRatio | None:
    """The variant against the base where the two were served side by side: for each round's start of both and
    each pass, the pair measured within that pass (both starts alive, one request after the other), then
    throughput.interleaved_ratio over every round and pass (each prompt's median log ratio, geometric mean over
    prompts, a bootstrap over prompts). None where they were not measured so (a sequential start on either side)."""
    base = {s.start_index: s for s in base_run.starts if s.status == "ok"}
    mine = {s.start_index: s for s in run.starts if s.status == "ok"}
    common = sorted(set(base) & set(mine))
    if not common or any(base[i].schedule is None or mine[i].schedule is None for i in common):
        return None
    pairs: dict[str, list[tuple[float, float]]] = {}
    for i in common:
        a, b = pass_rates(base[i]), pass_rates(mine[i])
        for key in [k for k in a if k in b]:  # the order gate 7 takes: the bootstrap draws prompts by position
            pairs.setdefault(key[1], []).append((a[key], b[key]))
    return throughput.interleaved_ratio(pairs)


def two_boxes(base_run: Run, run: Run) -> str | None:
    """Where the base's and the variant's starts name different boxes, which (a fleet pairs a variant only with its
    own shard's base, on one box); None where they share one, or a side names none (recorded before boxes were)."""
    sides = []
    for which in (base_run, run):
        found = {host.describe_box(b) for s in which.starts if (b := host.box_of(s.host)) is not None}
        if not found:
            return None
        sides.append(found)
    if sides[0] == sides[1]:
        return None
    return f"the base ran on {', '.join(sorted(sides[0]))}, this variant on {', '.join(sorted(sides[1]))}"


def _against_base(row: Row, base_run: Run, run: Run) -> None:
    comparison = compare.compare_runs(_completed(base_run), _completed(run))
    row.outputs_identical_to_base = f"{comparison.identical_outputs}/{len(comparison.prompts)}"
    if comparison.speed_not_compared and comparison.host_classes:  # measured on another host class than the base
        base_on, variant_on = comparison.host_classes
        row.notes.append(f"speed to the base {base_on.not_compared(variant_on, 'base', 'this variant')}")
        return
    if (boxes := two_boxes(base_run, run)) is not None:  # a pair across boxes compares machines, not variants
        row.notes.append(f"speed to the base not compared: {boxes}")
        return
    speed = comparison.speed
    if (p := interleaved_to_base(base_run, run) or speed.paired) is not None:
        row.paired_to_base = {
            "ratio": p.ratio,
            "low": p.low,
            "high": p.high,
            "prompts": p.prompts,
            "confidence": p.confidence,
        }
    # Interleaved, of the figures over every pass (the row's decode_median); else of pass 1's (compare's).
    base_medians = [m for s in _completed(base_run).starts if (m := start_median(s)) is not None]
    if row.measured != "sequential" and row.decode_median is not None and base_medians:
        row.medians_to_base = row.decode_median / statistics.median(base_medians)
    else:
        row.medians_to_base = speed.ratio


def _completed(run: Run) -> Run:
    """The starts that completed: a failed start's partial requests say nothing of the variant's speed."""
    return Run(run.folder, tuple(s for s in run.starts if s.status == "ok"), run.promotion)


def _acceptance(row: Row, ok: list[Evidence]) -> None:
    """Pooled over the variant's starts: accepted draft tokens per draft, and the rate at each position."""
    drafts = 0.0
    accepted: dict[int, float] = {}
    for s in ok:
        a = metrics.acceptance(s.metrics_before, s.metrics_after)
        if isinstance(a, str):
            if s.draft is not None:
                row.notes.append(f"start-{s.start_index}: acceptance cannot be told: {a}")
            continue
        drafts += a.drafts
        for pos, n in a.accepted.items():
            accepted[pos] = accepted.get(pos, 0.0) + n
    if drafts > 0:
        row.accepted_per_draft = sum(accepted.values()) / drafts
        row.acceptance_per_position = {pos: n / drafts for pos, n in sorted(accepted.items())}


def _capacity(row: Row, ok: list[Evidence]) -> None:
    """The engine's own figures (vLLM's cache_config_info), start-1's; a start that reports other figures is
    named, since the same contract should allocate the same cache."""
    found = [(s.start_index, metrics.kv_capacity(s.metrics_before)) for s in ok]
    good = [(i, k) for i, k in found if isinstance(k, metrics.KvCapacity)]
    row.notes += [f"start-{i}: KV capacity cannot be told: {k}" for i, k in found if isinstance(k, str)]
    if not good:
        return
    first = good[0][1]
    row.kv_blocks, row.kv_tokens, row.kv_memory_bytes, row.kv_cache_dtype = (
        first.blocks,
        first.tokens,
        first.memory_bytes,
        first.cache_dtype,
    )
    row.notes += [
        f"start-{i}: the engine allocated {k.blocks} KV blocks, start-{good[0][0]} {first.blocks}"
        for i, k in good[1:]
        if k.blocks != first.blocks
    ]


# --- what the table is written as -----------------------------------------------------------------------


def format_table(table: list[Row]) -> str:
    """The terminal's table: one line per variant, then each verdict line in full."""
    sharded = any(r.shard for r in table)
    head = [
        *(["shard", "box"] if sharded else []),
        "variant",
        "verdict",
        "starts",
        "tok/s",
        "paired vs base [95 %]",
        "acc/draft",
        "KV blocks (tokens)",
        "ready s",
    ]
    lines = [head]
    for r in table:
        p = r.paired_to_base
        ready = [f"{s.ready_s:.0f}" for s in r.starts if s.ready_s is not None]
        boxes = sorted({s.box for s in r.starts if s.box}) or ["n/a"]
        lines.append(
            [
                *([r.shard or "", ", ".join(boxes)] if sharded else []),
                r.variant,
                r.verdict.upper(),
                f"{sum(s.status == 'ok' for s in r.starts)}/{r.starts_required}",
                _num(r.decode_median),
                "base"
                if r.is_base or r is table[0]
                else (f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}]" if p else "n/a"),
                _num(r.accepted_per_draft),
                f"{r.kv_blocks} ({r.kv_tokens})" if r.kv_blocks is not None else "n/a",
                ", ".join(ready) or "n/a",
            ]
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip() for line in lines]
    verdicts = [f"{r.shard + ' ' if r.shard else ''}{r.variant}: {r.verdict_line}" for r in table]
    return "\n".join(text + [""] + verdicts)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def junit_xml(table: list[Row], suite: str) -> str:
    """One JUnit test per variant: passed when promotable, failed when a gate failed or a start did, skipped
    (with the reason) when incomplete or not judged. Its properties carry the figures."""
    from xml.etree import ElementTree as ET

    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(table)),
        failures=str(sum(r.verdict == "fail" for r in table)),
        skipped=str(sum(r.verdict in ("incomplete", "none") for r in table)),
        errors="0",
    )
    for r in table:
        name = f"{r.shard}/{r.variant}" if r.shard else r.variant
        case = ET.SubElement(ts, "testcase", classname=f"b70lab.sweep.{suite}", name=name, time="0")
        props = ET.SubElement(case, "properties")
        figures = {
            "verdict": r.verdict,
            "contract_digest": r.contract_digest,
            "decode_median_tok_s": r.decode_median,
            "paired_to_base": (r.paired_to_base or {}).get("ratio"),
            "accepted_per_draft": r.accepted_per_draft,
            "kv_blocks": r.kv_blocks,
            "kv_tokens": r.kv_tokens,
            "judged_against": r.judged_against,
        }
        for k, v in figures.items():
            ET.SubElement(props, "property", name=k, value="" if v is None else str(v))
        if r.verdict == "fail":
            ET.SubElement(case, "failure", message=r.verdict_line).text = r.verdict_line
        elif r.verdict != "pass":
            ET.SubElement(case, "skipped", message=r.verdict_line)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
