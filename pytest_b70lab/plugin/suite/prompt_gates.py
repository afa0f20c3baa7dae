"""Gates judged per fresh start and per prompt, from the streamed requests (teacher-exactness also from the
teacher snapshot in __snapshots__/ beside this file, or --b70-teacher-snapshots), through the catalogue."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gates


@pytest.mark.b70_gate("teacher-exactness")
def test_teacher_exactness(b70_start_evidence, b70_prompt, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, prompt=b70_prompt)


@pytest.mark.b70_gate("cold-prompt")
def test_cold_prompt(b70_start_evidence, b70_prompt, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, prompt=b70_prompt)


@pytest.mark.b70_gate("token-count")
def test_token_count(b70_start_evidence, b70_prompt, b70_gate_check) -> None:
    b70_gate_check(b70_start_evidence, prompt=b70_prompt)
