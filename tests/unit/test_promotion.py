"""promotion.json as a typed, versioned document: what a session writes reads back through the model and
validates against the published JSON Schema; an old untagged file reads and is said to be old; anything else
is refused naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from pytest_b70lab import cli
from pytest_b70lab.engine.starts import tables_or_why
from pytest_b70lab.evidence import promotion, run_folder
from pytest_b70lab.evidence.record import EvidenceError
from pytest_b70lab.judge import folder as judge
from pytest_b70lab.judge import replay, verdict

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
SNAPSHOTS = REPO / "tests" / "gates" / "__snapshots__"


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed bundle with the promotion.json a session writes for it (through the in-process judge)."""
    run = tmp_path_factory.mktemp("promotion") / "run"
    shutil.copytree(BUNDLE, run)
    starts = run_folder.read_starts(run)
    contract, problems = replay.judged_contract(starts, run, None)
    decision = judge.judge(
        run, contract, starts, tables=tables_or_why(run, contract, run), teacher_snapshots=SNAPSHOTS, problems=problems
    )
    verdict.write(decision, run)
    return run


def test_a_written_verdict_is_tagged_and_reads_back_through_the_model(judged: Path) -> None:
    raw = json.loads((judged / run_folder.PROMOTION).read_text())
    assert (raw["schema"], raw["version"]) == ("b70lab.promotion", 1)
    document, notes = promotion.read(judged / run_folder.PROMOTION)
    assert document.promotable is True and notes == []
    assert document.contract == "mini-laguna-cpu" and len(document.required) == 79 and document.judged is True


def test_the_published_schema_validates_what_a_session_writes(judged: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["schema", "promotion"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.validate(json.loads((judged / run_folder.PROMOTION).read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"promotable": "yes"}, schema)


def test_an_untagged_file_reads_and_is_said_to_be_old(judged: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(judged, run)
    raw = json.loads((run / run_folder.PROMOTION).read_text())
    del raw["schema"], raw["version"]
    (run / run_folder.PROMOTION).write_text(json.dumps(raw))
    read = run_folder.read(run)
    assert read.promotion is not None and read.promotion["promotable"] is True
    assert read.notes and promotion.UNTAGGED in read.notes[0]
    assert cli.main(["evidence", "show", str(run)]) == 0
    assert "note: " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda raw: raw.update(schema="b70lab.evidence"), "is not a b70lab promotion verdict"),
        (lambda raw: raw.update(version=2), "has version 2"),
        (lambda raw: raw.update(promotable="yes"), "does not match the promotion schema: promotable"),
        (lambda raw: raw.update(surprise=1), "does not match the promotion schema: surprise"),
    ],
    ids=["other-schema", "other-version", "wrong-type", "unknown-field"],
)
def test_a_foreign_or_damaged_file_is_refused_naming_it(judged: Path, tmp_path: Path, edit, says: str) -> None:
    raw = json.loads((judged / run_folder.PROMOTION).read_text())
    edit(raw)
    path = tmp_path / run_folder.PROMOTION
    path.write_text(json.dumps(raw))
    with pytest.raises(promotion.PromotionError, match=says) as e:
        promotion.read(path)
    assert str(path) in str(e.value)
    with pytest.raises(EvidenceError, match=says):
        run_folder.read_promotion(tmp_path)
