"""A replay is judged under the contract it was recorded under, and that contract is checked: against its own
digest, across the run's starts, and against the repository's contract of the same name (issue 23, item 4).

Each case edits a copy of the committed bundle as a consistent editor would: every edited evidence file is
re-validated and given a fresh self-digest, and the checkpoint tables follow the contract digest.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest

from pytest_b70lab.contract.schema import Contract
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.judge import reproduction

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
GATES = REPO / "tests" / "gates"

pytest_plugins = ["pytester"]


def _rewrite(run: Path, start: int, edit: Callable[[evidence.Evidence], None]) -> None:
    record = evidence.read(run / f"start-{start}")
    edit(record)
    evidence.write(evidence.Evidence.model_validate(record.model_dump(by_alias=True)), run / f"start-{start}")


def _loosen_reproduction(record: evidence.Evidence) -> None:
    """The embedded contract with its reproduction tolerance raised to 0.99 and its digest recomputed."""
    record.contract.canonical["reproduction"]["throughput_tolerance"] = 0.99
    record.contract.digest = Contract.model_validate(record.contract.canonical, strict=False).digest


def _loosened_copy(tmp: Path, starts: tuple[int, ...] = (1, 2)) -> tuple[Path, str]:
    run = tmp / "run"
    shutil.copytree(BUNDLE, run)
    for n in starts:
        _rewrite(run, n, _loosen_reproduction)
    digest = evidence.read(run / f"start-{starts[0]}").contract.digest
    tables = run / "checkpoint-tables.json"
    tables.write_text(json.dumps({**json.loads(tables.read_text()), "contract_digest": digest}))
    return run, digest


def _replay(pytester: pytest.Pytester, run: Path, *extra: str):
    return pytester.runpytest(str(GATES), "-m", "gates", "--b70-evidence", str(run), "-p", "no:cacheprovider", *extra)


def _promotion(run: Path) -> dict:
    return json.loads((run / "promotion.json").read_text())


def _not_promoted(run: Path) -> bool:
    """A session that stops before judging leaves no verdict, or one that says not promotable."""
    return not (run / "promotion.json").exists() or _promotion(run)["promotable"] is False


def _repository_digest() -> str:
    return evidence.read(BUNDLE / "start-1").contract.digest


def test_the_committed_bundle_replays_under_the_contract_it_names(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    result = _replay(pytester, run, "--b70-contract", "mini-laguna-cpu")
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["PROMOTABLE at *"])


def test_a_contract_changed_since_recording_is_named_in_the_verdict(pytester: pytest.Pytester) -> None:
    run, digest = _loosened_copy(pytester.path)
    result = _replay(pytester, run)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            f"NOT PROMOTABLE (incomplete) - contract mini-laguna-cpu: recorded under "
            f"mini-laguna-cpu {digest[:12]}, fixtures/contracts/mini-laguna-cpu.toml is now "
            f"{_repository_digest()[:12]}: the contract changed since this evidence was recorded*"
            f"--b70-contract mini-laguna-cpu@{digest}*"
        ]
    )
    assert "PROMOTABLE at" not in result.stdout.str()
    assert _promotion(run)["promotable"] is False


def test_naming_the_repository_contract_for_evidence_recorded_under_another_is_refused(
    pytester: pytest.Pytester,
) -> None:
    run, digest = _loosened_copy(pytester.path)
    result = _replay(pytester, run, "--b70-contract", "mini-laguna-cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*--b70-contract mini-laguna-cpu is mini-laguna-cpu {_repository_digest()[:12]}, "
            f"but {run} was recorded under mini-laguna-cpu {digest[:12]}: a replay is judged "
            f"under the contract it was recorded under, never another*"
        ]
    )
    assert _not_promoted(run)


def test_naming_another_contract_is_refused(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    result = _replay(pytester, run, "--b70-contract", "mini-laguna-cpu-path")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--b70-contract mini-laguna-cpu-path is mini-laguna-cpu-path *, but * was recorded under mini-laguna-cpu *"]
    )


def test_the_recorded_contract_named_by_its_digest_judges_the_replay(pytester: pytest.Pytester) -> None:
    """The lab's way to re-judge an old bundle under what it ran: NAME@DIGEST. The loosened tolerance then
    judges (this copy's starts are the committed ones: it passes), and nothing is said of the repository's."""
    run, digest = _loosened_copy(pytester.path)
    result = _replay(pytester, run, "--b70-contract", f"mini-laguna-cpu@{digest[:16]}")
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["PROMOTABLE at *"])
    wrong = _replay(pytester, run, "--b70-contract", f"mini-laguna-cpu@{_repository_digest()[:16]}")
    assert wrong.ret == pytest.ExitCode.USAGE_ERROR
    wrong.stderr.fnmatch_lines(["*does not name the contract * was recorded under (mini-laguna-cpu@*"])


def test_two_starts_recorded_under_different_contracts_are_refused(pytester: pytest.Pytester) -> None:
    run, digest = _loosened_copy(pytester.path, starts=(2,))
    result = _replay(pytester, run)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*start-2 of {run} was recorded under contract mini-laguna-cpu {digest[:12]}, "
            f"start-1 under mini-laguna-cpu {_repository_digest()[:12]}: one run is recorded "
            f"under one contract*"
        ]
    )
    assert _not_promoted(run)


def test_an_embedded_contract_whose_digest_is_not_its_text_is_refused(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)

    def edit(record: evidence.Evidence) -> None:
        record.contract.canonical["reproduction"]["throughput_tolerance"] = 0.99  # the digest left as it was

    _rewrite(run, 1, edit)
    _rewrite(run, 2, edit)
    result = _replay(pytester, run)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*evidence {run / 'start-1' / 'evidence.json'}: contract.digest "
            f"{_repository_digest()[:12]} is not the digest of contract.canonical *: the evidence "
            f"contradicts itself*"
        ]
    )


# --- figures from the arrival times, never from the record --------------------------------------------------


def _stretch(run: Path, start: int, factor: float, *, rederive: bool) -> None:
    def edit(record: evidence.Evidence) -> None:
        for r in (*record.requests, *record.repeats):
            r.chunk_times = [t * factor for t in r.chunk_times]
        if rederive:
            evidence.rederive(record)

    _rewrite(run, start, edit)


def test_stretched_arrival_times_under_the_recorded_figures_are_refused(pytester: pytest.Pytester) -> None:
    """The issue's first case: start-2's tokens arrive 2x slower, its rates and medians left as recorded. It
    replayed PROMOTABLE at the recorded figures; now the evidence contradicts itself and is not judged, and the
    folder's earlier verdict does not survive."""
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    assert _replay(pytester, run).ret == 0 and _promotion(run)["promotable"] is True
    _stretch(run, 2, 2.0, rederive=False)
    result = _replay(pytester, run)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*evidence {run / 'start-2' / 'evidence.json'}: requests?code-publish-ladder?.decode_rate "
            f"is *, its token arrival times give *: the evidence contradicts itself*"
        ]
    )
    assert _promotion(run)["promotable"] is False


def test_the_verdict_judges_and_prints_the_medians_of_the_arrival_times(pytester: pytest.Pytester) -> None:
    """The same slowdown written consistently (every figure derived again): gate 7 fails on it, and what the
    verdict records is the medians of the arrival times, start-2 at half of what start-2 recorded first."""
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    starts = [evidence.read(run / f"start-{n}") for n in (1, 2)]
    recorded = Contract.model_validate(starts[0].contract.canonical, strict=False)
    before = reproduction.speed_figures(starts, recorded).medians  # each start's medians as gate 7 takes them
    _stretch(run, 2, 2.0, rederive=True)
    result = _replay(pytester, run)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "*NOT PROMOTABLE - contract mini-laguna-cpu; failed gates: fresh-start-reproduction*",
            f"*endpoint median {before[1] / 2:.2f} tok/s at start-2 vs {before[0]:.2f} at start-1*"
            f"paired figure start-2 / start-1 0.*",
        ]
    )
    assert _promotion(run)["endpoint_medians_tok_s"] == pytest.approx([before[0], before[1] / 2])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["target"]["kv_scales"].popitem(), "target.kv_scale_count is 8, its scales are 6"),
        (
            lambda t: t["draft"]["files"].update({"model.safetensors": "0" * 64}),
            "draft.digest * is not the digest of its file list",
        ),
        (
            lambda t: next(iter(t["target"]["kv_scales"].values())).update(k_scale=0.5),
            "target.kv_scale_digest * is not the digest of its scales",
        ),
    ],
    ids=["a-scale-dropped", "a-file-hash-changed", "a-scale-changed"],
)
def test_checkpoint_tables_that_contradict_themselves_are_refused(
    pytester: pytest.Pytester, edit, message: str
) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    tables = run / "checkpoint-tables.json"
    data = json.loads(tables.read_text())
    edit(data)
    tables.write_text(json.dumps(data))
    result = _replay(pytester, run)
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*checkpoint tables {tables}: {message}*: the copy contradicts itself*"])
    assert "PROMOTABLE at" not in result.stdout.str()


def test_a_bundle_recorded_before_starts_had_an_identity_is_not_promotable_with_one_reason(
    pytester: pytest.Pytester,
) -> None:
    """The committed bundle as the b70lab before start identities and the wider log scan recorded it: no
    identity, no nonce or process creation time in the audits, no exception or error-record findings."""
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)

    def as_before(record: evidence.Evidence) -> None:
        record.identity = None
        for audit in record.audits:
            audit.pop("start_nonce", None)
            audit.pop("process_started", None)
        for kind in ("exception", "error_record"):
            record.log_findings.pop(kind, None)

    for n in (1, 2):
        _rewrite(run, n, as_before)
    result = _replay(pytester, run)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            f"NOT PROMOTABLE (incomplete) - contract mini-laguna-cpu: start-1, start-2 of {run} "
            f"were recorded before each start had an identity (a nonce its ranks echo): nothing "
            f"shows that they were fresh starts; re-record the run"
        ]
    )
    assert "PROMOTABLE at" not in result.stdout.str()
