"""The sweep's engine starts, interleaved across its variants, and the judging of each variant's run folder with
the promotion gates, in this process (judge.judge: the catalogue a gates session judges through, the same
verdict as `pytest -m gates --b70-evidence` of the folder)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contract import project
from ..contract import schema as contract_mod
from ..contract.schema import Contract
from ..contract.variants import Variant
from ..engine import starts as starts_mod
from ..engine.logs import failure_headline
from ..errors import LabError
from ..evidence import record as evidence
from ..evidence import run_folder
from ..isolation import processes
from ..judge import folder as judge_mod
from ..judge import replay, teacher, verdict
from .plan import (
    JUDGE_LOG,
    PLAN_JSON,
    PLAN_SCHEMA,
    SWEEP_JSON,
    VARIANTS,
    PlannedStart,
    contract_file,
    start_order,
    teachers_dir,
    variant_dir,
)

if TYPE_CHECKING:
    from ..engine.capability import Machine

Progress = Callable[[str], None]


class SweepError(LabError, RuntimeError):
    """The sweep cannot begin or cannot write its files."""


@dataclass
class Outcome:
    """What ran: each planned start with its status, and each variant's judging replay."""

    order: list[PlannedStart]
    status: dict[str, str] = field(default_factory=dict)  # PlannedStart.label() -> ok / failed: ... / not run: ...
    judged: dict[str, str] = field(default_factory=dict)  # variant -> "" when judged, else why not
    teachers: dict[str, list[str]] = field(default_factory=dict)  # variant -> the snapshot files of its own teacher
    alone: dict[str, str] = field(default_factory=dict)  # interleaved variant measured sequentially -> why

    @property
    def problems(self) -> list[str]:
        """Why the sweep exits non-zero: a start that failed or never ran, a variant left unjudged."""
        return [f"{label}: {s}" for label, s in self.status.items() if s != "ok"] + [
            f"{name}: not judged: {why}" for name, why in self.judged.items() if why
        ]


def needs_own_teacher(variant: Variant, base: Contract) -> bool:
    return variant.contract.kind == "candidate" and not variant.shares_teacher(base)


def prepare(out: Path, variants: list[Variant], asked: dict[str, Any] | None = None) -> None:
    """A fresh sweep folder (a used one would mix two sweeps' starts) with what the sweep was asked for
    (plan.json: `asked`, and each variant's name and digest) and every variant's contract written as TOML,
    each read back to the same digest before anything starts."""
    out = Path(out)
    if (out / SWEEP_JSON).exists() or (out / PLAN_JSON).exists() or any((out / VARIANTS).glob("*")):
        raise SweepError(f"{out} already holds a sweep: give --out a new folder, or continue it with --resume {out}")
    for v in variants:
        path = contract_file(out, v.name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(contract_mod.to_toml(v.contract))
            variant_dir(out, v.name).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SweepError(f"cannot write {path}: {e.strerror or e}") from e
        _check_contract_file(out, v)
    record = {
        "schema": PLAN_SCHEMA,
        "version": 1,
        **(asked or {}),
        "variants": [{"name": v.name, "digest": v.contract.digest} for v in variants],
    }
    try:
        (out / PLAN_JSON).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise SweepError(f"cannot write {out / PLAN_JSON}: {e.strerror or e}") from e


def _check_contract_file(out: Path, v: Variant) -> None:
    path = contract_file(out, v.name)
    try:
        again = contract_mod.load(path)
    except contract_mod.ContractError as e:
        raise SweepError(f"{path}: {str(e).splitlines()[0]}") from e
    if again.digest != v.contract.digest:
        raise SweepError(
            f"{path} reads back as digest {again.digest[:16]}, the variant is "
            f"{v.contract.digest[:16]}: the contract does not survive TOML, or was edited since the sweep began"
        )


def read_plan(out: Path) -> dict[str, Any]:
    """What an interrupted sweep was asked for (plan.json), for --resume; a SweepError naming the file."""
    path = Path(out) / PLAN_JSON
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{out} holds no sweep to resume (no {PLAN_JSON})") from None
    except (OSError, ValueError) as e:
        raise SweepError(f"{path} cannot be read: {e}") from e
    if not isinstance(record, dict) or record.get("schema") != PLAN_SCHEMA or record.get("version") != 1:
        raise SweepError(f"{path} is not a sweep plan ({PLAN_SCHEMA}, version 1)")
    if (Path(out) / SWEEP_JSON).exists():
        raise SweepError(f"{out} is a finished sweep ({SWEEP_JSON} is written): nothing to resume")
    return record


def check_resumable(out: Path, variants: list[Variant], record: dict[str, Any]) -> None:
    """The variants made again from the plan are the ones the sweep began with, and so are their files."""
    planned = [(v.get("name"), v.get("digest")) for v in record.get("variants") or []]
    now = [(v.name, v.contract.digest) for v in variants]
    if planned != now:
        raise SweepError(
            f"{Path(out) / PLAN_JSON} planned {[n for n, _ in planned]}, the same arguments now make "
            f"{[n for n, _ in now]} (or other digests): the base contract or the code that varies it changed "
            f"since the sweep began; start a new sweep"
        )
    for v in variants:
        _check_contract_file(out, v)


def _kept(where: Path) -> str | None:
    """The status of a start that ended before the interruption ("ok", or "failed: ..." for a start that
    failed by itself), or None for one to run again: no evidence, evidence that does not read back whole,
    or a start that was itself interrupted."""
    try:
        record = evidence.read(where / evidence.FILENAME)
    except evidence.EvidenceError:
        return None
    return ended_status(record)


def ended_status(record: evidence.Evidence) -> str | None:
    """A recorded start's status as a sweep's outcome keeps it ("ok", "failed: FIRST LINE"), or None where the
    start was itself interrupted."""
    if record.status == "ok":
        return "ok"
    message = record.failure.message if record.failure else "?"
    return None if message.startswith("interrupted:") else "failed: " + message.splitlines()[0]


def _discard(where: Path, say: Progress) -> None:
    """Remove what an interrupted start left, once no process holds a file of it open (killed if needed)."""
    if not where.exists():
        return
    deadline = time.monotonic() + 10.0
    while holders := processes.holding_files_under(where):
        if time.monotonic() > deadline:
            raise SweepError(f"processes {holders} still hold files of {where} open after SIGKILL: cannot resume")
        for pid in holders:
            processes.signal_process(pid)
        time.sleep(0.2)
    say(f"sweep: discarding {where} (no complete evidence: it was cut off)")
    shutil.rmtree(where)


SCHEDULES = ("sequential", "interleaved")


def session_members(
    variants: list[Variant],
    schedule: str,
    rounds: int,
    decided: dict[str, str] | None = None,
    machine: Machine | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(the variants an interleaved sweep serves side by side, every round's start of each alive together; the
    interleaved variants the machine cannot hold beside them, with why). Members are those whose contract's
    schedule is interleaved (a teacher's starts, and a sequential contract's, stay one at a time), taken in the
    grid's order, the base first, while memory and /dev/shm hold every start of them (the preflight's figures);
    the others are measured one start at a time (measured_alone). A SweepError where the schedule cannot be
    kept at all: no such variant, or variants that ask for different passes (one session serves every start
    the same passes). `decided`: a resumed sweep's `alone` from its plan.json, kept as the sweep began. `machine`:
    the machine as observed once for every variant (default: observed now)."""
    if schedule not in SCHEDULES:
        raise SweepError(f"--schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    if schedule == "sequential":
        return [], {}
    members = [v for v in variants if v.contract.reproduction.schedule == "interleaved"]
    if not members:
        raise SweepError(
            '--schedule interleaved: no variant\'s contract has [reproduction] schedule = "interleaved" '
            "(its gate 7 would judge interleaved evidence as a contradiction); set it in the base contract"
        )
    passes = {v.name: v.contract.reproduction.passes for v in members}
    if len(set(passes.values())) > 1:
        raise SweepError(f"--schedule interleaved: the variants ask for different passes {passes}: vary something else")
    if decided is not None:
        return [v.name for v in members if v.name not in decided], dict(decided)
    from ..engine import capability

    machine = machine or capability.Machine.observe(members[0].contract.engine.device)
    held: list[Variant] = []
    alone: dict[str, str] = {}
    for v in members:
        alive = [m.contract for m in (*held, v) for _ in range(rounds)]
        if problems := capability.session_problems(alive, machine):
            alone[v.name] = "the machine cannot hold it beside the session: " + "; ".join(map(str, problems))
        else:
            held.append(v)
    return [v.name for v in held], alone


def measured_alone(v: Variant) -> Variant:
    """The variant with a sequential reproduction schedule (its starts one at a time), for a variant the
    machine cannot hold in the sweep's session: gate 7 then judges its starts as measured, by the contract's
    tolerances, and the table row says why it was measured so."""
    data = v.contract.canonical()
    data["reproduction"] = {k: x for k, x in data["reproduction"].items() if k not in ("schedule", "passes")}
    return Variant(v.name, Contract.model_validate(data, strict=False), v.changes)


def as_measured(variants: list[Variant], alone: dict[str, str]) -> list[Variant]:
    """The grid as the sweep measures it: each variant in `alone` with its contract made sequential."""
    return [measured_alone(v) if v.name in alone else v for v in variants]


def _session_plan(
    variants: list[Variant], schedule: str, rounds: int, resumed: Path | None, say: Progress
) -> tuple[list[Variant], list[str], dict[str, str]]:
    """(the variants as measured, the session's members, those measured alone and why): decided now, or as the
    resumed sweep's plan.json says it was."""
    decided = dict(read_plan(resumed).get("alone") or {}) if resumed is not None else None
    members, alone = session_members(variants, schedule, rounds, decided)
    for name, why in alone.items():
        say(f"sweep: {name} is measured one start at a time: {why}")
    return as_measured(variants, alone), members, alone


def _write_run_files(
    out: Path, variants: list[Variant], models: dict[str, Any], teacher_models: dict[str, Any]
) -> None:
    for v in variants:
        starts_mod.write_run_files(variant_dir(out, v.name), v.contract, models[v.name])
        if v.name in teacher_models:
            starts_mod.write_run_files(
                run_folder.kind_dir(variant_dir(out, v.name), "teacher"), v.contract.teacher(), teacher_models[v.name]
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
    *,
    asked: dict[str, Any] | None = None,
    resume: bool = False,
    schedule: str = "sequential",
) -> Outcome:
    """Every planned start, then every variant judged. A variant whose start failed gets no later start
    (nothing past a failed start can be promoted); the others go on, so one broken variant costs the sweep
    only its own starts. `resume`: the folder holds an interrupted sweep of these variants (check_resumable);
    every start that ended before the interruption is kept, the rest run in the plan's order. Interleaved
    (session_members), the members' starts run last, as one session (_run_session)."""
    say = progress or (lambda _msg: None)
    out = Path(out)
    variants, members, alone = _session_plan(variants, schedule, rounds, out if resume else None, say)
    if not resume:
        prepare(out, variants, {**(asked or {}), "alone": alone})
    by_name = {v.name: v for v in variants}
    own = [v.name for v in variants if needs_own_teacher(v, base)]
    outcome = Outcome(start_order([v.name for v in variants], rounds, own, members), alone=alone)
    models = {v.name: starts_mod.resolve_models(v.contract, cache_root) for v in variants}
    # An own teacher serves the target alone: its models are resolved from its own contract (no draft).
    teacher_models = {name: starts_mod.resolve_models(by_name[name].contract.teacher(), cache_root) for name in own}
    if probe:
        probe_result = starts_mod.preflight_probe(base, out, cache_root, say)
    else:
        probe_result = {"skipped": "the preflight collective probe was turned off (--no-probe)"}
    _write_run_files(out, variants, models, teacher_models)
    broken: set[str] = set()
    session = [p for p in outcome.order if p.variant in members and not p.own_teacher]
    for i, planned in enumerate(outcome.order, 1):
        if planned in session:
            continue
        label = planned.label()
        v = by_name[planned.variant]
        folder = variant_dir(out, v.name)
        where = run_folder.start_dir(folder, "teacher", 1) if planned.own_teacher else folder / f"start-{planned.index}"
        if planned.variant in broken and not planned.own_teacher:
            outcome.status[label] = "not run: an earlier start of this variant failed"
            continue
        kept = _kept(where) if resume else None
        if kept is not None:
            say(f"sweep: start {i} of {len(outcome.order)}: {label} kept from the interrupted sweep ({kept})")
            outcome.status[label] = kept
        else:
            if resume:
                _discard(where, say)
            say(f"sweep: start {i} of {len(outcome.order)} (round {planned.round}): {label}")
            c = v.contract.teacher() if planned.own_teacher else v.contract
            chosen = teacher_models[v.name] if planned.own_teacher else models[v.name]
            outcome.status[label] = _one_start(
                c, chosen, where, planned, out, cache_root, say, probe_result, prompt_ids
            )
        if outcome.status[label] != "ok" and not planned.own_teacher:
            broken.add(v.name)  # a failed teacher leaves its candidate unjudgeable, not unmeasured
    if session:
        context = _Context(out, cache_root, say, probe_result, prompt_ids, len(outcome.order))
        _run_session(session, by_name, models, outcome, context, resume)
    for name in own:
        outcome.teachers[name] = _record_teacher(by_name[name], out, prompt_ids)
    for v in variants:
        outcome.judged[v.name] = judge(v, out, prompt_ids, v.name in own, cache_root, progress=say)
    return outcome


@dataclass(frozen=True)
class _Context:
    out: Path
    cache_root: Path
    say: Progress
    probe_result: dict[str, Any]
    prompt_ids: list[str] | None
    planned: int  # starts in the plan, for the progress lines


def _session_folder(out: Path, planned: PlannedStart) -> Path:
    return variant_dir(out, planned.variant) / f"start-{planned.index}"


def _run_session(
    session: list[PlannedStart],
    by_name: dict[str, Variant],
    models: dict[str, starts_mod.ResolvedModels],
    outcome: Outcome,
    context: _Context,
    resume: bool,
) -> None:
    """The interleaved sweep's starts as one session (engine.interleave.run_interleaved): each launched in the
    plan's order and ready while the ones before it idle, then every prompt served to every start in a rotating
    order, `passes` times. A session is kept whole or run again whole: resumed, it is kept only if every start of
    it ended by itself."""
    from ..engine.interleave import run_interleaved

    out, say = context.out, context.say
    kept = {p: _kept(_session_folder(out, p)) if resume else None for p in session}
    if all(k is not None for k in kept.values()):
        for p, k in kept.items():
            say(f"sweep: {p.label()} kept from the interrupted sweep ({k})")
            outcome.status[p.label()] = k or "?"
        return
    for p in session:
        if resume:
            _discard(_session_folder(out, p), say)
    say(f"sweep: the interleaved session of {len(session)} starts: {', '.join(p.label() for p in session)}")
    lives = [
        starts_mod.launch(
            by_name[p.variant].contract,
            models[p.variant],
            _session_folder(out, p),
            context.cache_root / "engine-state",
            p.index,
            say,
            out / run_folder.LAUNCHES_LOG,
            context.probe_result,
        )
        for p in session
    ]
    passes = by_name[session[0].variant].contract.reproduction.passes
    records = run_interleaved(lives, passes, None, context.prompt_ids)
    for p, record in zip(session, records, strict=True):
        status = "ok" if record.status == "ok" else "failed: " + (record.failure.message if record.failure else "?")
        outcome.status[p.label()] = status.splitlines()[0]
        if record.status != "ok":
            say(
                f"sweep: {p.label()} {outcome.status[p.label()]} (evidence: {_session_folder(out, p) / evidence.FILENAME})"
            )


def _one_start(
    c: Contract,
    models: starts_mod.ResolvedModels,
    where: Path,
    planned: PlannedStart,
    out: Path,
    cache_root: Path,
    say: Progress,
    probe_result: dict[str, Any],
    prompt_ids: list[str] | None,
) -> str:
    """One planned start, run; its status ("ok", or "failed: ...")."""
    record = starts_mod.run_start(
        c,
        models,
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
        return "ok"
    status = "failed: " + (record.failure.message.splitlines()[0] if record.failure else "?")
    say(f"sweep: {planned.label()} {status} (evidence: {where / evidence.FILENAME})")
    return status


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
    v: Variant,
    out: Path,
    prompt_ids: list[str] | None,
    own_teacher: bool,
    cache_root: Path,
    progress: Progress | None = None,
) -> str:
    """Judge the variant's run folder under its own contract file, in this process; its verdict is the folder's
    promotion.json (as a replay writes it) and its terminal lines judge.log. "" when a verdict was written,
    else why not."""
    folder = variant_dir(out, v.name)
    if not any(folder.glob("start-*/" + evidence.FILENAME)):
        return "no start of this variant recorded evidence"
    (progress or (lambda _msg: None))(f"sweep: judging {v.name} ({folder})")
    try:
        starts = run_folder.read_starts(folder)
        contract, problems = replay.judged_contract(starts, folder, str(contract_file(out, v.name)))
        problems += replay.recorded_before_identity(starts, folder) + replay.damaged_copies(folder, contract)
        decision = judge_mod.judge(
            folder,
            contract,
            starts,
            tables=starts_mod.tables_or_why(folder, contract, cache_root),
            teacher_snapshots=teachers_dir(out) if own_teacher else project.find("tests/gates") / "__snapshots__",
            prompt_ids=prompt_ids,
            problems=problems,
            headline=failure_headline,
        )
        verdict.write(decision, folder, None)
        (folder / JUDGE_LOG).write_text("\n".join(line for line, _ in verdict.summary(decision, folder)) + "\n")
    except (LabError, OSError) as e:
        return f"the folder could not be judged: {e}"
    return ""
