"""The interleaved claim checked against its own timeline (issue 48 item 7): both committed interleaved bundles
hold; a session whose start-2 was served after all of start-1 (its requests moved later, or its place in the
order renumbered) or onto start-1's requests is refused at load, naming two requests."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import run_folder, timeline

BUNDLES = Path(__file__).resolve().parents[2] / "fixtures" / "evidence"
INTERLEAVED = ["mini-laguna-cpu", "mini-laguna-cpu-int4"]


def _edited(
    tmp_path: Path, bundle: str, change: Callable[[list[evidence.Measurement], list[evidence.Measurement]], None]
) -> Path:
    """A copy of the bundle whose two schedules are edited by `change(start-1's, start-2's)`, each start
    re-written with its digest: evidence that each start alone still accepts."""
    run = Path(shutil.copytree(BUNDLES / bundle, tmp_path / bundle))
    records = [evidence.read(run / f"start-{i}" / evidence.FILENAME) for i in (1, 2)]
    change(*(r.schedule.measurements for r in records))  # type: ignore[union-attr]
    for i, record in enumerate(records, 1):
        evidence.write(record, run / f"start-{i}")
        evidence.read(run / f"start-{i}" / evidence.FILENAME)  # each start alone holds
    return run


@pytest.mark.parametrize("bundle", INTERLEAVED)
def test_the_committed_interleaved_bundles_hold_across_their_starts(bundle: str) -> None:
    starts = run_folder.read_starts(BUNDLES / bundle)
    assert timeline.session_contradictions(starts) == []
    sequences = sorted(m.sequence for s in starts for m in s.schedule.measurements)  # type: ignore[union-attr]
    assert sequences == list(range(len(sequences))) and len(sequences) >= 36


def _served_after(first: list[evidence.Measurement], second: list[evidence.Measurement]) -> None:
    """Start-2 measured after the whole of start-1, its places in the order kept."""
    end = max(m.ended_at for m in first)
    for m in second:
        m.started_at, m.ended_at = m.started_at + end, m.ended_at + end


def _renumbered(first: list[evidence.Measurement], second: list[evidence.Measurement]) -> None:
    """Served one after the other and then numbered so: start-1's requests first, start-2's after, times to match."""
    _served_after(first, second)
    for seq, m in enumerate(sorted(first, key=lambda m: m.sequence) + sorted(second, key=lambda m: m.sequence)):
        m.sequence = seq


def _overlapping(first: list[evidence.Measurement], second: list[evidence.Measurement]) -> None:
    """Each of start-2's requests moved onto start-1's of the same pass and prompt."""
    by_key = {(m.pass_index, m.prompt_id): m for m in first}
    for m in second:
        other = by_key[(m.pass_index, m.prompt_id)]
        m.started_at, m.ended_at = other.started_at, other.ended_at


@pytest.mark.parametrize("bundle", INTERLEAVED)
@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_served_after, "began at"),
        (_renumbered, "but its pass and prompt were served earlier in the session"),
        (_overlapping, "the requests of an interleaved session never overlap"),
    ],
    ids=["served-after", "renumbered", "overlapping"],
)
def test_a_session_that_was_not_side_by_side_is_refused_naming_two_requests(
    tmp_path: Path, bundle: str, change: Callable, said: str
) -> None:
    run = _edited(tmp_path, bundle, change)
    with pytest.raises(evidence.EvidenceError) as refused:
        run_folder.read_starts(run)
    message = str(refused.value)
    assert f"the interleaved starts under {run} contradict each other (refused" in message and said in message
    first = message.split(": ", 1)[1]
    assert "start-1 " in first and "start-2 " in first and "(sequence " in first, message


def test_two_requests_in_one_place_and_a_wrong_partner_are_named(tmp_path: Path) -> None:
    def change(first: list[evidence.Measurement], second: list[evidence.Measurement]) -> None:
        second[0].sequence = first[0].sequence
        second[1].other_start = 2

    run = _edited(tmp_path, "mini-laguna-cpu-int4", change)
    starts = [evidence.read(run / f"start-{i}" / evidence.FILENAME) for i in (1, 2)]
    found = timeline.session_contradictions(starts)
    assert any("share one place in the session's order" in p for p in found), found
    assert any("says it ran beside start-2, which is not the session's other start" in p for p in found), found
