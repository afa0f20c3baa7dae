"""The in-process judge and a pytest replay reach the same verdict: on both committed bundles, and on a copy of
the candidate bundle mutated once per gate (the first mutation of tests/unit/test_gates.py that the run folder
can carry). The pytest side runs in this process (pytester), the judge through `judge.judge`, as the sweep
calls it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest
from test_gates import MUTATIONS, Run  # tests/unit/test_gates.py: the mutations every gate is shown to reject

from pytest_b70lab.engine.logs import failure_headline
from pytest_b70lab.engine.starts import tables_or_why
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence.run_folder import TABLES_COPY, read_starts
from pytest_b70lab.judge import catalogue, replay, verdict
from pytest_b70lab.judge import folder as judge
from pytest_b70lab.plugin import suite

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "fixtures" / "evidence"
GATES = REPO / "tests" / "gates"
SNAPSHOTS = GATES / "__snapshots__"

pytest_plugins = ["pytester"]

# What promotion.json says that both sides must agree on (the run folder and the test names aside).
AGREED = ("promotable", "complete", "blocked", "contract", "contract_digest", "failed_gates", "required", "missing")


def in_process(run_dir: Path) -> tuple[dict[str, Any], str]:
    """(promotion.json's fields, the verdict's first line) of the in-process judge, as the sweep calls it."""
    starts = read_starts(run_dir)
    contract, problems = replay.judged_contract(starts, run_dir, None)
    problems += replay.recorded_before_identity(starts, run_dir)
    decision = judge.judge(
        run_dir,
        contract,
        starts,
        tables=tables_or_why(run_dir, contract, run_dir / "no-cache"),
        teacher_snapshots=SNAPSHOTS,
        problems=problems,
        headline=failure_headline,
    )
    return verdict.record(decision, run_dir), judge.headline_line(decision, run_dir)


def by_pytest(pytester: pytest.Pytester, run_dir: Path) -> tuple[dict[str, Any], str]:
    result = pytester.runpytest(str(GATES), "-m", "gates", "--b70-evidence", str(run_dir), "-p", "no:cacheprovider")
    out = result.stdout.str()
    line = next(x for x in out.split("b70lab promotion verdict", 1)[-1].splitlines()[1:] if x.strip())
    return json.loads((run_dir / "promotion.json").read_text()), line


def assert_same_verdict(pytester: pytest.Pytester, run_dir: Path) -> dict[str, Any]:
    mine, my_line = in_process(run_dir)
    theirs, their_line = by_pytest(pytester, run_dir)
    assert my_line == their_line
    assert {k: mine[k] for k in AGREED} == {k: theirs[k] for k in AGREED}
    assert mine["observed"] == theirs["observed"]  # every (gate, subject, outcome), the speed-up test aside
    named = sorted("tests/gates/" + o["test"].split("tests/gates/")[-1] for o in theirs["gates"] if o["gate"])
    assert sorted(o["test"] for o in mine["gates"]) == named, "the in-process outcomes are named as the session's"
    return mine


@pytest.mark.parametrize("bundle", ["mini-laguna-cpu", "mini-laguna-cpu-teacher"])
def test_the_committed_bundles_get_one_verdict_either_way(pytester: pytest.Pytester, bundle: str) -> None:
    run_dir = pytester.path / bundle
    shutil.copytree(BUNDLES / bundle, run_dir)
    mine = assert_same_verdict(pytester, run_dir)
    assert mine["promotable"] is (bundle == "mini-laguna-cpu")


def _write(run: Run, run_dir: Path) -> None:
    """The mutated run as a run folder: each start's evidence (its digest recomputed), and the tables."""
    for start in run.starts:
        record = evidence.Evidence.model_validate(start.model_dump(by_alias=True))
        evidence.write(record, run_dir / f"start-{start.start_index}")
    (run_dir / TABLES_COPY).write_text(json.dumps(run.tables))


def _carried(mutate, tmp: Path) -> bool:
    """Whether a run folder can carry the mutation: it changes what the folder holds (the evidence, the tables),
    not the contract or the snapshots the test holds beside it, and the evidence still reads back."""
    run = Run()
    contract, snapshots = run.contract.digest, json.dumps(run.snapshots, sort_keys=True, default=str)
    mutate(run)
    if run.contract.digest != contract or json.dumps(run.snapshots, sort_keys=True, default=str) != snapshots:
        return False
    folder = tmp / f"{mutate.__name__}-{len(list(tmp.iterdir()))}"
    shutil.copytree(BUNDLES / "mini-laguna-cpu", folder)
    _write(run, folder)
    try:
        read_starts(folder)
    except evidence.EvidenceError:
        return False  # the reader refuses it before any gate (test_evidence.py's ground)
    return True


def a_request_one_token_short(run: Run) -> None:
    """A start that stopped a prompt one token early (the evidence reads back; the output gates see it too)."""
    request = run.starts[0].requests[0]
    request.token_ids = request.token_ids[:-1]
    request.token_ids_sha256 = evidence.sha256_ids(request.token_ids)


def _one_per_gate() -> list[tuple[Any, str]]:
    import tempfile

    chosen: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="b70-judge-") as tmp:
        for mutate, gate, _ in [*MUTATIONS, (a_request_one_token_short, "evidence-prompts", "")]:
            if gate not in chosen and _carried(mutate, Path(tmp)):
                chosen[gate] = mutate
    return sorted(chosen.items(), key=lambda kv: list(catalogue.GATE_NAMES).index(kv[0]))


ONE_PER_GATE = _one_per_gate()


def test_every_gate_has_a_folder_mutation() -> None:
    assert {gate for gate, _ in ONE_PER_GATE} == set(catalogue.GATE_NAMES)


@pytest.mark.parametrize(("gate", "mutate"), ONE_PER_GATE, ids=[g for g, _ in ONE_PER_GATE])
def test_a_mutated_folder_gets_one_verdict_either_way(pytester: pytest.Pytester, gate: str, mutate) -> None:
    run_dir = pytester.path / "run"
    shutil.copytree(BUNDLES / "mini-laguna-cpu", run_dir)
    run = Run()
    mutate(run)
    _write(run, run_dir)
    mine = assert_same_verdict(pytester, run_dir)
    assert gate in mine["failed_gates"] or (
        gate.startswith("evidence-") and "evidence-complete" in mine["failed_gates"]
    )


def test_the_catalogue_is_the_sessions_gate_tests(pytester: pytest.Pytester) -> None:
    """Every gate of the catalogue is a test in tests/gates under the name the catalogue gives, and in order."""
    result = pytester.runpytest(str(GATES), "--co", "-q", "-m", "gates", "-p", "no:cacheprovider")
    collected = {
        "tests/gates/" + line.split("[")[0].split("tests/gates/")[-1] for line in result.stdout.lines if "::" in line
    }
    assert {f"tests/gates/{g.test}" for g in catalogue.CATALOGUE} <= collected
    assert sorted(g.name for g in catalogue.CATALOGUE) == sorted(catalogue.GATE_NAMES)


def test_the_markers_and_the_documented_table_are_the_catalogues() -> None:
    """The catalogue is written once: each test of the shipped suite is marked with the gate the catalogue names for it,
    and docs/gates.md lists every gate with its scope, every evidence check by name."""
    import importlib

    marked = {}
    for collected_as, module in suite.MODULES.items():
        found = vars(importlib.import_module(f"{suite.__name__}.{module}"))
        for name, test in found.items():
            for mark in getattr(test, "pytestmark", []) if name.startswith("test_") else []:
                if mark.name == "b70_gate":
                    marked[f"{collected_as}::{name}"] = mark.args[0]
    assert marked == {g.test: g.name for g in catalogue.CATALOGUE}
    page = (REPO / "docs" / "gates.md").read_text()
    for g in catalogue.CATALOGUE:
        row = f"| {g.name} | {g.scope} |" if g.name in catalogue.GATE_SCOPES else f"| {g.name} |"
        assert row in page, f"docs/gates.md has no row {row!r}"
