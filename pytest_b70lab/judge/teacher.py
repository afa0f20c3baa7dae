"""FP8 teacher snapshots: what a target-only run produced, one syrupy JSON file per prompt.

The teacher belongs to the target, not to a candidate: its identity is what decides target-only output
(the teacher contract's output digest: target, engine arguments, prompts, token count; the target
checkpoint's own digest; KV dtype; engine version), never the draft. Snapshots live in a folder named by
that identity, so every candidate that differs only in its draft (a DFlash re-sweep) is judged against the
same recorded teacher. A snapshot keeps the teacher's token IDs and text beside their hashes, so that a
mismatch can name the first differing token. The exactness gate compares evidence with these files; it
never rewrites them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contract.schema import Contract
from ..digests import text_sha256
from ..errors import LabError
from ..evidence.record import Evidence, read_json, sha256_ids

if TYPE_CHECKING:
    from .snapshots import JSONSnapshotExtension

SNAPSHOT_TEST_FILE = "test_teacher.py"
RECORD_TEST = "test_record_teacher"
RECORD_COMMAND = "pytest -m teacher --snapshot-update --b70-contract {name}"


class TeacherSnapshotError(LabError, ValueError):
    """A teacher snapshot is missing or unreadable."""


def folder_name(contract: Contract) -> str:
    """The snapshot folder of a contract's teacher: named by the teacher's output digest, which any two
    candidates differing only in their draft share."""
    return f"teacher-{contract.teacher().output_digest[:16]}"


def snapshot_extension(contract: Contract) -> type[JSONSnapshotExtension]:
    """syrupy's JSON extension writing into the contract's teacher folder."""
    from .snapshots import json_extension_in

    return json_extension_in(folder_name(contract), "TeacherSnapshots")


def snapshot_path(snapshots_dir: Path, contract: Contract, prompt_id: str) -> Path:
    """Where syrupy keeps the snapshot that `test_record_teacher[<prompt>]` writes for this contract's teacher
    (`snapshots_dir`: tests/gates/__snapshots__, or a sweep's folder of the teachers it recorded)."""
    return snapshots_dir / folder_name(contract) / Path(SNAPSHOT_TEST_FILE).stem / f"{RECORD_TEST}[{prompt_id}].json"


def write_snapshots(snapshots_dir: Path, contract: Contract, evidence: Evidence, prompt_ids: list[str]) -> list[Path]:
    """A teacher run's snapshots written outside the repository (a sweep's own teachers), the same payload
    syrupy records with --snapshot-update; returns the files written."""
    written = []
    for prompt_id in prompt_ids:
        path = snapshot_path(snapshots_dir, contract, prompt_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload(contract, evidence, prompt_id), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        written.append(path)
    return written


def model_digest(evidence: Evidence) -> str:
    """The target checkpoint's identity (never the draft's): the digest of the target folder's files, or
    hub id @ revision where the folder was not read."""
    t = evidence.target
    if t.digest:
        return t.digest
    return f"{t.ref}@{t.revision}" if t.revision else t.ref


def identity(contract: Contract, evidence: Evidence) -> dict[str, Any]:
    """The teacher this candidate (or teacher) run must be compared with."""
    teacher = contract.teacher()
    return {
        "recorded_by": teacher.name,
        "output_digest": teacher.output_digest,
        "kind": "teacher",
        "kv_cache_dtype": teacher.engine.kv_cache_dtype,
        "engine_version": evidence.engine.vllm_version,
        "model_digest": model_digest(evidence),
    }


def payload(contract: Contract, evidence: Evidence, prompt_id: str) -> dict[str, Any]:
    """The snapshot of one prompt of a teacher run (what --snapshot-update writes)."""
    request = evidence.request(prompt_id)
    if request is None:
        raise TeacherSnapshotError(f"the teacher run has no request for prompt {prompt_id!r}")
    audit_dtypes = sorted({a.get("cache_config", {}).get("cache_dtype") for a in evidence.audits})
    spec = sorted({json.dumps(a.get("speculative_config")) for a in evidence.audits})
    return {
        "teacher": {
            **identity(contract, evidence),
            "engine_kv_cache_dtypes": audit_dtypes,
            "engine_speculative_config": [json.loads(s) for s in spec],
        },
        "prompt_id": prompt_id,
        "token_count": len(request.token_ids),
        "token_ids_sha256": request.token_ids_sha256,
        "text_sha256": request.text_sha256,
        "token_ids": list(request.token_ids),
        "text": request.text,
    }


def read(path: Path) -> dict[str, Any]:
    data = read_json(path, "teacher snapshot", TeacherSnapshotError)
    required = {"teacher", "prompt_id", "token_count", "token_ids_sha256", "text_sha256"}
    if not isinstance(data, dict) or not required <= set(data) or not isinstance(data["teacher"], dict):
        raise TeacherSnapshotError(f"teacher snapshot {path} lacks fields {sorted(required - set(data or {}))}")
    # The recorded hashes pin the recorded tokens: an edited token (or text) is a damaged snapshot, not a
    # candidate that disagrees with its teacher.
    ids, text = data.get("token_ids"), data.get("text")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TeacherSnapshotError(f"teacher snapshot {path}: token_ids is not a list of integers")
        if sha256_ids(ids) != data["token_ids_sha256"] or len(ids) != data["token_count"]:
            raise TeacherSnapshotError(
                f"teacher snapshot {path}: its token_ids do not match its token_ids_sha256 "
                f"and token_count: the snapshot was edited after it was recorded"
            )
    if text is not None and (not isinstance(text, str) or text_sha256(text) != data["text_sha256"]):
        raise TeacherSnapshotError(
            f"teacher snapshot {path}: its text does not match its text_sha256: the snapshot "
            f"was edited after it was recorded"
        )
    return data
