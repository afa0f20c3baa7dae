"""Gates judged per fresh start and per prompt, from the streamed requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_b70lab import gates, teacher

pytestmark = pytest.mark.gates
SNAPSHOTS = Path(__file__).parent


@pytest.fixture
def start(b70_evidence, b70_start: int):
    return b70_evidence[b70_start - 1]


def test_teacher_exactness(start, b70_prompt, b70_contract, b70_verdict) -> None:
    path = teacher.snapshot_path(SNAPSHOTS, b70_contract.name, b70_prompt)
    try:
        snapshot = teacher.read(path)
    except teacher.TeacherSnapshotError as e:
        if path.exists():  # corrupted: say so rather than "missing"
            pytest.fail(f"{e}; re-record with `{teacher.RECORD_COMMAND.format(name=b70_contract.name)}`",
                        pytrace=False)
        snapshot = None
    b70_verdict(gates.teacher_exactness(start, b70_prompt, b70_contract, snapshot, str(path)))


def test_cold_prompt(start, b70_prompt, b70_verdict) -> None:
    b70_verdict(gates.cold_prompt(start, b70_prompt))


def test_token_count(start, b70_prompt, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.token_count(start, b70_prompt, b70_contract))
