"""FP8 teacher snapshots: what a target-only run of the contract produced, one syrupy JSON file per prompt.

A snapshot holds the teacher's identity (the output digest of the derived teacher contract: models, engine
arguments, prompts and token count; KV dtype, engine version, model digest) and, per prompt, the token count and the SHA-256 of the token IDs and of the decoded text.
The exactness gate compares a candidate's evidence with these files; it never rewrites them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from syrupy.extensions.json import JSONSnapshotExtension

from .contract import Contract
from .evidence import Evidence, read_json

SNAPSHOT_TEST_FILE = "test_teacher.py"
RECORD_TEST = "test_record_teacher"
RECORD_COMMAND = "pytest -m teacher --snapshot-update --b70-contract {name}"


class TeacherSnapshotError(ValueError):
    """A teacher snapshot is missing or unreadable."""


def snapshot_extension(contract_name: str) -> type[JSONSnapshotExtension]:
    """syrupy's JSON extension with one folder per contract, so that contracts sharing a prompt set keep
    teachers of their own."""

    class PerContract(JSONSnapshotExtension):
        @classmethod
        def dirname(cls, *, test_location) -> str:
            return str(Path(super().dirname(test_location=test_location)) / contract_name)

    PerContract.__name__ = f"TeacherSnapshots[{contract_name}]"
    return PerContract


def snapshot_path(tests_dir: Path, contract_name: str, prompt_id: str) -> Path:
    """Where syrupy keeps the snapshot that `test_record_teacher[<prompt>]` writes for `contract_name`."""
    return (tests_dir / "__snapshots__" / Path(SNAPSHOT_TEST_FILE).stem / contract_name
            / f"{RECORD_TEST}[{prompt_id}].json")


def model_digest(evidence: Evidence) -> str:
    """The target checkpoint's identity: the mini manifest digest, or hub id @ revision, or the path."""
    t = evidence.target
    if t.manifest_digest:
        return t.manifest_digest
    return f"{t.ref}@{t.revision}" if t.revision else t.ref


def identity(contract: Contract, evidence: Evidence) -> dict[str, Any]:
    """The teacher this candidate (or teacher) run must be compared with."""
    teacher = contract.teacher()
    return {"contract": teacher.name, "output_digest": teacher.output_digest, "kind": "teacher",
            "kv_cache_dtype": teacher.engine.kv_cache_dtype, "engine_version": evidence.engine.vllm_version,
            "model_digest": model_digest(evidence)}


def payload(contract: Contract, evidence: Evidence, prompt_id: str) -> dict[str, Any]:
    """The snapshot of one prompt of a teacher run (what --snapshot-update writes)."""
    request = evidence.request(prompt_id)
    if request is None:
        raise TeacherSnapshotError(f"the teacher run has no request for prompt {prompt_id!r}")
    audit_dtypes = sorted({a.get("cache_config", {}).get("cache_dtype") for a in evidence.audits})
    spec = sorted({json.dumps(a.get("speculative_config")) for a in evidence.audits})
    return {"teacher": {**identity(contract, evidence), "engine_kv_cache_dtypes": audit_dtypes,
                        "engine_speculative_config": [json.loads(s) for s in spec]},
            "prompt_id": prompt_id, "token_count": len(request.token_ids),
            "token_ids_sha256": request.token_ids_sha256, "text_sha256": request.text_sha256}


def read(path: Path) -> dict[str, Any]:
    data = read_json(path, "teacher snapshot", TeacherSnapshotError)
    required = {"teacher", "prompt_id", "token_count", "token_ids_sha256", "text_sha256"}
    if not isinstance(data, dict) or not required <= set(data) or not isinstance(data["teacher"], dict):
        raise TeacherSnapshotError(f"teacher snapshot {path} lacks fields {sorted(required - set(data or {}))}")
    return data
