"""The interleaved reproduction schedule: both fresh starts of a contract alive together, every gate prompt
served to each in a balanced order (A B, B A, ...), one request at a time, each once the other start is quiet,
`reproduction.passes` times over (or, under the equivalence rule, until the stopping rule of evidence/sampling.py
says the paired interval is decided), so that slow drift of a shared machine falls on both starts alike.

Each start stays a fresh start of its own (process group, socket, nonce, audits, /metrics before and after,
verified teardown, evidence); what this adds to its evidence is the schedule: every request's place in the
session's order, its times on the session's clock, and the CPU time the other start used while it ran
(evidence.Schedule has the quiet rule). A request measured while the other start was busy is measured again,
at most evidence.MAX_ATTEMPTS times; gate 7 judges what was kept."""

from __future__ import annotations

import time

from ..evidence import host, sampling
from ..evidence import record as evidence
from ..quality.samples import QualitySample
from .client import EngineRequestError
from .live import LiveStart
from .server import EngineServer, EngineStartError

QUIET_LIMIT_S = 20.0  # past this, the request is sent anyway: the measurement says whether it was clean


class CpuReading:
    """CPU-seconds so far of the start measured, the other starts together and the whole machine, and the
    harness's own: two readings give what the others and what everything outside every start used in between."""

    def __init__(self, me: EngineServer, others: list[EngineServer]):
        found = [o.cpu_seconds() for o in others]
        self.other = None if any(x is None for x in found) else sum(x or 0.0 for x in found)
        self.mine = me.cpu_seconds()
        self.own = host.own_cpu_seconds()
        self.machine = host.busy_cpu_seconds()

    def other_since(self, before: CpuReading) -> float | None:
        return _grew(before.other, self.other)

    def outside_since(self, before: CpuReading) -> float | None:
        """The machine's busy time less both starts' and the harness's (floored at 0: the counters tick apart)."""
        parts = [_grew(b, a) for b, a in ((before.machine, self.machine), (before.mine, self.mine))]
        parts += [self.other_since(before), _grew(before.own, self.own)]
        if any(x is None for x in parts):
            return None
        machine, mine, other, own = (x or 0.0 for x in parts)
        return max(0.0, machine - mine - other - own)


def wait_quiet(me: EngineServer, others: list[EngineServer]) -> float:
    """Seconds waited until, in one window, the other starts' processes used less than the quiet rule's CPU
    time (each) and everything outside every start less than the host rule's."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < QUIET_LIMIT_S:
        before = CpuReading(me, others)
        time.sleep(evidence.QUIET_WINDOW_S)
        after = CpuReading(me, others)
        busy, outside = after.other_since(before), after.outside_since(before)
        quiet = busy is not None and busy < evidence.QUIET_CPU_S * len(others)
        if quiet and (outside or 0.0) < evidence.QUIET_OUTSIDE_CPU_S:
            break
    return time.monotonic() - t0


def _grew(before: float | None, after: float | None) -> float | None:
    """How much a cumulative counter grew, or None where either reading failed (or it went backwards: a
    process of the group ended and took its counts with it)."""
    return after - before if before is not None and after is not None and after >= before else None


def order(pass_index: int, prompt_index: int, starts: int = 2) -> tuple[int, ...]:
    """In which order the starts serve this prompt in this pass: a rotation that moves on by one with every
    prompt and every pass (two starts: A B, B A, ... along the prompts, the other way round in the next pass), so
    that over any `starts` consecutive prompts each start takes each place once."""
    shift = (pass_index + prompt_index) % starts
    return tuple((shift + j) % starts for j in range(starts))


def label(live: LiveStart) -> str:
    return f"{live.contract.name} start-{live.index}"


class _Session:
    def __init__(self, lives: list[LiveStart], passes: int):
        self.lives, self.passes = lives, passes
        # Each contract's starts, in the session's order, with its stopping rule (None: a fixed count of passes). A
        # sweep's session holds several contracts: each stops by its own rule on its own first two starts, its
        # starts then idling while the others are served, so that gate 7 finds each where its rule stops.
        self.groups: dict[str, list[LiveStart]] = {}
        for live in lives:
            self.groups.setdefault(live.contract.name, []).append(live)
        self.rules = {name: sampling.SamplingRule.of(g[0].contract.reproduction) for name, g in self.groups.items()}
        self.clock0 = time.monotonic()
        self.sequence = 0
        self.current = lives[0]  # the start being opened, served or closed: the one a failure is of
        # A sweep's session (several contracts, or more than two starts): every other start is named by label.
        self.several = len(lives) > 2 or len({live.contract.name for live in lives}) > 1
        for live in lives:
            live.record.schedule = evidence.Schedule.new(passes)

    def measure(self, me: LiveStart, others: list[LiveStart], prompt, pass_index: int) -> None:
        """One (pass, prompt) on one start: measured again while another start or the machine was busy, at
        most MAX_ATTEMPTS times in all; where the evidence keeps each request follows evidence.Measurement."""
        schedule = me.record.schedule
        assert schedule is not None
        self.current = me
        servers = [o.server for o in others]
        for attempt in range(1, evidence.MAX_ATTEMPTS + 1):
            waited = wait_quiet(me.server, servers)
            what = f"pass {pass_index}" + (f" attempt {attempt}" if attempt > 1 else "")
            faults0, steal0 = me.server.major_faults(), host.steal_seconds()
            cpu0, t0 = CpuReading(me.server, servers), time.monotonic()
            request = me.serve(prompt, what)
            t1, cpu1 = time.monotonic(), CpuReading(me.server, servers)
            faults1, steal1 = me.server.major_faults(), host.steal_seconds()
            used, outside = cpu1.other_since(cpu0), cpu1.outside_since(cpu0)
            m = evidence.Measurement(
                pass_index=pass_index,
                prompt_id=prompt.id,
                attempt=attempt,
                sequence=self.sequence,
                started_at=round(t0 - self.clock0, 6),
                ended_at=round(t1 - self.clock0, 6),
                quiet_wait_s=round(waited, 3),
                other_start=None if self.several else others[0].index,
                others=[label(o) for o in others] if self.several else None,
                other_cpu_s=None if used is None else round(used, 4),
                outside_cpu_s=None if outside is None else round(outside, 4),
                steal_s=None if (stolen := _grew(steal0, steal1)) is None else round(stolen, 3),
                major_faults=None if (faults := _grew(faults0, faults1)) is None else int(faults),
                kept_in="repeats",
                index=0,
            )
            self.sequence += 1
            why = schedule.contamination(m)
            last = why is None or attempt == evidence.MAX_ATTEMPTS
            kept = me.record.requests if pass_index == 1 and last else me.record.repeats
            m.kept_in, m.index = ("requests" if kept is me.record.requests else "repeats"), len(kept)
            kept.append(request)
            schedule.measurements.append(m)
            if why is not None:
                me.say(
                    f"{label(me)}: {prompt.id} {what}: {why}"
                    + ("; measuring again" if not last else "; no attempts left")
                )
            if last:
                return

    def serve_passes(self, prompts: list) -> None:
        last = max((r.max_passes if r else self.passes) for r in self.rules.values())
        for pass_index in range(1, last + 1):
            serving = [live for live in self.lives if self._serves(live, pass_index)]
            if not serving:
                return
            for live in serving:
                assert live.record.schedule is not None
                live.record.schedule.passes = max(live.record.schedule.passes, pass_index)
            for k, prompt in enumerate(prompts):
                for j in order(pass_index, k, len(serving)):
                    me = serving[j]
                    self.measure(me, [o for o in self.lives if o is not me], prompt, pass_index)
            for name in {live.contract.name for live in serving}:
                self._stop(name, pass_index)

    def _serves(self, live: LiveStart, pass_index: int) -> bool:
        """Whether this pass serves the start: its contract's fixed count not yet reached, or its rule undecided."""
        if self.rules[live.contract.name] is None:
            return pass_index <= self.passes
        assert live.record.schedule is not None
        return live.record.schedule.sampling is None

    def _stop(self, name: str, pass_index: int) -> None:
        """The contract's stopping rule after this pass; where it stops, each of its starts' schedule records why.
        A contract with one start in the session (a sweep's single round) has no pair to decide: it stops at the
        rule's minimum."""
        rule, group = self.rules[name], self.groups[name]
        if rule is None:
            return
        if len(group) >= 2:
            why = rule.decide(sampling.paired_through(group[0].record, group[1].record, pass_index), pass_index)
        elif pass_index >= rule.min_passes:
            why = f"after pass {pass_index}: one start of {name} in the session, no pair to decide; its minimum served"
        else:
            why = None
        if why is None:
            return
        for live in group:
            assert live.record.schedule is not None
            live.record.schedule.sampling = evidence.Sampling(
                min_passes=rule.min_passes, max_passes=rule.max_passes, tolerance=rule.tolerance, stopped=why
            )
        group[0].say(f"{name}: {pass_index} passes: {why}")


def run_interleaved(
    lives: list[LiveStart],
    passes: int,
    quality: list[QualitySample] | None = None,
    prompt_ids: list[str] | None = None,
) -> list[evidence.Evidence]:
    """The launched starts of a session (a contract's two; a sweep's, of several contracts): each opened and ready
    while the ones before it idle, then the passes; quality samples (if any) on the first after its closing
    /metrics. Every start is torn down and its evidence written on every exit; a start that fails takes the
    others' measurement with it."""
    session = _Session(lives, passes)
    try:
        for session.current in lives:
            session.current.open()
        session.serve_passes(lives[0].prompts(prompt_ids))
        for i, session.current in enumerate(lives):
            session.current.close(quality if i == 0 else None)
    except (EngineStartError, EngineRequestError, OSError, ValueError) as e:
        _failed(lives, session.current, e)
    except BaseException as e:
        for live in lives:
            live.fail(e)
            live.finish()
        raise
    for live in lives:
        live.finish()
    return [live.record for live in lives]


def _failed(lives: list[LiveStart], culprit: LiveStart, e: BaseException) -> None:
    """The failing start keeps its own failure; the other is not measured to the end, and says why."""
    culprit.fail(e)
    for live in lives:
        if live is not culprit and live.record.status != "ok":
            live.record.failure = evidence.Failure(
                message=f"not measured to the end: {_name(culprit, lives)}, interleaved with it, failed "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                phase=live.server.phase,
                tails=live.server.tails(),
            )
            live.record.status = "failed"


def _name(live: LiveStart, lives: list[LiveStart]) -> str:
    """start-N within one contract's session; with the contract's name where the session has several."""
    return label(live) if len({o.contract.name for o in lives}) > 1 else f"start-{live.index}"
