"""The sweep's engine starts, interleaved across its variants, and the replays that judge each variant's run
folder with the promotion gates (`pytest -m gates --b70-evidence`), exactly as a lab judges any saved run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import contract as contract_mod
from .. import evidence, project, run_folder, teacher
from ..contract import Contract
from ..engine import starts as starts_mod
from ..errors import LabError
from ..variants import Variant
from .plan import (
    JUDGE_JUNIT,
    JUDGE_LOG,
    SWEEP_JSON,
    VARIANTS,
    PlannedStart,
    contract_file,
    start_order,
    teachers_dir,
    variant_dir,
)

Progress = Callable[[str], None]
JUDGE_TIMEOUT_S = 600.0
# What a judging replay must not inherit from a pytest that runs the sweep (a test under xdist).
CHILD_ENV_DROPPED = ("PYTEST_XDIST_", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")


class SweepError(LabError, RuntimeError):
    """The sweep cannot begin or cannot write its files."""


@dataclass
class Outcome:
    """What ran: each planned start with its status, and each variant's judging replay."""

    order: list[PlannedStart]
    status: dict[str, str] = field(default_factory=dict)  # PlannedStart.label() -> ok / failed: ... / not run: ...
    judged: dict[str, str] = field(default_factory=dict)  # variant -> "" when judged, else why not
    teachers: dict[str, list[str]] = field(default_factory=dict)  # variant -> the snapshot files of its own teacher

    @property
    def problems(self) -> list[str]:
        """Why the sweep exits non-zero: a start that failed or never ran, a variant left unjudged."""
        return [f"{label}: {s}" for label, s in self.status.items() if s != "ok"] + [
            f"{name}: not judged: {why}" for name, why in self.judged.items() if why
        ]


def needs_own_teacher(variant: Variant, base: Contract) -> bool:
    return variant.contract.kind == "candidate" and not variant.shares_teacher(base)


def prepare(out: Path, variants: list[Variant]) -> None:
    """A fresh sweep folder (a used one would mix two sweeps' starts) with every variant's contract written
    as TOML, each read back to the same digest before anything starts."""
    out = Path(out)
    if (out / SWEEP_JSON).exists() or any((out / VARIANTS).glob("*")):
        raise SweepError(f"{out} already holds a sweep: give --out a new folder")
    for v in variants:
        path = contract_file(out, v.name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(contract_mod.to_toml(v.contract))
            variant_dir(out, v.name).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SweepError(f"cannot write {path}: {e.strerror or e}") from e
        again = contract_mod.load(path)
        if again.digest != v.contract.digest:
            raise SweepError(
                f"{path} reads back as digest {again.digest[:16]}, the variant is "
                f"{v.contract.digest[:16]}: the contract does not survive TOML"
            )


def run(
    base: Contract,
    variants: list[Variant],
    rounds: int,
    out: Path,
    cache_root: Path,
    progress: Progress | None = None,
    prompt_ids: list[str] | None = None,
    probe: bool = True,
) -> Outcome:
    """Every planned start, then every variant judged. A variant whose start failed gets no later start
    (nothing past a failed start can be promoted); the others go on, so one broken variant costs the sweep
    only its own starts."""
    say = progress or (lambda _msg: None)
    out = Path(out)
    prepare(out, variants)
    by_name = {v.name: v for v in variants}
    own = [v.name for v in variants if needs_own_teacher(v, base)]
    outcome = Outcome(start_order([v.name for v in variants], rounds, own))
    models = {v.name: starts_mod.resolve_models(v.contract, cache_root) for v in variants}
    # An own teacher serves the target alone: its models are resolved from its own contract (no draft).
    teacher_models = {name: starts_mod.resolve_models(by_name[name].contract.teacher(), cache_root) for name in own}
    if probe:
        probe_result = starts_mod.preflight_probe(base, out, cache_root, say)
    else:
        probe_result = {"skipped": "the preflight collective probe was turned off (--no-probe)"}
    for v in variants:
        starts_mod.write_run_files(variant_dir(out, v.name), v.contract, models[v.name])
        if v.name in own:
            starts_mod.write_run_files(
                run_folder.kind_dir(variant_dir(out, v.name), "teacher"), v.contract.teacher(), teacher_models[v.name]
            )
    broken: set[str] = set()
    for i, planned in enumerate(outcome.order, 1):
        label = planned.label()
        if planned.variant in broken and not planned.own_teacher:
            outcome.status[label] = "not run: an earlier start of this variant failed"
            continue
        v = by_name[planned.variant]
        c = v.contract.teacher() if planned.own_teacher else v.contract
        folder = variant_dir(out, v.name)
        where = run_folder.start_dir(folder, "teacher", 1) if planned.own_teacher else folder / f"start-{planned.index}"
        say(f"sweep: start {i} of {len(outcome.order)} (round {planned.round}): {label}")
        record = starts_mod.run_start(
            c,
            teacher_models[v.name] if planned.own_teacher else models[v.name],
            where,
            cache_root / "engine-state",
            planned.index,
            say,
            out / run_folder.LAUNCHES_LOG,
            None,
            probe_result,
            prompt_ids,
        )
        if record.status == "ok":
            outcome.status[label] = "ok"
        else:
            outcome.status[label] = "failed: " + (record.failure.message.splitlines()[0] if record.failure else "?")
            say(f"sweep: {label} {outcome.status[label]} (evidence: {where / evidence.FILENAME})")
            if not planned.own_teacher:  # a failed teacher leaves its candidate unjudgeable, not unmeasured
                broken.add(v.name)
    for name in own:
        outcome.teachers[name] = _record_teacher(by_name[name], out, prompt_ids)
    for v in variants:
        outcome.judged[v.name] = judge(v, out, prompt_ids, own_teacher=v.name in own, progress=say)
    return outcome


def _record_teacher(v: Variant, out: Path, prompt_ids: list[str] | None) -> list[str]:
    """The snapshots of a variant's own teacher, under the sweep's folder: what its candidate is held to."""
    folder = run_folder.kind_dir(variant_dir(out, v.name), "teacher")
    try:
        record = run_folder.read_starts(folder)[0]
    except evidence.EvidenceError:
        return []
    if record.status != "ok":
        return []
    prompts = contract_mod.select_prompts(contract_mod.load_prompts(v.contract), prompt_ids, "--prompts")
    written = teacher.write_snapshots(teachers_dir(out), v.contract, record, [p.id for p in prompts])
    return [str(p.relative_to(out)) for p in written]


def judge(
    v: Variant, out: Path, prompt_ids: list[str] | None, own_teacher: bool, progress: Progress | None = None
) -> str:
    """Replay the variant's run folder with the gates under its own contract file; "" when a verdict was
    written, else why not. The replay's output is the folder's judge.log, its JUnit junit.xml."""
    folder = variant_dir(out, v.name)
    tests = project.find("tests/gates")
    if not tests.is_dir():
        return f"the gate tests are not here ({tests}): a sweep judges with the lab repository's tests/gates"
    if not any(folder.glob("start-*/" + evidence.FILENAME)):
        return "no start of this variant recorded evidence"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(tests),
        "-m",
        "gates",
        f"--b70-evidence={folder}",
        f"--b70-contract={contract_file(out, v.name)}",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={folder / JUDGE_JUNIT}",
        f"--rootdir={tests.parent.parent}",
    ]
    if own_teacher:
        cmd.append(f"--b70-teacher-snapshots={teachers_dir(out)}")
    if prompt_ids:
        cmd.append(f"--b70-prompts={','.join(prompt_ids)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(CHILD_ENV_DROPPED)}
    (progress or (lambda _msg: None))(f"sweep: judging {v.name} (replay of {folder})")
    try:
        with open(folder / JUDGE_LOG, "w", encoding="utf-8") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(
                cmd, cwd=tests.parent.parent, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=JUDGE_TIMEOUT_S
            )
    except subprocess.TimeoutExpired:
        return f"the replay ran past {JUDGE_TIMEOUT_S:.0f} s ({folder / JUDGE_LOG})"
    except OSError as e:
        return f"the replay could not run: {e}"
    if done.returncode not in (0, 1) or not (folder / run_folder.PROMOTION).is_file():
        return f"the replay exited {done.returncode} without a verdict ({folder / JUDGE_LOG})"
    return ""
