"""Reproducing a sealed record. Before any start: is this checkout the sealed one (vLLM and torch, the patch
series, the runtime-fix selection, the models)? Each difference is named; the plugin refuses the session unless
the drift is accepted. After the gates: does the new run reproduce the sealed result? Tokens identical to the
sealed evidence and the sealed teacher's on every prompt and the same runtime fixes on every rank, on any host;
and, on the seal's host class only (evidence.host.host_class), the speed against the sealed starts (the ratio of
medians and the paired figure, with their intervals, compare.compare_runs) within the contract's
throughput_tolerance: a comparison across days, never the side-by-side tolerance. On another class the speed is
said to be not compared, and why."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import project
from ..contract.schema import Contract
from ..evidence import host, run_folder
from . import store
from .seal import PATCHES, patch_series

REPORT_FILE = "reproduction.json"
# The environment variables that select the runtime fixes (in_engine/fixes.py, in_engine/dflash_fix.py).
FIX_SELECTION = ("B70LAB_VLLM_FIXES", "B70LAB_DFLASH_CPU_FIX")


def this_host_class(contract: Contract, environ: Mapping[str, str] = os.environ) -> host.HostClass:
    """This machine's host class as a start of `contract` would have it (the FP8 path forecast)."""
    identity = host.cpu_identity(environ=environ)
    return host.host_class(
        identity, host.fp8_path(contract.engine.device, contract.engine.kv_cache_dtype, identity, environ)[0]
    )


def sealed_host_class(seal: store.Seal) -> host.HostClass:
    """The seal's host class, recomputed from its first start's evidence."""
    return host.start_class(run_folder.read_starts(seal.folder)[0])


def _patch_drift(sealed: list[dict[str, str]], here: list[dict[str, str]]) -> list[str]:
    a, b = {p["name"]: p["sha256"] for p in sealed}, {p["name"]: p["sha256"] for p in here}
    out = [f"patch {n}: sealed, absent from this checkout's {PATCHES}/" for n in sorted(set(a) - set(b))]
    out += [f"patch {n}: in this checkout, not in the seal" for n in sorted(set(b) - set(a))]
    out += [
        f"patch {n}: changed (sha256 {b[n][:16]}... here, sealed {a[n][:16]}...)"
        for n in sorted(set(a) & set(b))
        if a[n] != b[n]
    ]
    return out


def _model_drift(sealed: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    out = []
    for part in ("target", "draft"):
        a, b = sealed.get(part) or {}, here.get(part) or {}
        for key in ("digest", "manifest_digest", "revision"):
            if a.get(key) != b.get(key):
                out.append(f"{part} model {key}: {b.get(key)} here, sealed {a.get(key)}")
    return out


def source_drift(seal: store.Seal) -> list[str]:
    """What of the source state a seal was made under has moved in this checkout and environment: vLLM and torch,
    the patch series, the runtime fixes the package knows. A seal with any is no longer current: the change that
    moved it seals a new run (`b70lab seal --supersedes`)."""
    from ..in_engine import dflash_fix
    from ..in_engine.fixes import FIX_NAMES

    known = {*FIX_NAMES, dflash_fix.FIX_NAME}  # what every rank's audit lists (worker_ext: both registries)
    source = seal.record().get("source") or {}
    drift = []
    for name, sealed in (("vllm", source.get("vllm")), ("torch", source.get("torch"))):
        if host.library_version(name) != sealed:
            drift.append(f"{name} {host.library_version(name)} here, sealed {sealed}")
    drift += _patch_drift(source.get("patches") or [], patch_series(project.find(PATCHES)))
    recorded = {
        name
        for ranks in (source.get("runtime_fixes") or {}).values()
        for fixes in ranks.values()
        for name in fixes or {}
    }
    if recorded and recorded != known:
        added, gone = sorted(known - recorded), sorted(recorded - known)
        drift.append(
            f"runtime fixes: {', '.join(added) or 'none'} added here, {', '.join(gone) or 'none'} gone since sealing"
        )
    return drift


def machine_drift(
    seal: store.Seal, contract: Contract, models: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> list[str]:
    """What differs between this machine and checkout and the sealed ones, one line each; [] when nothing
    does. `models`: {"target": ModelRef as a dict, "draft": ...} as this machine resolves the contract."""
    record = seal.record()
    drift = source_drift(seal)
    sealed_env = (record.get("launcher") or {}).get("environment") or {}
    for name in FIX_SELECTION:
        if environ.get(name) != sealed_env.get(name):
            drift.append(f"runtime fixes: {name}={environ.get(name)!r} here, sealed {sealed_env.get(name)!r}")
    drift += _model_drift(record.get("models") or {}, models)
    return drift


@dataclass
class Reproduction:
    seal: str
    reproduced: bool
    reasons: list[str]
    figures: dict[str, Any] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)  # accepted with --b70-accept-drift

    def line(self) -> str:
        figures = self.figures
        if figures.get("speed_not_compared"):
            speed = f"speed {figures['speed_not_compared']}"
        elif figures.get("ratio") is not None:
            speed = (
                f"speed {figures['ratio']:.3f} [{figures['low']:.3f}, {figures['high']:.3f}] of the sealed "
                f"(tolerance {figures['tolerance']:g})"
            )
        else:
            speed = "speed: not comparable"
        outputs = f"tokens identical on {figures.get('identical', 0)}/{figures.get('prompts', 0)} prompts"
        head = f"REPRODUCED {self.seal}" if self.reproduced else f"NOT REPRODUCED {self.seal}"
        why = "" if self.reproduced else ": " + "; ".join(self.reasons)
        drift = f" (drift accepted: {'; '.join(self.drift)})" if self.drift else ""
        return f"{head}{why} - {outputs}; {speed}{drift}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "seal": self.seal,
            "reproduced": self.reproduced,
            "reasons": self.reasons,
            "figures": self.figures,
            "drift_accepted": self.drift,
            "line": self.line(),
        }


def _fix_drift(sealed: Mapping[str, Any], run: list[Any]) -> list[str]:
    out = []
    for e in run:
        for audit in e.audits:
            where = f"start-{e.start_index} rank {audit.get('global_rank')}"
            want = ((sealed.get("start-1") or {}).get(f"rank-{audit.get('global_rank')}")) or {}
            if audit.get("runtime_fixes") != want:
                out.append(f"{where}: runtime fixes {audit.get('runtime_fixes')}, sealed {want}")
    return out


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _oracle_drift(seal_folder: Path, contract: Contract, run: list[Any]) -> list[str]:
    """Every prompt where this run's tokens are not the sealed teacher's (the oracle that judged the seal):
    a seal whose teacher was changed and re-sealed is not reproduced by a run that agrees with the old one."""
    from ..judge import teacher

    out: dict[str, str] = {}
    for e in run:
        for r in (*e.requests, *e.repeats):
            if r.prompt_id in out:
                continue
            snapshot = teacher.read(teacher.snapshot_path(seal_folder / store.SNAPSHOTS, contract, r.prompt_id))
            if snapshot["token_ids_sha256"] != r.token_ids_sha256:
                ids = list(snapshot.get("token_ids") or [])
                at = _first_difference(r.token_ids, ids)
                seen = r.token_ids[at] if at < len(r.token_ids) else None
                out[r.prompt_id] = (
                    f"prompt {r.prompt_id}: start-{e.start_index} is not the sealed teacher's output (token {at} is "
                    f"{seen}, the sealed teacher's {ids[at] if at < len(ids) else None})"
                )
    return list(out.values())


def judge(seal_folder: Path, run_dir: Path, contract: Contract, drift: list[str] | None = None) -> Reproduction:
    """Whether the run in `run_dir` reproduces the seal (see the module's docstring)."""
    from ..judge.compare import compare_runs, load_run

    seal = store.read(seal_folder)
    name = f"{store.REPRO}/{seal.name}"
    reasons = []
    if (sealed_digest := seal.contract_digest()) != contract.digest:
        reasons.append(f"contract digest {contract.digest[:16]}..., sealed {sealed_digest[:16]}...")
    comparison = compare_runs(load_run(seal_folder), load_run(run_dir))
    differing = [p for p in comparison.prompts if not p.identical or not p.starts_agree_b]
    for p in differing[:5]:
        reasons.append(
            f"prompt {p.prompt_id}: "
            + (
                f"token {p.position} is {p.token_b}, sealed {p.token_a}"
                if not p.identical
                else "this run's starts disagree with each other"
            )
        )
    if len(differing) > 5:
        reasons.append(f"and {len(differing) - 5} more prompts differ")
    if comparison.only_in_a or comparison.only_in_b:
        reasons.append(f"prompts in one run only: {sorted([*comparison.only_in_a, *comparison.only_in_b])}")
    run = run_folder.read_starts(run_dir)
    reasons += _oracle_drift(seal_folder, contract, run)[:5]
    reasons += _fix_drift(seal.record().get("source", {}).get("runtime_fixes") or {}, run)[:4]
    speed, tolerance = comparison.speed, contract.reproduction.throughput_tolerance
    figures: dict[str, Any] = {
        "identical": comparison.identical_outputs,
        "prompts": len(comparison.prompts),
        "ratio": speed.ratio,
        "low": speed.low,
        "high": speed.high,
        "paired": speed.paired.ratio if speed.paired else None,
        "tolerance": tolerance,
        "sealed_median": speed.median_a,
        "median": speed.median_b,
    }
    if comparison.speed_not_compared and comparison.host_classes:
        sealed_on, run_on = comparison.host_classes
        figures["speed_not_compared"] = sealed_on.not_compared(run_on, "sealed", "this run")
    elif speed.ratio is None or speed.low is None or speed.high is None:
        reasons.append("no prompt has a decode rate in both the seal and this run")
    elif speed.low < 1 - tolerance or speed.high > 1 + tolerance:
        where = "outside" if abs(speed.ratio - 1) > tolerance else "not wholly inside"
        reasons.append(
            f"speed {speed.ratio:.3f} [{speed.low:.3f}, {speed.high:.3f}] of the sealed ({speed.median_b:.1f} vs "
            f"{speed.median_a:.1f} tok/s median) is {where} 1 +/- {tolerance:g} (throughput_tolerance)"
        )
    if (
        not comparison.speed_not_compared
        and speed.paired is not None
        and (speed.paired.low < 1 - tolerance or speed.paired.high > 1 + tolerance)
    ):
        reasons.append(
            f"paired speed {speed.paired.line()} of the sealed (the geometric mean of the per-prompt ratios) is "
            f"not wholly inside 1 +/- {tolerance:g} (throughput_tolerance)"
        )
    return Reproduction(name, not reasons, reasons, figures, list(drift or []))
