"""record.json, derived from a sealed run's evidence: what the seal says of the source state (vLLM, torch, every
rank's runtime fixes), the launcher, the machine and its FP8 path, the models, the oracle and the result. Written
when a run is sealed, and derived again from the sealed evidence whenever a seal is verified, so that record.json
can only say what its evidence says (the patch series excepted: it is files of the checkout, named by digest)."""

from __future__ import annotations

from typing import Any

from ..contract import schema as contract_mod
from ..evidence import record as evidence
from ..evidence import run_folder
from ..evidence.record import Evidence
from ..judge import teacher
from .layout import CONTRACT_FILE, SNAPSHOTS

PATHS_NOTE = "this machine's paths are written <repo>, <home>, <venv> and <socket dir>"
# What verify derives again (the rest of record.json: patches, written from the checkout; paths, a note).
DERIVED = ("contract", "source", "launcher", "machine", "models", "oracle", "result")


def isa(identity: dict[str, Any]) -> str:
    return str(identity.get("emulated") or ("avx512" if identity.get("avx512") else "avx2"))


def per_rank(starts: list[Evidence], key: str) -> dict[str, dict[str, Any]]:
    return {f"start-{e.start_index}": {f"rank-{a.get('global_rank')}": a.get(key) for a in e.audits} for e in starts}


def record(
    contract: contract_mod.Contract, starts: list[Evidence], headline: str, patches: list[dict[str, Any]]
) -> dict[str, Any]:
    """record.json: source state, launcher, machine, models, oracle and result, read from the evidence."""
    first = starts[0]
    fp8 = per_rank(starts, "fp8_attention")
    portable = {bool((p or {}).get("portable")) for ranks in fp8.values() for p in ranks.values()}
    return {
        "contract": {"name": contract.name, "digest": contract.digest, "file": CONTRACT_FILE},
        "source": {
            "vllm": first.engine.vllm_version,
            "torch": first.engine.torch_version,
            "patches": patches,
            "runtime_fixes": per_rank(starts, "runtime_fixes"),
        },
        "launcher": {"command": first.engine.command, "environment": first.engine.environment},
        "machine": {
            "cpu": first.host,
            "isa": isa(first.host or {}),
            "fp8_attention_path": "portable" if portable == {True} else "native" if portable == {False} else "mixed",
            "fp8_attention": fp8,
        },
        "models": {
            "target": first.target.model_dump(mode="json") if first.target else None,
            "draft": first.draft.model_dump(mode="json") if first.draft else None,
        },
        "oracle": {"teacher_snapshots": f"{SNAPSHOTS}/{teacher.folder_name(contract)}"},
        "result": {
            "headline": headline,
            "promotion": run_folder.PROMOTION,
            "starts": [f"start-{e.start_index}/{evidence.FILENAME}" for e in starts],
        },
        "paths": PATHS_NOTE,
    }


def differences(recorded: Any, derived: Any, where: str = "") -> list[str]:
    """Each leaf where record.json says other than its evidence, as `path: recorded ..., the evidence says ...`."""
    if isinstance(recorded, dict) and isinstance(derived, dict):
        return [
            line
            for key in sorted(set(recorded) | set(derived), key=str)
            for line in differences(recorded.get(key), derived.get(key), f"{where}.{key}" if where else str(key))
        ]
    if recorded == derived:
        return []
    return [f"{where}: record.json says {_short(recorded)}, the sealed evidence says {_short(derived)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
