"""Quality baselines: what the contract's target-only run (and its unquantized-KV twin) scored, recorded
like the teacher, one syrupy JSON file per flavour.

A baseline carries its identity (the teacher's output digest, the quality set's sha256, the chat settings,
KV dtype, engine version, the target's digest), every sample's result with the answer's text, the figures,
and a digest over all of it: an edited baseline (a figure raised by hand, a sample flipped) no longer
matches its digest and fails closed, as does one whose figures disagree with its own samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..digests import sha256_canonical
from ..errors import LabError
from ..evidence.record import read_json
from .judge import Key, key_text

if TYPE_CHECKING:
    from ..judge.snapshots import JSONSnapshotExtension

FLAVOURS = ("fp8", "unquantized")
SNAPSHOT_TEST_FILE = "test_quality.py"
RECORD_TEST = "test_quality_baseline"
RECORD_COMMAND = "pytest -m quality --snapshot-update --b70-contract {name}"
TEXT_KEPT = 1200  # characters of each answer kept for a reader; the verdict needs only passed/failed


class QualityBaselineError(LabError, ValueError):
    """A quality baseline is missing, edited, damaged or recorded for something else."""


def folder_name(output_digest: str) -> str:
    """Named like the teacher's folder: by the teacher's output digest (target, engine, prompts)."""
    return f"quality-{output_digest[:16]}"


def snapshot_path(tests_dir: Path, output_digest: str, flavour: str) -> Path:
    return (
        tests_dir
        / "__snapshots__"
        / folder_name(output_digest)
        / Path(SNAPSHOT_TEST_FILE).stem
        / f"{RECORD_TEST}[{flavour}].json"
    )


def _digest(body: dict[str, Any]) -> str:
    return sha256_canonical(body)


def payload(
    identity: dict[str, Any], figures: dict[str, list[Key]], scores: dict[Key, Any], texts: dict[Key, str]
) -> dict[str, Any]:
    """The snapshot of one baseline run (what --snapshot-update writes)."""
    samples = {
        key_text(k): {
            "passed": bool(scores[k].passed),
            "detail": scores[k].detail,
            "text": texts.get(k, "")[:TEXT_KEPT],
        }
        for keys in figures.values()
        for k in keys
        if k in scores
    }
    body = {
        "baseline": identity,
        "samples": samples,
        "figures": {
            f: {"passed": sum(1 for k in keys if k in scores and scores[k].passed), "of": len(keys)}
            for f, keys in figures.items()
        },
    }
    return {**body, "digest": _digest(body)}


def read(path: Path) -> dict[str, Any]:
    """A baseline file, checked against its own digest and its own samples."""
    data = read_json(path, "quality baseline", QualityBaselineError)
    fields = {"baseline", "samples", "figures", "digest"}
    if not isinstance(data, dict) or set(data) != fields:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise QualityBaselineError(f"quality baseline {path} has fields {got}, want {sorted(fields)}: damaged")
    body = {k: v for k, v in data.items() if k != "digest"}
    if _digest(body) != data["digest"]:
        raise QualityBaselineError(
            f"quality baseline {path} does not match its own digest (recorded "
            f"{data['digest']}, content {_digest(body)}): it was edited after it was "
            f"recorded; re-record it with `pytest -m quality --snapshot-update`"
        )
    return data


def passes(data: dict[str, Any], figures: dict[str, list[Key]], path: Path) -> dict[Key, bool]:
    """Per-sample pass/fail of a baseline, after checking that its figures are its samples' sums."""
    out: dict[Key, bool] = {}
    for figure, keys in figures.items():
        present = [k for k in keys if key_text(k) in data["samples"]]
        for k in present:
            out[k] = bool(data["samples"][key_text(k)]["passed"])
        recorded = data["figures"].get(figure)
        if recorded is not None and recorded.get("passed") != sum(out[k] for k in present):
            raise QualityBaselineError(
                f"quality baseline {path}: figure {figure} says {recorded.get('passed')} passed, its samples say "
                f"{sum(out[k] for k in present)}: damaged or edited"
            )
    return out


def check_identity(data: dict[str, Any], want: dict[str, Any], path: Path, command: str) -> None:
    """Stale when anything that decides the answers differs (the target's digest is informative only: a
    candidate may serve another calibration of the same target and is judged against this baseline)."""
    seen = data["baseline"]
    for field in (
        "flavour",
        "output_digest",
        "quality_sha256",
        "chat",
        "repetition",
        "kv_cache_dtype",
        "engine_version",
    ):
        if seen.get(field) != want.get(field):
            raise QualityBaselineError(
                f"quality baseline {path} was recorded with {field} = {seen.get(field)!r}, this run has "
                f"{want.get(field)!r}: the baseline is stale; re-record it with `{command}`"
            )


def identity(contract: Any, flavour: str, evidence: Any | None) -> dict[str, Any]:
    """What a baseline of `contract` in `flavour` is, as recorded and as a candidate run must find it. The
    candidate's own engine version must be the baseline's: a new engine needs a new baseline."""
    teacher = contract.teacher()
    return {
        "flavour": flavour,
        "recorded_by": teacher.name if flavour == "fp8" else f"{contract.name}-unquantized-kv",
        "output_digest": teacher.output_digest,
        "quality_sha256": contract.quality.sha256,
        "chat": contract.chat.model_dump(mode="json") if contract.chat else None,
        # the limits decide whether a repetition sample passed: other limits, another baseline
        "repetition": {
            "ngram": contract.quality.repetition_ngram,
            "max_rate": contract.quality.max_repetition_rate,
            "max_span": contract.quality.max_repeated_span,
        },
        "kv_cache_dtype": teacher.engine.kv_cache_dtype if flavour == "fp8" else "auto",
        "engine_version": evidence.engine.vllm_version if evidence is not None else None,
        "model_digest": evidence.target.digest if evidence is not None else None,
    }


def snapshot_extension(output_digest: str) -> type[JSONSnapshotExtension]:
    """syrupy's JSON extension writing into the baseline's folder (imported only by a recording run)."""
    from ..judge.snapshots import json_extension_in

    return json_extension_in(folder_name(output_digest), "QualityBaseline")
