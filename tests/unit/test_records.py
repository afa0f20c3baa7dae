"""Sealed records (issue 35): every committed seal verifies and judges PROMOTABLE from its own files; any byte
edited, a file removed or added fails naming it; the writer refuses what must not be sealed and round-trips a
seal; reproduction compares a run with a seal (tokens, runtime fixes, speed) and refuses a drifted machine
before any start. The seal under repro/ is a real promotion of the embedded default (make gates, sealed with
`b70lab seal`): the fixture these tests edit copies of."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_b70lab.contract import project
from pytest_b70lab.contract import schema as contract_mod
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.judge import folder as judge
from pytest_b70lab.records import reproduce, store
from pytest_b70lab.records.seal import SIZE_LIMIT, patch_series, seal

REPO = Path(__file__).resolve().parents[2]
SEALS = store.listing(REPO / store.REPRO)
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"


def _edit_token(folder: Path, start: str, prompt_id: str, at: int) -> tuple[int, int]:
    """Every request of `prompt_id` in `start` gets token `at` changed, its hash kept consistent (the edit a
    forger makes); the evidence re-written with its digest. Returns (sealed token, new token)."""
    record = evidence.read(folder / start / "evidence.json")
    requests = record.every_request(prompt_id)
    old = requests[0].token_ids[at]
    for r in requests:
        r.token_ids[at] = old + 1
        r.token_ids_sha256 = evidence.sha256_ids(r.token_ids)
    evidence.write(record, folder / start)
    return old, old + 1


def _reseal_as_a_forger_would(folder: Path) -> None:
    """SEAL.json written again over edited files, consistent in every field (its name the folder's), in the
    seal's own format: what an unsigned seal cannot tell from a real one."""
    files = store.file_digests(folder)
    document = {**store.read(folder).document, "files": files, "name": folder.name}
    if document["version"] == 1:
        document["digest"] = store.overall_digest(files)
    else:
        document["field_digests"] = store.field_digests(document)
        document["digest"] = store.content_digest(document)
    (folder / store.SEAL_FILE).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


# The seal these tests edit copies of: a real promotion of the unquantized lane, sealed on an Intel Xeon before a
# start recorded its CPU's family, stepping and cores, so that its host class is never the host's that runs them.
EDITED_SEAL = "mini-laguna-cpu-20261204b"


@pytest.fixture
def sealed(tmp_path: Path) -> Path:
    """A copy of the committed seal EDITED_SEAL, to edit."""
    (chosen,) = [s for s in SEALS if s.name == EDITED_SEAL]
    return Path(shutil.copytree(chosen.folder, tmp_path / chosen.folder.name))


def test_the_embedded_default_has_a_current_seal_and_no_current_seal_is_stale() -> None:
    """A change that moves the source state (a patch, the runtime fixes, vLLM, torch) or the embedded default's
    contract seals a fresh gates run of it (`b70lab seal RUN --name NAME --supersedes OLD`), or this fails."""
    from pytest_b70lab.contract.defaults import DEFAULT_CONTRACT

    current = store.current(SEALS)
    default = contract_mod.load(DEFAULT_CONTRACT)
    assert [s.name for s in current if s.contract_digest() == default.digest], (
        f"no current seal of the embedded default {default.name} (digest {default.digest[:16]}) under repro/: "
        "run `make gates`, then `b70lab seal RUN --name NAME --supersedes` the seal it replaces"
    )
    stale = {s.name: drift for s in current if (drift := reproduce.source_drift(s))}
    assert stale == {}, f"current seals no longer of this source state (seal a new run, --supersedes them): {stale}"


def test_a_superseded_seal_is_not_current_and_a_moved_source_is_named(sealed: Path, tmp_path: Path) -> None:
    newer = seal(sealed, "newer", sealed / store.SNAPSHOTS, root=tmp_path / "records", supersedes=str(sealed))
    seals = [store.read(sealed), store.read(newer)]
    assert store.superseded(seals)[sealed.name] == "newer"
    assert [s.name for s in store.current(seals)] == ["newer"]
    record_file = newer / store.RECORD_FILE
    record = json.loads(record_file.read_text())
    record["source"]["vllm"] = "0.1.0"
    record["source"]["patches"] = record["source"]["patches"][1:]
    record_file.write_text(json.dumps(record))
    drift = reproduce.source_drift(store.read(newer))
    assert drift[0].startswith("vllm ") and drift[0].endswith(", sealed 0.1.0"), drift
    assert any(line.startswith("patch 0001-") and "in this checkout, not in the seal" in line for line in drift)


def test_every_committed_seal_holds_and_judges_promotable() -> None:
    assert SEALS, "make test verifies the committed seals: there must be one"
    for s in SEALS:
        assert store.verify(s.folder) == [], s.folder
        decision = store.judged(s.folder)  # under the seal's own contract, whatever the repository's says now
        assert decision.promotable, judge.headline_line(decision, s.folder)
        assert s.document["bytes"] <= SIZE_LIMIT, f"{s.name}: {s.document['bytes']} bytes, over {SIZE_LIMIT} bytes"
        record = s.record()
        assert record["contract"]["digest"] == contract_mod.load(s.folder / store.CONTRACT_FILE).digest
        assert all(isinstance(ranks, dict) and ranks for ranks in record["source"]["runtime_fixes"].values())


def test_any_byte_edited_fails_naming_the_file(sealed: Path) -> None:
    files = sorted(store.read(sealed).files)
    assert len(files) >= 8, files
    for relative in files:
        path = sealed / relative
        original = path.read_bytes()
        at = len(original) // 2
        path.write_bytes(original[:at] + bytes([original[at] ^ 0x01]) + original[at + 1 :])
        problems = store.verify(sealed)
        assert problems == [
            f"{path}: edited (sha256 {store.sha256_file(path)[:16]}..., sealed "
            f"{store.read(sealed).files[relative][:16]}...)"
        ], relative
        path.write_bytes(original)
    assert store.verify(sealed) == []


def test_a_missing_an_added_file_and_an_edited_seal_file_are_named(sealed: Path) -> None:
    (sealed / "prompts.jsonl").unlink()
    (sealed / "start-1" / "notes.txt").write_text("added later\n")
    problems = store.verify(sealed)
    assert problems[0].startswith(f"{sealed / 'prompts.jsonl'}: missing")
    assert problems[1] == f"{sealed / 'start-1' / 'notes.txt'}: added after sealing (not in SEAL.json)"
    document = json.loads((sealed / store.SEAL_FILE).read_text())
    document["files"]["prompts.jsonl"] = "0" * 64
    (sealed / store.SEAL_FILE).write_text(json.dumps(document))
    assert any("SEAL.json itself was edited" in p for p in store.verify(sealed))
    (sealed / store.SEAL_FILE).write_text("{not json")
    assert store.verify(sealed)[0].endswith(
        "is not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)): the file is corrupted"
    )


@pytest.fixture
def sealed_v2(sealed: Path, tmp_path: Path) -> Path:
    """The newest committed seal sealed again in today's format (2: all of SEAL.json under its digest)."""
    return seal(sealed, "again", sealed / store.SNAPSHOTS, root=tmp_path / "records")


def _edit_seal_file(folder: Path, **fields: object) -> None:
    document = json.loads((folder / store.SEAL_FILE).read_text())
    document.update(fields)
    (folder / store.SEAL_FILE).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize(
    "field, value",
    [
        ("headline", "PROMOTABLE at 999.00 / 999.00 tok/s median (start-1 / start-2)"),
        ("sealed_at", "2027-01-01T00:00:00+00:00"),
        ("supersedes", "mini-laguna-cpu-20261204"),
        ("bytes", 1),
    ],
)
def test_an_edited_field_of_a_format_2_seal_file_is_named(sealed_v2: Path, field: str, value: object) -> None:
    assert store.read(sealed_v2).metadata_sealed and store.verify(sealed_v2) == []
    _edit_seal_file(sealed_v2, **{field: value})
    (problem,) = store.verify(sealed_v2)
    assert problem.endswith(f"SEAL.json was its {field} edited after sealing"), problem


def test_a_format_2_seal_names_a_renamed_folder_and_a_claimed_contract(sealed_v2: Path, tmp_path: Path) -> None:
    """Name and contract are checked against the files too: a SEAL.json re-digested after the edit still fails
    on them (and only a signature would catch the rest)."""
    moved = Path(shutil.move(sealed_v2, tmp_path / "renamed"))
    assert store.verify(moved) == [f"{moved / store.SEAL_FILE}: name 'again' is not the folder's, 'renamed'"]
    assert store.read(moved).name == "renamed", "a reader takes the folder's name, never the document's"
    document = json.loads((moved / store.SEAL_FILE).read_text())
    document["name"], document["contract"] = "renamed", {**document["contract"], "digest": "0" * 64}
    document["field_digests"] = store.field_digests(document)
    document["digest"] = store.content_digest(document)
    (moved / store.SEAL_FILE).write_text(json.dumps(document))
    loaded = contract_mod.load(moved / store.CONTRACT_FILE).digest
    assert store.verify(moved) == [
        f"{moved / store.SEAL_FILE}: contract digest 0000000000000000... is not contract.toml's, {loaded[:16]}..."
    ]


def test_records_verify_names_a_headline_its_files_do_not_judge_to(sealed_v2: Path) -> None:
    document = json.loads((sealed_v2 / store.SEAL_FILE).read_text())
    said = document["headline"]
    document["headline"] = said.replace("PROMOTABLE at", "PROMOTABLE at 1")
    document["field_digests"] = store.field_digests(document)
    document["digest"] = store.content_digest(document)
    (sealed_v2 / store.SEAL_FILE).write_text(json.dumps(document))
    (problem,) = store.verify(sealed_v2)  # record.json still says the sealed headline
    assert problem.startswith(f"{sealed_v2 / store.RECORD_FILE}: result.headline: record.json says {said[:40]!r}"[:-1])
    assert "the sealed evidence says 'PROMOTABLE at 1 " in problem
    record_file = sealed_v2 / store.RECORD_FILE
    record_file.write_text(record_file.read_text().replace(said, document["headline"]))
    _reseal_as_a_forger_would(sealed_v2)
    assert store.verify(sealed_v2) == []  # consistent: only the verdict the files judge to can tell
    out = subprocess.run(
        [sys.executable, "-m", "pytest_b70lab.cli", "records", "verify", str(sealed_v2)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "SEAL.json: headline 'PROMOTABLE at 1" in out.stdout and "is not what its files judge to" in out.stdout


@pytest.mark.parametrize(
    "path, value",
    [(("source", "vllm"), "0.99.0"), (("machine", "cpu", "model"), "Another CPU"), (("machine", "isa"), "avx2")],
)
def test_a_record_that_says_other_than_its_evidence_is_named(
    sealed_v2: Path, path: tuple[str, ...], value: str
) -> None:
    """record.json is derived again from the sealed evidence on verify: a version or host edited there, SEAL.json
    re-digested over it as a forger would, is named by its field."""
    record_file = sealed_v2 / store.RECORD_FILE
    record = json.loads(record_file.read_text())
    leaf = record
    for key in path[:-1]:
        leaf = leaf[key]
    was, leaf[path[-1]] = leaf[path[-1]], value
    record_file.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    _reseal_as_a_forger_would(sealed_v2)
    assert store.verify(sealed_v2) == [
        f"{record_file}: {'.'.join(path)}: record.json says {value!r}, the sealed evidence says {was!r}"
    ]


def test_a_format_1_seal_still_reads_and_says_its_metadata_is_not_sealed(sealed: Path) -> None:
    assert not store.read(sealed).metadata_sealed and store.verify(sealed) == []
    out = subprocess.run(
        [sys.executable, "-m", "pytest_b70lab.cli", "records", "verify", str(sealed)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0 and "holds; PROMOTABLE" in out.stdout, out.stdout + out.stderr
    assert store.METADATA_NOT_SEALED in out.stdout


def test_a_seal_reseals_as_itself_and_names_are_never_reused(sealed: Path, tmp_path: Path) -> None:
    """A seal is a run folder: sealing it again (its own teacher snapshots) gives the same files, but for the
    record's patch series, which is the checkout's at sealing time (this one may hold patches added since)."""
    root = tmp_path / "records"
    again = seal(sealed, "again", sealed / store.SNAPSHOTS, root=root)
    assert store.verify(again) == []
    mine, theirs = store.read(again), store.read(sealed)
    assert {k: v for k, v in mine.files.items() if k != store.RECORD_FILE} == {
        k: v for k, v in theirs.files.items() if k != store.RECORD_FILE
    }
    new, old = mine.record(), theirs.record()
    assert new["source"].pop("patches") == patch_series(REPO / "patches")
    old["source"].pop("patches")
    assert new == old
    with pytest.raises(store.SealError, match="exists: a sealed record is never overwritten"):
        seal(sealed, "again", sealed / store.SNAPSHOTS, root=root)
    with pytest.raises(store.SealError, match="letters, digits"):
        seal(sealed, "../up", sealed / store.SNAPSHOTS, root=root)


def test_evidence_without_runtime_fixes_and_a_failing_run_are_refused(sealed: Path, tmp_path: Path) -> None:
    snapshots = REPO / "tests" / "gates" / "__snapshots__"
    old = Path(shutil.copytree(BUNDLE, tmp_path / "old"))
    for start in ("start-1", "start-2"):  # as evidence from before b70lab recorded the runtime fixes reads
        record = evidence.read(old / start / "evidence.json")
        for audit in record.audits:
            del audit["runtime_fixes"]
        evidence.write(record, old / start)
    with pytest.raises(store.SealError, match=r"no runtime fixes recorded for start-1 rank 0, start-1 rank 1"):
        seal(old, "old", snapshots, root=tmp_path / "records")
    _edit_token(sealed, "start-2", "json-2", 5)
    with pytest.raises(store.SealError, match="is not a promotion to seal: NOT PROMOTABLE"):
        seal(sealed, "broken", sealed / store.SNAPSHOTS, root=tmp_path / "records")
    assert not (tmp_path / "records" / "broken").exists() and not list((tmp_path / "records").glob(".sealing-*"))


def test_a_run_reproduces_its_own_seal_and_not_an_edited_one(sealed: Path, tmp_path: Path) -> None:
    contract = contract_mod.load(sealed / store.CONTRACT_FILE)
    same = reproduce.judge(sealed, sealed, contract)
    assert same.reproduced and same.figures["ratio"] == 1.0, same.line()
    assert same.line().startswith(f"REPRODUCED repro/{sealed.name} - tokens identical on 6/6 prompts; speed 1.000")
    run = Path(shutil.copytree(sealed, tmp_path / "run"))
    for start in ("start-1", "start-2"):
        old, new = _edit_token(run, start, "json-2", 3)
        record = evidence.read(run / start / "evidence.json")
        record.audits[1]["runtime_fixes"] = {**record.audits[1]["runtime_fixes"], "cpu_router_sigmoid": "disabled"}
        evidence.write(record, run / start)
    differs = reproduce.judge(sealed, run, contract)
    assert not differs.reproduced
    assert differs.reasons[0] == f"prompt json-2: token 3 is {new}, sealed {old}", differs.reasons
    assert any(
        "start-1 rank 1: runtime fixes" in r and "'cpu_router_sigmoid': 'disabled'" in r for r in differs.reasons
    )


def _slowed(sealed: Path, tmp_path: Path, factor: float, passes: set[int]) -> Path:
    """A copy of the sealed run whose counted measurements of the given passes decode `factor` times slower,
    every derived figure written again as the harness would have (a consistent editor)."""
    run = Path(shutil.copytree(sealed, tmp_path / f"slowed-{factor}-{min(passes)}"))
    for start in ("start-1", "start-2"):
        record = evidence.read(run / start / "evidence.json")
        for (pass_index, _pid), (_m, r) in record.counted().items():
            if pass_index in passes:
                r.chunk_times = [r.chunk_times[0] + (t - r.chunk_times[0]) * factor for t in r.chunk_times]
        evidence.write(evidence.rederive(record), run / start)
    return run


@pytest.mark.parametrize("passes", [{1, 2, 3}, {2, 3}], ids=["every-pass", "passes-2-3"])
def test_a_slower_run_is_not_reproduced_naming_the_speed(sealed: Path, tmp_path: Path, passes: set[int]) -> None:
    """1.5x slower in every pass, or in passes 2 and 3 only (which a comparison of pass 1 alone would miss):
    NOT REPRODUCED, naming the speed and its interval; its tokens are the sealed ones."""
    contract = contract_mod.load(sealed / store.CONTRACT_FILE)
    result = reproduce.judge(sealed, _slowed(sealed, tmp_path, 1.5, passes), contract)
    assert not result.reproduced
    assert result.figures["identical"] == 6 and result.figures["high"] < 1
    assert any(r.startswith("speed 0.") and "of the sealed" in r and "1 +/- 0.2" in r for r in result.reasons), (
        result.reasons
    )


def test_on_another_host_class_tokens_and_fixes_are_judged_and_speed_is_not_compared(
    sealed: Path, tmp_path: Path
) -> None:
    """A run 1.5x slower on another CPU than the seal's: its tokens and fixes are the sealed ones, so it
    reproduces, and its line says why the speed was not compared; a changed token still fails it there."""
    contract = contract_mod.load(sealed / store.CONTRACT_FILE)
    run = _slowed(sealed, tmp_path, 1.5, {1, 2, 3})
    for start in ("start-1", "start-2"):
        record = evidence.read(run / start / "evidence.json")
        assert record.host is not None
        record.host.update(model="AMD EPYC", amx=False)
        evidence.write(record, run / start)
    result = reproduce.judge(sealed, run, contract)
    assert result.reproduced, result.reasons
    assert result.line() == (
        f"REPRODUCED repro/{sealed.name} - tokens identical on 6/6 prompts; speed not compared: sealed on Intel(R) "
        "Xeon(R) Processor (AVX-512, AMX), FP8 attention native, this run on AMD EPYC (AVX-512, no AMX), FP8 "
        "attention native (host classes differ: model: 'Intel(R) Xeon(R) Processor' vs 'AMD EPYC'; amx: True vs False)"
    )
    _edit_token(run, "start-1", "json-2", 3)
    assert not reproduce.judge(sealed, run, contract).reproduced


def test_a_seal_resealed_with_another_teacher_is_not_reproduced(sealed: Path, tmp_path: Path) -> None:
    """The seal's oracle changed (one token of one teacher snapshot, its hash kept consistent) and SEAL.json
    written again: the run that was sealed no longer reproduces it, naming the prompt and the token."""
    from pytest_b70lab.judge import teacher

    contract = contract_mod.load(sealed / store.CONTRACT_FILE)
    edited = Path(shutil.copytree(sealed, tmp_path / "edited"))
    path = teacher.snapshot_path(edited / store.SNAPSHOTS, contract, "prose-3")
    snapshot = json.loads(path.read_text())
    snapshot["token_ids"][11] += 1
    snapshot["token_ids_sha256"] = evidence.sha256_ids(snapshot["token_ids"])
    path.write_text(json.dumps(snapshot, indent=2, sort_keys=True) + "\n")
    _reseal_as_a_forger_would(edited)
    result = reproduce.judge(edited, sealed, contract)
    assert not result.reproduced
    assert result.reasons == [
        f"prompt prose-3: start-1 is not the sealed teacher's output (token 11 is {snapshot['token_ids'][11] - 1}, "
        f"the sealed teacher's {snapshot['token_ids'][11]})"
    ], result.reasons


def test_a_drifted_checkout_is_named_patch_by_patch(sealed: Path, tmp_path: Path) -> None:
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    changed = sorted((tmp_path / "patches").glob("*.patch"))[0]  # one the seal holds
    changed.write_text(changed.read_text() + "\n-- \nedited\n")
    (tmp_path / "patches" / "9999-extra.patch").write_text("From 0 Mon Sep 17 00:00:00 2001\n")
    seal_read = store.read(sealed)
    record = seal_read.record()
    contract = contract_mod.load(sealed / store.CONTRACT_FILE)
    project.use_root(tmp_path)
    try:
        drift = reproduce.machine_drift(seal_read, contract, record["models"], environ={})
    finally:
        project.use_root(REPO)
    assert f"patch {changed.name}: changed" in " | ".join(drift), drift
    assert "patch 9999-extra.patch: in this checkout, not in the seal" in drift
    assert not [d for d in drift if d.startswith(("target model", "draft model"))], drift


def _session(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)  # the default cache (B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab), as a user's session
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gates", "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_header_says_before_any_start_whether_the_speed_will_be_compared(sealed: Path, tmp_path: Path) -> None:
    """The committed seal was recorded before a start recorded its CPU's family, stepping and cores: a class of its
    own, so on any host today the header says the speed will not be compared, and why (collection only)."""
    env = dict(os.environ)  # the default cache (B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab), as a user's session
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gates", "-p", "no:cacheprovider", "--co", str(REPO / "tests" / "gates")]
        + [f"--b70-reproduce={sealed}", "--b70-accept-drift", f"--b70-run-dir={tmp_path / 'run'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    note = next(line for line in done.stdout.splitlines() if line.startswith("b70lab: reproducing "))
    assert note.startswith(
        f"b70lab: reproducing repro/{sealed.name}: tokens, teacher and fixes judged; speed not compared: sealed on "
        "Intel(R) Xeon(R) Processor (AVX-512, AMX), FP8 attention native, this host on "
    ), note
    assert (
        "(host classes differ: " in note
        and "stepping: None vs " in note
        and not (tmp_path / "run" / "start-1").exists()
    )


def test_a_replay_reproduces_the_seal_and_not_a_resealed_edit(sealed: Path, tmp_path: Path) -> None:
    """As a lab engineer runs it: the seal's run replayed against the seal, then against a copy re-sealed after
    its recorded tokens and teacher were edited (the copy's SEAL.json written again over the edited files)."""
    gates = str(REPO / "tests" / "gates")
    ok = _session(gates, f"--b70-evidence={sealed}", f"--b70-reproduce={sealed}")
    assert ok.returncode == 0 and f"REPRODUCED repro/{sealed.name} - tokens identical on 6/6" in ok.stdout, ok.stdout[
        -3000:
    ]
    edited = Path(shutil.copytree(sealed, tmp_path / "edited"))
    for start in ("start-1", "start-2"):
        _edit_token(edited, start, "json-2", 7)
    _reseal_as_a_forger_would(edited)
    assert store.verify(edited) == []
    no = _session(gates, f"--b70-evidence={sealed}", f"--b70-reproduce={edited}")
    assert no.returncode == 1, no.stdout[-3000:]
    assert f"NOT REPRODUCED repro/{edited.name}: prompt json-2: token 7 is" in no.stdout, no.stdout[-3000:]
    assert json.loads((sealed / reproduce.REPORT_FILE).read_text())["reproduced"] is False


def test_a_changed_patch_refuses_the_session_before_any_start(sealed: Path, tmp_path: Path) -> None:
    """A checkout whose patches/ differs from the sealed series (the session's root folder is searched first)."""
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    changed = sorted((tmp_path / "patches").glob("*.patch"))[0]
    changed.write_text(changed.read_text().replace("Subject:", "Subject: [edited]", 1))
    run_dir = tmp_path / "run"
    refused = _session(
        f"--rootdir={tmp_path}",
        "-c",
        str(REPO / "pyproject.toml"),
        str(REPO / "tests" / "gates"),
        f"--b70-reproduce={sealed}",
        f"--b70-run-dir={run_dir}",
    )
    assert refused.returncode == 4, refused.stdout[-2000:] + refused.stderr[-2000:]
    said = refused.stderr + refused.stdout
    assert "this machine is not the sealed one, nothing was started" in said, said[-2000:]
    assert f"patch {changed.name}: changed" in said and "--b70-accept-drift" in said
    assert not (run_dir / "start-1").exists()
