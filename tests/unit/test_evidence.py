"""Evidence files: atomic, self-digested, and any damage is a clear error naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_b70lab import evidence, session

BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "evidence" / "mini-laguna-cpu"


@pytest.fixture
def copy_of_start(tmp_path: Path) -> Path:
    folder = tmp_path / "start-1"
    folder.mkdir()
    shutil.copy(BUNDLE / "start-1" / evidence.FILENAME, folder / evidence.FILENAME)
    return folder


def test_round_trip_keeps_the_digest(copy_of_start: Path, tmp_path: Path) -> None:
    original = evidence.read(copy_of_start)
    again = tmp_path / "again"
    evidence.write(original.model_copy(deep=True), again)
    assert evidence.read(again).digest == original.digest
    assert not list(again.glob(".evidence-*")), "the temporary file of the atomic write is left behind"


def test_an_edit_breaks_the_digest(copy_of_start: Path) -> None:
    path = copy_of_start / evidence.FILENAME
    data = json.loads(path.read_text())
    data["requests"][0]["token_ids"][0] += 1
    path.write_text(json.dumps(data))
    with pytest.raises(evidence.EvidenceError, match="does not match its own digest"):
        evidence.read(path)


@pytest.mark.parametrize(("content", "message"), [
    ("{truncated", "is not valid JSON"),
    ('{"schema": "something.else"}', "is not b70lab evidence"),
    ('{"schema": "b70lab.evidence", "version": 99}', "has version 99"),
    ('{"schema": "b70lab.evidence", "version": 1, "role": "candidate"}', "does not match the schema"),
])
def test_damaged_evidence_is_a_clear_error(copy_of_start: Path, content: str, message: str) -> None:
    path = copy_of_start / evidence.FILENAME
    path.write_text(content)
    with pytest.raises(evidence.EvidenceError, match=message) as err:
        evidence.read(path)
    assert str(path) in str(err.value)


def test_a_run_folder_without_evidence_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(evidence.EvidenceError, match="no candidate evidence under"):
        session.load_run(tmp_path)


def test_decode_rate_of_recorded_requests_follows_the_accounting() -> None:
    from pytest_b70lab import throughput

    start = session.load_run(BUNDLE)[0]
    for r in start.requests:
        times = throughput.token_arrival_times(r.chunk_times, r.chunk_tokens)
        assert len(times) == len(r.token_ids)
        assert r.decode_rate == pytest.approx((len(times) - 1) / (times[-1] - times[0]))
    assert start.throughput.endpoint_median == pytest.approx(
        throughput.endpoint_median([r.decode_rate for r in start.requests]))
