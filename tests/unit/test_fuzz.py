"""Bad input, generated: every damaged contract, evidence file, teacher snapshot or prompt file is a clear
error of the project's own kind naming the file (and the field or line), never a traceback from deep inside.

The inputs start from the shipped files (the mini's contract, the recorded evidence bundle, the committed
teacher snapshots, the pinned prompt set) and hypothesis breaks one thing in each: a field of the wrong
type, a missing or unknown field, a truncation at any byte, a flipped byte, another schema version, an
edited token or identity field."""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_b70lab.contract import schema as contract_mod
from pytest_b70lab.contract.schema import Contract, ContractError
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.judge import exactness, teacher

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "fixtures" / "contracts" / "mini-laguna-cpu.toml"
BUNDLE_START = REPO / "fixtures" / "evidence" / "mini-laguna-cpu" / "start-1" / "evidence.json"
SNAPSHOTS = sorted((REPO / "tests" / "gates" / "__snapshots__").rglob("*.json"))
# How many examples: the profile of the repository conftest.py (ci / dev / thorough).
EXAMPLES = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

RAW_CONTRACT = tomllib.loads(CONTRACT.read_text())
EVIDENCE_BYTES = BUNDLE_START.read_bytes()


def _leaves(tree: dict, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _leaves(value, (*prefix, key))
        else:
            out.append(((*prefix, key), value))
    return out


CONTRACT_LEAVES = _leaves(RAW_CONTRACT)


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _wrong_type(value: Any) -> st.SearchStrategy:
    """A value that no strict schema field of `value`'s kind accepts."""
    if isinstance(value, bool):
        return st.sampled_from(["yes", 1, [True]])
    if isinstance(value, (int, float)):
        return st.sampled_from(["12", [1, 2], {"n": 1}, True])
    if isinstance(value, str):
        return st.sampled_from([12, 1.5, ["a"], {"s": "x"}, False])
    if isinstance(value, list):
        return st.sampled_from(["not a list", 7, {"k": 1}])
    return st.just(object())


def _load_written(tmp_path: Path, raw: dict) -> Contract:
    path = tmp_path / "fuzzed.toml"
    path.write_text(tomli_w.dumps(raw))
    return contract_mod.load(path)


@EXAMPLES
@given(data=st.data())
def test_a_contract_with_one_field_of_the_wrong_type_names_the_file_and_the_field(tmp_path: Path, data) -> None:
    path, value = data.draw(st.sampled_from(CONTRACT_LEAVES), label="field")
    raw = copy.deepcopy(RAW_CONTRACT)
    _set(raw, path, data.draw(_wrong_type(value), label="wrong value"))
    with pytest.raises(ContractError) as err:
        _load_written(tmp_path, raw)
    message = str(err.value)
    assert str(tmp_path / "fuzzed.toml") in message
    assert ".".join(path) in message, message


@EXAMPLES
@given(data=st.data())
def test_a_contract_missing_a_field_or_with_an_unknown_one_is_a_contract_error(tmp_path: Path, data) -> None:
    raw = copy.deepcopy(RAW_CONTRACT)
    path, _ = data.draw(st.sampled_from(CONTRACT_LEAVES), label="field")
    if data.draw(st.booleans(), label="add instead of remove"):
        extra = data.draw(st.from_regex(r"[a-z]{3,12}", fullmatch=True), label="unknown key")
        _set(raw, (*path[:-1], f"x_{extra}"), 1)
        expected = f"x_{extra}"
    else:
        parent = raw
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        expected = None
    try:
        loaded = _load_written(tmp_path, raw)
    except ContractError as e:
        assert str(tmp_path / "fuzzed.toml") in str(e)
        if expected:
            assert expected in str(e)
        return
    # Removing a field that has a default is allowed: then the contract equals the default's contract.
    assert expected is None
    assert isinstance(loaded, Contract)


@EXAMPLES
@given(cut=st.integers(min_value=0, max_value=len(EVIDENCE_BYTES) - 1))
def test_truncated_evidence_is_an_evidence_error_naming_the_file(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "evidence.json"
    path.write_bytes(EVIDENCE_BYTES[:cut])
    if not EVIDENCE_BYTES[cut:].strip():
        return  # only trailing whitespace was cut: the same evidence
    with pytest.raises(evidence.EvidenceError, match=str(path).replace(".", r"\.")):
        evidence.read(path)


@EXAMPLES
@given(at=st.integers(min_value=0, max_value=len(EVIDENCE_BYTES) - 1), bit=st.integers(min_value=0, max_value=7))
def test_a_flipped_bit_in_evidence_is_an_evidence_error_naming_the_file(tmp_path: Path, at: int, bit: int) -> None:
    data = bytearray(EVIDENCE_BYTES)
    data[at] ^= 1 << bit
    path = tmp_path / "evidence.json"
    path.write_bytes(bytes(data))
    try:
        evidence.read(path)
    except evidence.EvidenceError as e:
        assert str(path) in str(e)
        return
    # Only a flip that changes nothing the digest covers may pass: JSON whitespace (space <-> tab, etc.).
    assert json.loads(bytes(data)) == json.loads(EVIDENCE_BYTES)


@pytest.mark.parametrize("version", [0, 4, "2", None])
def test_evidence_of_another_schema_version_names_the_version_and_the_file(tmp_path: Path, version) -> None:
    raw = json.loads(EVIDENCE_BYTES)
    raw["version"] = version
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(evidence.EvidenceError, match=f"has version {version!r}; this b70lab reads versions 1, 2, 3"):
        evidence.read(path)


@EXAMPLES
@given(snapshot=st.sampled_from(SNAPSHOTS), data=st.data())
def test_an_edited_teacher_token_is_a_damaged_snapshot(tmp_path: Path, snapshot: Path, data) -> None:
    raw = json.loads(snapshot.read_text())
    where = data.draw(st.integers(min_value=0, max_value=len(raw["token_ids"]) - 1), label="token")
    raw["token_ids"][where] += data.draw(st.integers(min_value=1, max_value=50_000), label="delta")
    path = tmp_path / snapshot.name
    path.write_text(json.dumps(raw))
    with pytest.raises(teacher.TeacherSnapshotError, match="edited after it was recorded") as err:
        teacher.read(path)
    assert str(path) in str(err.value)


# What the gate judges a teacher by (`recorded_by`, the teacher contract's name, is a label it does not judge).
IDENTITY_FIELDS = (
    "output_digest",
    "model_digest",
    "kv_cache_dtype",
    "engine_version",
    "kind",
    "engine_speculative_config",
    "engine_kv_cache_dtypes",
)


@EXAMPLES
@given(field=st.sampled_from(IDENTITY_FIELDS), junk=st.text(min_size=1, max_size=20))
def test_an_edited_teacher_identity_fails_the_exactness_gate_naming_the_snapshot(field: str, junk: str) -> None:
    """The identity says which teacher recorded the snapshot: an edited one is a snapshot of another
    teacher, which the gate refuses, naming the file."""
    run = _RECORDED
    start = run["starts"][0]
    prompt = start.requests[0].prompt_id
    path = teacher.snapshot_path(REPO / "tests" / "gates" / "__snapshots__", run["contract"], prompt)
    snap = teacher.read(path)
    value = snap["teacher"][field]
    snap["teacher"][field] = (
        value + junk if isinstance(value, str) else [*value, junk] if field == "engine_speculative_config" else [junk]
    )
    verdict = exactness.teacher_exactness(start, prompt, run["contract"], snap, str(path))
    assert not verdict.passed
    assert str(path) in verdict.explain()


def _recorded() -> dict:
    from pytest_b70lab.evidence.run_folder import read_starts

    starts = read_starts(BUNDLE_START.parent.parent)
    return {"starts": starts, "contract": Contract.model_validate(starts[0].contract.canonical, strict=False)}


_RECORDED = _recorded()


@EXAMPLES
@given(data=st.data())
def test_a_prompt_file_with_another_sha256_or_a_bad_line_names_the_file(tmp_path: Path, data) -> None:
    contract = contract_mod.load("mini-laguna-cpu")
    original = contract_mod.prompts_path(contract).read_bytes()
    lines = original.decode().splitlines()
    damage = data.draw(st.sampled_from(["edit", "bad-json", "missing-field", "duplicate"]), label="damage")
    i = data.draw(st.integers(min_value=0, max_value=len(lines) - 1), label="line")
    if damage == "edit":
        lines[i] = lines[i].replace('"prompt"', '"prompt" ', 1) if '"prompt"' in lines[i] else lines[i] + " "
    elif damage == "bad-json":
        lines[i] = lines[i][: data.draw(st.integers(min_value=0, max_value=len(lines[i]) - 1), label="cut")]
    elif damage == "missing-field":
        record = json.loads(lines[i])
        required = sorted(k for k in record if contract_mod.Prompt.model_fields[k].is_required())
        record.pop(data.draw(st.sampled_from(required), label="key"))
        lines[i] = json.dumps(record)
    else:
        lines.append(lines[i])
    changed = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(changed)
    pinned = contract.model_copy(
        update={
            "prompts": contract.prompts.model_copy(
                update={
                    "file": str(path),
                    "sha256": hashlib.sha256(changed).hexdigest() if damage != "edit" else contract.prompts.sha256,
                }
            )
        }
    )
    with pytest.raises(ContractError) as err:
        contract_mod.load_prompts(pinned)
    assert str(path) in str(err.value)
