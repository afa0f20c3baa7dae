"""--b70-speedup: the candidate's paired speed-up over one target-only start of its own teacher, launched in
the same session after the candidate's starts (RUN/teacher/start-1). It judges no gate (b70_report_only): the
figure goes into the verdict line, this test's JUnit properties and promotion.json."""

from __future__ import annotations

import json

import pytest

from ...evidence.run_folder import Run, kind_dir
from ...judge import compare

pytestmark = [pytest.mark.gates, pytest.mark.b70_report_only]


def test_speedup_over_target_only(request: pytest.FixtureRequest, b70_evidence, b70_state, record_property) -> None:
    if not request.config.getoption("--b70-speedup"):
        pytest.skip("no --b70-speedup: no target-only start in this session")
    target_only = request.getfixturevalue("b70_teacher_evidence")
    assert target_only.status == "ok", f"the target-only start failed: {target_only.failure}"
    candidate = [s for s in b70_evidence if s.status == "ok"]
    try:
        figure = compare.speedup_figure(
            Run(kind_dir(b70_state.run_dir, "teacher"), (target_only,), None),
            Run(b70_state.run_dir, tuple(candidate), None),
        )
    except compare.CompareError as e:
        pytest.fail(str(e), pytrace=False)
    for key in ("ratio", "low", "high", "ratio_of_medians", "outputs_identical"):
        record_property(f"speedup_{key}", figure[key])
    record_property("b70_speedup", json.dumps(figure))
    assert figure["outputs_identical"] == figure["prompts"], (
        "the candidate's tokens differ from its target-only start's: that is not a speed-up (teacher-exactness says where)"
    )
