"""An interleaved session's claim checked against its own timeline, across its starts: each start's evidence is
consistent on its own, but only the two together show whether they were served side by side. Every measurement
of the session has its place in one shared order (`sequence`) and its times on one clock (the harness's
monotonic clock, in seconds since the first start was launched: `started_at`, `ended_at`); so the requests of the
session never overlap in time, follow that order, and each (pass, prompt) is served by the starts one after the
other, with nothing else between. A run whose starts were served one after the other, or whose requests were
moved onto each other's, and then labelled interleaved, is refused naming two requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

from .record import Evidence, Measurement

# Both times are rounded to the microsecond when recorded: one request may seem to begin that much before the
# previous one ended.
ROUNDING_S = 2e-6
SHOWN = 5


def _name(start: int, m: Measurement) -> str:
    attempt = f" attempt {m.attempt}" if m.attempt > 1 else ""
    return f"start-{start} {m.prompt_id} pass {m.pass_index}{attempt} (sequence {m.sequence})"


def session_contradictions(starts: Sequence[Evidence]) -> list[str]:
    """Where the interleaved starts of one session contradict each other; [] where they agree, or where there
    is nothing to compare (fewer than two interleaved starts, or a sweep's session, whose starts lie in the
    folders of several variants)."""
    interleaved = [s for s in starts if s.schedule is not None and s.schedule.measurements]
    if len(interleaved) < 2 or any(m.others is not None for s in interleaved for m in s.schedule.measurements):  # type: ignore[union-attr]
        return []
    rows = sorted(
        ((m.sequence, s.start_index, m) for s in interleaved for m in s.schedule.measurements),  # type: ignore[union-attr]
        key=lambda row: (row[0], row[1]),
    )
    indices = {s.start_index for s in interleaved}
    problems = [
        f"{_name(i, m)} says it ran beside start-{m.other_start}, which is not the session's other start"
        for _, i, m in rows
        if m.other_start not in indices - {i}
    ]
    counts = Counter(seq for seq, _, _ in rows)
    problems += [
        f"{' and '.join(_name(i, m) for s, i, m in rows if s == seq)} share one place in the session's order"
        for seq, n in sorted(counts.items())
        if n > 1
    ]
    problems += [
        f"{_name(ib, b)} began at {b.started_at:.3f} s, before {_name(ia, a)} ended at {a.ended_at:.3f} s: the "
        f"requests of an interleaved session never overlap, and follow their order"
        for (_, ia, a), (_, ib, b) in pairwise(rows)
        if b.started_at < a.ended_at - ROUNDING_S
    ]
    return problems + _apart(rows)


def _apart(rows: list[tuple[int, int, Measurement]]) -> list[str]:
    """Each (pass, prompt) is one stretch of the order, and within it each start's attempts are one stretch."""
    problems: list[str] = []
    closed_groups: set[tuple[int, str]] = set()
    closed_starts: set[int] = set()
    for (_, ia, a), (_, ib, b) in pairwise(rows):
        group_a, group_b = (a.pass_index, a.prompt_id), (b.pass_index, b.prompt_id)
        if group_a != group_b:
            closed_groups.add(group_a)
            closed_starts = set()
            if group_b in closed_groups:
                problems.append(
                    f"{_name(ib, b)} comes after {_name(ia, a)}, but its pass and prompt were served earlier in the "
                    f"session: the starts were not served side by side"
                )
        elif ia != ib:
            closed_starts.add(ia)
            if ib in closed_starts:
                problems.append(f"{_name(ib, b)} comes after {_name(ia, a)} within one pass and prompt, out of turn")
    return problems[:SHOWN]
