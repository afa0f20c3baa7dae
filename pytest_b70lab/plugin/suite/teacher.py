"""The FP8 teacher: the contract without speculation, recorded as one syrupy snapshot per prompt.

`pytest -m teacher --snapshot-update` launches the teacher and writes the snapshots; without
--snapshot-update the same test checks that a fresh teacher run still reproduces them.
"""

from __future__ import annotations

import pytest

from ...judge import teacher

pytestmark = pytest.mark.teacher


def test_record_teacher(b70_prompt, b70_contract, b70_teacher_evidence, snapshot) -> None:
    assert b70_teacher_evidence.status == "ok", (
        f"the teacher start failed: {b70_teacher_evidence.failure.message if b70_teacher_evidence.failure else '?'}"
    )
    assert b70_teacher_evidence.role == "teacher" and b70_teacher_evidence.draft is None
    record = teacher.payload(b70_contract, b70_teacher_evidence, b70_prompt)
    assert snapshot(extension_class=teacher.snapshot_extension(b70_contract)) == record
