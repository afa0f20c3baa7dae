"""Gate 7, fresh-start reproduction: a second fresh start gives identical outputs, and its speed is within the
contract's tolerance by the endpoint medians and by the paired per-prompt figure: the figures themselves (the
point rule) or their whole intervals (the equivalence rule)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..contract.schema import Contract
from ..evidence import host, throughput
from ..evidence.record import Evidence
from ..evidence.sampling import SamplingRule, stopping_point
from .exactness import first_difference
from .rules import (
    Check,
    Verdict,
    started,
    subject,
)


def reproduction(starts: list[Evidence], contract: Contract) -> Verdict:
    """Every later start reproduces the first one's output exactly, its endpoint median decode rate within
    the contract's throughput tolerance, and its paired figure (the geometric mean of per-prompt
    start-N / start-1 decode-rate ratios, recomputed from the token arrival times) within the paired
    tolerance: a consistent per-prompt shift fails whatever the medians do. Under the interleaved schedule
    every pass of every prompt is output, and the figures come from the pairs measured side by side
    (throughput.interleaved_ratio); a pair measured while the other start was busy fails."""
    c = Check("fresh-start-reproduction", subject())
    need = contract.reproduction.fresh_starts
    c.expect(len(starts) == need, f"{len(starts)} fresh starts recorded, the contract asks for {need}")
    if not all(started(c, s) for s in starts) or len(starts) < 2:
        c.expect(len(starts) >= 2 or need < 2, "reproduction needs at least two starts")
        return c.done()
    first = starts[0]
    _fresh_starts(c, starts)
    _one_box(c, starts)
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
    for decision in speed_decisions(starts, figures, contract):
        _judge_speed(c, decision, figures.medians[0])
    return c.done()


@dataclass(frozen=True)
class SpeedFigures:
    """What gate 7 judges of speed: each start's endpoint median (and the per-prompt rates it is the median of),
    each later start's paired figure against start-1, and every reason a figure could not be trusted (a request
    without a rate, a pair measured while the other start was busy). The bench reads the same figures here."""

    medians: list[float | None]
    paired: list[throughput.PairedRatio | None]
    problems: list[str]
    prompt_rates: list[dict[str, float]]


def _interval_of(contract: Contract) -> dict[str, Any]:
    """How the paired figure's interval is computed under the contract's speed rule."""
    if contract.reproduction.speed_rule == "equivalence":
        return {"confidence": throughput.EQUIVALENCE_CONFIDENCE, "method": "t"}
    return {}


def speed_figures(starts: list[Evidence], contract: Contract) -> SpeedFigures:
    """Every figure from the token arrival times, never from what the evidence says they came to: sequentially,
    each start's one request per prompt; interleaved, the pairs of each pass (_interleaved_figures)."""
    if contract.reproduction.schedule == "interleaved":
        return _interleaved_figures(starts, _interval_of(contract))
    problems: list[str] = []
    rates = []
    for s in starts:
        found, why = throughput.arrival_rates(s.requests)
        problems += [f"start-{s.start_index} {prompt_id}: {reason}" for prompt_id, reason in why.items()]
        rates.append(found)
    medians = [throughput.endpoint_median(list(r.values())) if r else None for r in rates]
    paired = [throughput.paired_ratio(rates[0], r, **_interval_of(contract)) for r in rates[1:]]
    return SpeedFigures(medians, paired, problems, rates)


def _same_output(c: Check, first: Evidence, later: Evidence) -> None:
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


def _schedule_matches(c: Check, starts: list[Evidence], contract: Contract) -> bool:
    """Each start was measured under the contract's schedule, by this b70lab's quiet rule."""
    want = contract.reproduction
    rule = SamplingRule.of(want)
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
        ok &= _passes_match(c, where, got, rule, want.passes)
        for problem in got.rule_differences():
            ok &= c.expect(False, f"start-{s.start_index}: {problem}")
    if ok and want.schedule == "interleaved":
        for problem in timeline_problems(starts):
            ok &= c.expect(False, problem)
    if ok and rule is not None and len(starts) == 2:
        passes, why = stopping_point(starts[0], starts[1], rule)
        served = starts[0].schedule.passes if starts[0].schedule else None
        ok &= c.expect(
            served == passes,
            f"the session served {served} passes; the contract's stopping rule, applied to the recorded passes, "
            f"stops after {passes} ({why})",
        )
        c.observe(passes_served=served, sampling_stopped=why)
    return ok


def _passes_match(c: Check, where: str, got: Any, rule: SamplingRule | None, passes: int) -> bool:
    """A fixed count is the contract's; a sampled one lies within its bounds, under its tolerance."""
    if rule is None:
        return c.expect(
            got.sampling is None,
            f"{where}.sampling is recorded ({got.sampling.stopped if got.sampling else ''}); the contract asks "
            f"for a fixed {passes} passes",
        ) & c.expect(got.passes == passes, f"{where}.passes is {got.passes}; the contract asks for {passes}")
    if not c.expect(
        got.sampling is not None,
        f"{where}.sampling is absent; the contract adds passes ({rule.min_passes} to {rule.max_passes}) until the "
        f"paired interval is decided, so the evidence must say how the session sized itself",
    ):
        return False
    recorded = (got.sampling.min_passes, got.sampling.max_passes, got.sampling.tolerance)
    return c.expect(
        recorded == (rule.min_passes, rule.max_passes, rule.tolerance),
        f"{where}.sampling was {recorded[0]} to {recorded[1]} passes at tolerance {recorded[2]:g}; the contract "
        f"asks for {rule.min_passes} to {rule.max_passes} at {rule.tolerance:g}",
    ) & c.expect(
        rule.min_passes <= got.passes <= rule.max_passes,
        f"{where}.passes is {got.passes}, outside the contract's {rule.min_passes} to {rule.max_passes}",
    )


def timeline_problems(starts: list[Evidence]) -> list[str]:
    """The interleaved claim against its own timeline. Every measurement of the session's starts carries its
    place in the one sequence of requests and its times on one clock (the harness's CLOCK_MONOTONIC, in seconds
    since the session's first launch): in sequence order no request may begin before the one before it ended
    (two starts served at once are not side by side but together), and in a gates session (two starts, each
    naming the other) every (pass, prompt) is measured on both starts in one run of the sequence, so that the
    starts alternate rather than one running its passes after the other's."""
    timed = sorted(
        ((m.sequence, s.start_index, m) for s in starts if s.schedule for m in s.schedule.measurements),
        key=lambda t: (t[0], t[1]),
    )

    def name(start: int, m: Any) -> str:
        return f"start-{start} {m.prompt_id} pass {m.pass_index} attempt {m.attempt} (sequence {m.sequence})"

    problems = []
    for (seq_a, start_a, a), (seq_b, start_b, b) in itertools.pairwise(timed):
        if seq_a == seq_b:
            problems.append(f"{name(start_a, a)} and {name(start_b, b)} share one place in the sequence")
        elif b.started_at < a.ended_at:
            problems.append(
                f"{name(start_b, b)} began at {b.started_at:.3f} s, before {name(start_a, a)} ended at "
                f"{a.ended_at:.3f} s: not measured one at a time"
            )
    if all(m.other_start is not None for _seq, _s, m in timed):
        places: dict[tuple[int, str], list[int]] = {}
        for seq, _start, m in timed:
            places.setdefault((m.pass_index, m.prompt_id), []).append(seq)
        order = [seq for seq, _s, _m in timed]
        for (pass_index, prompt_id), seqs in sorted(places.items()):
            run = order[order.index(seqs[0]) : order.index(seqs[-1]) + 1]
            if len(run) != len(seqs):
                problems.append(
                    f"{prompt_id} pass {pass_index}: measured at sequence {seqs[0]} and {seqs[-1]} with "
                    f"{len(run) - len(seqs)} other requests between: the starts did not alternate"
                )
    return problems[:5]


def _interleaved_figures(starts: list[Evidence], interval: dict[str, Any]) -> SpeedFigures:
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
        paired.append(throughput.interleaved_ratio(throughput.pass_pairs(rates[0], found), **interval))
    return SpeedFigures(medians, paired, problems, [throughput.prompt_medians(r) for r in rates])


@dataclass(frozen=True)
class SpeedDecision:
    """Gate 7's decision on one later start's speed: each figure, how far from start-1's, and whether that is
    within the contract's tolerance (None where the figure is missing). The report prints these; it never
    decides again."""

    start: int
    endpoint: float | None  # this start's endpoint median, tok/s
    endpoint_drift: float | None  # |median - start-1's| / start-1's
    endpoint_tolerance: float
    paired: throughput.PairedRatio | None
    paired_tolerance: float
    rule: str = "point"  # the contract's reproduction.speed_rule
    # Under the equivalence rule: this start's endpoint median over start-1's, with its interval.
    endpoint_ratio: throughput.PairedRatio | None = None

    @property
    def endpoint_within(self) -> bool | None:
        if self.rule == "equivalence":
            return None if self.endpoint_ratio is None else self.endpoint_ratio.inside(self.endpoint_tolerance)
        return None if self.endpoint_drift is None else self.endpoint_drift <= self.endpoint_tolerance

    @property
    def paired_within(self) -> bool | None:
        if self.paired is None:
            return None
        if self.rule == "equivalence":
            return self.paired.inside(self.paired_tolerance)
        return self.paired.drift <= self.paired_tolerance


def speed_decisions(starts: list[Evidence], figures: SpeedFigures, contract: Contract) -> list[SpeedDecision]:
    """One decision per later start, against start-1, under the contract's tolerances."""
    m0 = figures.medians[0]
    rule = contract.reproduction.speed_rule
    found = []
    for later, m1, paired, rates in zip(
        starts[1:], figures.medians[1:], figures.paired, figures.prompt_rates[1:], strict=True
    ):
        drift = abs(m1 - m0) / m0 if m0 is not None and m1 is not None and m0 > 0 else None
        endpoint_ratio = None
        if rule == "equivalence":
            endpoint_ratio = throughput.endpoint_ratio(
                figures.prompt_rates[0], rates, confidence=throughput.EQUIVALENCE_CONFIDENCE
            )
        found.append(
            SpeedDecision(
                later.start_index,
                m1,
                drift,
                contract.reproduction.throughput_tolerance,
                paired,
                contract.reproduction.paired,
                rule,
                endpoint_ratio,
            )
        )
    return found


def _judge_speed(c: Check, d: SpeedDecision, m0: float | None) -> None:
    n = d.start
    if c.expect(
        d.endpoint_drift is not None,
        f"start-1 or start-{n}: no request has a decode rate from its arrival times, so no endpoint median",
    ):
        assert d.endpoint_drift is not None and d.endpoint is not None and m0 is not None
        c.observe(**{f"throughput_drift_start{n}": round(d.endpoint_drift, 4)})
        if d.rule == "equivalence" and d.endpoint_ratio is not None:
            e = d.endpoint_ratio
            c.observe(**{f"endpoint_interval_start{n}": [round(e.low, 4), round(e.high, 4)]})
            c.expect(
                bool(d.endpoint_within),
                f"endpoint median {d.endpoint:.2f} tok/s at start-{n} vs {m0:.2f} at start-1: ratio {e.line()} is "
                f"not wholly inside 1 +/- {d.endpoint_tolerance:g} (equivalence rule)",
            )
        else:
            c.expect(
                bool(d.endpoint_within),
                f"endpoint median {d.endpoint:.2f} tok/s at start-{n} vs {m0:.2f} at start-1: "
                f"{d.endpoint_drift:.1%} apart, tolerance {d.endpoint_tolerance:.0%}",
            )
    if c.expect(d.paired is not None, f"no prompt has a decode rate at both start-1 and start-{n}: no paired figure"):
        assert d.paired is not None
        c.observe(
            **{
                f"paired_ratio_start{n}": round(d.paired.ratio, 4),
                f"paired_interval_start{n}": [round(d.paired.low, 4), round(d.paired.high, 4)],
            }
        )
        if d.rule == "equivalence":
            low, high = 1 - d.paired_tolerance, 1 + d.paired_tolerance
            c.expect(
                bool(d.paired_within),
                f"paired figure start-{n} / start-1 {d.paired.line()}: the interval is not wholly inside "
                f"[{low:.3f}, {high:.3f}] (1 +/- {d.paired_tolerance:g}, equivalence rule): "
                + (
                    "the speeds differ"
                    if d.paired.outside(d.paired_tolerance)
                    else "too wide or off-centre to show that the speeds agree"
                ),
            )
        else:
            c.expect(
                bool(d.paired_within),
                f"paired figure start-{n} / start-1 {d.paired.line()}: the geometric mean of the per-prompt "
                f"decode-rate ratios is {d.paired.drift:.1%} from 1, tolerance {d.paired_tolerance:.0%}",
            )


def _one_box(c: Check, starts: list[Evidence]) -> None:
    """Every start on start-1's box: speeds measured on two machines are not one engine's reproduction, whatever
    their classes. Evidence from before starts recorded their box names none, and is not judged on it."""
    boxes = {s.start_index: host.box_of(s.host) for s in starts}
    first = boxes[starts[0].start_index]
    for n, box in boxes.items():
        if first is not None and box is not None and box["digest"] != first["digest"]:
            c.expect(
                False,
                f"start-{n} ran on {host.describe_box(box)}, start-1 on {host.describe_box(first)}: two boxes, "
                "so its speed and output are not a second start of the same engine",
            )


def _fresh_starts(c: Check, starts: list[Evidence]) -> None:
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
