"""Every file a run folder pins is checked when the folder is read back (issue 33, item 4).

- RUN/prompts.jsonl, the copy of the prompt set the run was served, against the sha256 its contract pins: an
  edited copy makes the replay NOT PROMOTABLE, naming the file, even where the repository's own prompt file
  serves the replay.
- RUN/checkpoint-tables.json against the checkpoints themselves where they are on this machine (the mini,
  built in the cache): a copy edited consistently with edited evidence, which every gate would otherwise
  accept, fails the load audit naming the table and the tensor. Where the checkpoint is not at hand the
  verdict says the tables were taken on trust, and promotion.json and the report keep it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest
import torch  # noqa: F401  (likewise: the mini's build imports it after in-process replays have run)

from pytest_b70lab import report
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence.run_folder import PROMPTS_COPY, TABLES_COPY
from pytest_b70lab.judge import folder as judge  # noqa: F401  (mini: loaded before any replay)

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
GATES = REPO / "tests" / "gates"
SNAPSHOTS = GATES / "__snapshots__"
BIAS = "e_score_correction_bias"

pytest_plugins = ["pytester"]


def _copy(tmp: Path, name: str = "run") -> Path:
    run = tmp / name
    shutil.copytree(BUNDLE, run)
    return run


def _replay(pytester: pytest.Pytester, run: Path, cache: Path) -> tuple[str, dict]:
    result = pytester.runpytest(
        str(GATES), "-m", "gates", "--b70-evidence", str(run), f"--b70-cache-dir={cache}", "-p", "no:cacheprovider"
    )
    return result.stdout.str(), json.loads((run / "promotion.json").read_text())


def test_an_edited_prompt_copy_is_named_even_where_the_repository_serves(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    run = _copy(tmp_path)
    lines = (run / PROMPTS_COPY).read_text().splitlines()
    first = json.loads(lines[0])
    first["prompt"] = first["prompt"] + " (edited)"
    (run / PROMPTS_COPY).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")

    decision = judge.judge_folder(run, SNAPSHOTS)
    assert not decision.promotable and any(PROMPTS_COPY in p and "damaged" in p for p in decision.problems)
    out, promotion = _replay(pytester, run, tmp_path / "cache")
    assert promotion["promotable"] is False and not promotion["complete"]
    damaged = [p for p in promotion["problems"] if str(run / PROMPTS_COPY) in p]
    assert damaged and "pins" in damaged[0], promotion["problems"]
    assert "NOT PROMOTABLE (incomplete)" in out and f"{run / PROMPTS_COPY}" in out


def _forge_a_dropped_router_bias(run: Path) -> str:
    """What hides vLLM 0.32's dropped router bias from the load audit: every rank's bias zero, and the table
    copy saying the checkpoint's bias is zero too (its derived fields stay consistent). Returns the tensor."""
    for start in (1, 2):
        record = evidence.read(run / f"start-{start}")
        for audit in record.audits:
            for name, p in audit["parameters"].items():
                if name.endswith(BIAS):
                    p["moments"] = {**p["moments"], "sum": 0.0, "sumsq": 0.0}
        evidence.write(evidence.Evidence.model_validate(record.model_dump(by_alias=True)), run / f"start-{start}")
    tables = json.loads((run / TABLES_COPY).read_text())
    forged = sorted(n for n in tables["target"]["tensors"] if n.endswith(BIAS))
    for name in forged:
        t = tables["target"]["tensors"][name]
        t["moments"] = {**t["moments"], "sum": 0.0, "sumsq": 0.0}
    (run / TABLES_COPY).write_text(json.dumps(tables))
    return forged[0]


def test_a_forged_table_fails_where_the_checkpoint_is_at_hand(
    pytester: pytest.Pytester, tmp_path: Path, b70_mini_model: Path
) -> None:
    cache = b70_mini_model.parent.parent  # CACHE/mini/mini-laguna-<digest>
    run = _copy(tmp_path)
    tensor = _forge_a_dropped_router_bias(run)

    out, promotion = _replay(pytester, run, cache)
    assert promotion["promotable"] is False, out[-3000:]
    # every gate that reads the tables fails, saying why; the others are judged as ever
    assert sorted(promotion["failed_gates"]) == ["load-audit", "target-scale-audit"], promotion["failed_gates"]
    reasons = " ".join(f["reasons"] for f in promotion["failed"])
    assert f"checkpoint tables {run / TABLES_COPY}: the target table is not its checkpoint's" in reasons
    assert f"tensor {tensor}" in reasons


def test_without_the_checkpoint_the_tables_are_taken_on_trust_and_said_to_be(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The same forgery on a machine without the mini: nothing can recompute the tables, so the gates judge the
    copy (and pass), and the verdict, promotion.json and the report all say it was taken on trust."""
    run = _copy(tmp_path)
    _forge_a_dropped_router_bias(run)
    out, promotion = _replay(pytester, run, tmp_path / "empty-cache")
    assert promotion["promotable"] is True, out[-3000:]
    checked = promotion["checkpoint_tables_checked"]
    assert set(checked) == {"target", "draft"} and all(
        v.startswith("taken on trust: the mini") for v in checked.values()
    )
    assert "checkpoint tables taken on trust (no checkpoint here to recompute them from): target: the mini" in out
    page = report.write(run, tmp_path / "report.html").read_text()
    assert "checkpoint tables" in page and "taken on trust: the mini" in page


def test_a_true_copy_is_recomputed_from_the_checkpoint(
    pytester: pytest.Pytester, tmp_path: Path, b70_mini_model: Path
) -> None:
    run = _copy(tmp_path)
    out, promotion = _replay(pytester, run, b70_mini_model.parent.parent)
    assert promotion["promotable"] is True, out[-3000:]
    checked = promotion["checkpoint_tables_checked"]
    assert all(v.startswith("recomputed from mini ") for v in checked.values()) and set(checked) == {"target", "draft"}
    assert "taken on trust" not in out
