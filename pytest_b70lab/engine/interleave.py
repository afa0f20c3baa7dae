"""The interleaved reproduction schedule: both fresh starts of a contract alive together, every gate prompt
served to each in a balanced order (A B, B A, ...), one request at a time, each once the other start is quiet,
`reproduction.passes` times over, so that slow drift of a shared machine falls on both starts alike.

Each start stays a fresh start of its own (process group, socket, nonce, audits, /metrics before and after,
verified teardown, evidence); what this adds to its evidence is the schedule: every request's place in the
session's order, its times on the session's clock, and the CPU time the other start used while it ran
(evidence.Schedule has the quiet rule). A request measured while the other start was busy is measured again,
at most evidence.MAX_ATTEMPTS times; gate 7 judges what was kept."""

from __future__ import annotations

import time

from .. import evidence, host
from ..quality.samples import QualitySample
from .client import EngineRequestError
from .live import LiveStart
from .server import EngineServer, EngineStartError

QUIET_LIMIT_S = 20.0  # past this, the request is sent anyway: the measurement says whether it was clean


def wait_quiet(server: EngineServer) -> float:
    """Seconds waited until `server`'s processes used less than the quiet rule's CPU time in one window."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < QUIET_LIMIT_S:
        before = server.cpu_seconds()
        time.sleep(evidence.QUIET_WINDOW_S)
        after = server.cpu_seconds()
        if before is not None and after is not None and after - before < evidence.QUIET_CPU_S:
            break
    return time.monotonic() - t0


def _grew(before: float | None, after: float | None) -> float | None:
    """How much a cumulative counter grew, or None where either reading failed (or it went backwards: a
    process of the group ended and took its counts with it)."""
    return after - before if before is not None and after is not None and after >= before else None


def order(pass_index: int, prompt_index: int) -> tuple[int, int]:
    """Which start goes first for this prompt in this pass: A B, B A, ... along the prompts, and the other way
    round in the next pass, so that each start goes first equally often in every pair of passes."""
    return (0, 1) if (pass_index + prompt_index) % 2 == 0 else (1, 0)


class _Session:
    def __init__(self, lives: list[LiveStart], passes: int):
        self.lives, self.passes = lives, passes
        self.clock0 = time.monotonic()
        self.sequence = 0
        self.current = lives[0]  # the start being opened, served or closed: the one a failure is of
        for live in lives:
            live.record.schedule = evidence.Schedule.new(passes)

    def measure(self, me: LiveStart, other: LiveStart, prompt, pass_index: int) -> None:
        """One (pass, prompt) on one start: measured again while the other start was busy, at most
        MAX_ATTEMPTS times in all; where the evidence keeps each request follows evidence.Measurement."""
        assert me.record.schedule is not None
        self.current = me
        for attempt in range(1, evidence.MAX_ATTEMPTS + 1):
            waited = wait_quiet(other.server)
            label = f"pass {pass_index}" + (f" attempt {attempt}" if attempt > 1 else "")
            faults0, steal0 = me.server.major_faults(), host.steal_seconds()
            cpu0, t0 = other.server.cpu_seconds(), time.monotonic()
            request = me.serve(prompt, label)
            t1, cpu1 = time.monotonic(), other.server.cpu_seconds()
            faults1, steal1 = me.server.major_faults(), host.steal_seconds()
            used = _grew(cpu0, cpu1)
            m = evidence.Measurement(
                pass_index=pass_index,
                prompt_id=prompt.id,
                attempt=attempt,
                sequence=self.sequence,
                started_at=round(t0 - self.clock0, 6),
                ended_at=round(t1 - self.clock0, 6),
                quiet_wait_s=round(waited, 3),
                other_start=other.index,
                other_cpu_s=None if used is None else round(used, 4),
                steal_s=None if (stolen := _grew(steal0, steal1)) is None else round(stolen, 3),
                major_faults=None if (faults := _grew(faults0, faults1)) is None else int(faults),
                kept_in="repeats",
                index=0,
            )
            self.sequence += 1
            last = not m.contaminated or attempt == evidence.MAX_ATTEMPTS
            kept = me.record.requests if pass_index == 1 and last else me.record.repeats
            m.kept_in, m.index = ("requests" if kept is me.record.requests else "repeats"), len(kept)
            kept.append(request)
            me.record.schedule.measurements.append(m)
            if m.contaminated:
                me.say(
                    f"{me.contract.name} start-{me.index}: {prompt.id} {label}: start-{other.index} used "
                    f"{m.other_cpu_s} CPU-s meanwhile (limit {m.busy_limit():.3f})"
                    + ("; measuring again" if not last else "; no attempts left")
                )
            if last:
                return

    def serve_passes(self, prompts: list) -> None:
        for pass_index in range(1, self.passes + 1):
            for k, prompt in enumerate(prompts):
                first, second = order(pass_index, k)
                for j, other in ((first, second), (second, first)):
                    self.measure(self.lives[j], self.lives[other], prompt, pass_index)


def run_interleaved(
    lives: list[LiveStart],
    passes: int,
    quality: list[QualitySample] | None = None,
    prompt_ids: list[str] | None = None,
) -> list[evidence.Evidence]:
    """Both launched starts of a contract: start-1 launched and ready, then start-2 launched while start-1 idles, then
    the passes; quality samples (if any) on start-1 after its closing /metrics. Every start is torn down and
    its evidence written on every exit; a start that fails takes the other's measurement with it."""
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
                message=f"not measured to the end: start-{culprit.index}, interleaved with it, failed "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                phase=live.server.phase,
                tails=live.server.tails(),
            )
            live.record.status = "failed"
