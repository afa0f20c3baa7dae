"""Gates judged per fresh start and per prompt, from the streamed requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_b70lab import gates, teacher

pytestmark = pytest.mark.gates
SNAPSHOTS = Path(__file__).parent / "__snapshots__"


@pytest.mark.b70_gate("teacher-exactness")
def test_teacher_exactness(b70_start_evidence, b70_prompt, b70_contract, b70_verdict, pytestconfig) -> None:
    if "teacher-exactness" not in gates.applicable_gates(b70_contract):
        pytest.skip("the unquantized-KV reference is not held to the FP8 teacher")
    path = teacher.snapshot_path(
        pytestconfig.getoption("--b70-teacher-snapshots") or SNAPSHOTS, b70_contract, b70_prompt
    )
    try:
        snapshot = teacher.read(path)
    except teacher.TeacherSnapshotError as e:
        if path.exists():  # corrupted: say so rather than "missing"
            pytest.fail(f"{e}; re-record with `{teacher.RECORD_COMMAND.format(name=b70_contract.name)}`", pytrace=False)
        snapshot = None
    b70_verdict(gates.teacher_exactness(b70_start_evidence, b70_prompt, b70_contract, snapshot, str(path)))


@pytest.mark.b70_gate("cold-prompt")
def test_cold_prompt(b70_start_evidence, b70_prompt, b70_verdict) -> None:
    b70_verdict(gates.cold_prompt(b70_start_evidence, b70_prompt))


@pytest.mark.b70_gate("token-count")
def test_token_count(b70_start_evidence, b70_prompt, b70_contract, b70_verdict) -> None:
    b70_verdict(gates.token_count(b70_start_evidence, b70_prompt, b70_contract))
