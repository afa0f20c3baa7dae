"""Gate 8: quality beside exactness. Coding, structured output, tool use, repetition and longer context,
each figure judged against the recorded FP8 baseline of the contract's target-only run.

The candidate's quality answers ride on its first gate start, after the gate requests and after the
closing /metrics scrape (no extra engine start; cold-prompt and throughput evidence never see them).
`pytest -m quality --snapshot-update` records the baselines instead: the teacher (target only, FP8 KV) and,
where the contract names one, the unquantized-KV reference, to show what FP8 KV costs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_b70lab.quality import baseline, judge

pytestmark = pytest.mark.quality
HERE = Path(__file__).parent


def _fp8_baseline(contract, keys: dict, candidate) -> dict:
    """Per-sample pass/fail of the recorded FP8 baseline, checked for edits and staleness (fail closed)."""
    path = baseline.snapshot_path(HERE, contract.teacher().output_digest, "fp8")
    command = baseline.RECORD_COMMAND.format(name=contract.name)
    if not path.exists():
        pytest.fail(f"no quality baseline at {path}: record it with `{command}`", pytrace=False)
    try:
        data = baseline.read(path)
        baseline.check_identity(data, baseline.identity(contract, "fp8", candidate), path, command)
        return baseline.passes(data, keys, path)
    except baseline.QualityBaselineError as e:
        pytest.fail(str(e), pytrace=False)


def test_quality(
    b70_quality_figure,
    b70_quality_keys,
    b70_evidence,
    b70_quality_scores,
    b70_contract,
    b70_run_dir,
    b70_quality_verdict,
) -> None:
    start = next((e for e in b70_evidence if e.start_index == 1), None)
    if start is None:
        pytest.fail(f"no start-1 evidence in {b70_run_dir}: the quality answers ride on it", pytrace=False)
    scores, _texts = b70_quality_scores(start)
    passes = _fp8_baseline(b70_contract, b70_quality_keys, start)
    where = f" (evidence {b70_run_dir / 'start-1' / 'evidence.json'})"
    b70_quality_verdict(
        judge.judge(
            b70_quality_figure, b70_quality_keys[b70_quality_figure], scores, passes, b70_contract.quality.alpha, where
        )
    )


def test_quality_baseline(
    b70_quality_flavour, b70_contract, b70_quality_keys, b70_quality_scores, snapshot, request
) -> None:
    """Records the baseline (with --snapshot-update) or checks that a fresh target-only run reproduces it."""
    fixture = "b70_teacher_evidence" if b70_quality_flavour == "fp8" else "b70_reference_evidence"
    run = request.getfixturevalue(fixture)
    assert run.status == "ok" or run.quality, (
        f"the {run.role} start failed: {run.failure.message if run.failure else '?'}"
    )
    scores, texts = b70_quality_scores(run)
    record = baseline.payload(
        baseline.identity(b70_contract, b70_quality_flavour, run), b70_quality_keys, scores, texts
    )
    extension = baseline.snapshot_extension(b70_contract.teacher().output_digest)
    assert snapshot(extension_class=extension) == record
