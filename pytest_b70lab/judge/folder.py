"""The promotion gates of one run folder, judged in this process: every (gate, subject) the catalogue and the
contract require, through the same `catalogue.check` as a gates session's tests, into the same `Decision`. The
sweep judges its variants with it (no pytest child, no child's time limit); a test holds it and a pytest
replay of the same folder to the same verdict."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..contract.schema import Contract, load_prompts, select_prompts
from ..evidence import run_folder
from ..evidence.record import Evidence, Failure
from . import catalogue, verdict
from .verdict import Decision, GateOutcome, Outcome

# The folder of this repository's gate tests: the in-process outcomes are named as a session's items are.
GATE_TESTS = "tests/gates"


def _first_line(failure: Failure) -> str:
    return failure.first_line


def blocked_by(
    starts: Sequence[Evidence], run_dir: Path, headline: Callable[[Failure], str] = _first_line
) -> str | None:
    """The message a gates session stops on when a start failed (the first, in order), or None. `headline`
    names the failure's cause: the session's own (engine.logs.failure_headline) where the caller may use it."""
    for record in sorted(starts, key=lambda s: s.start_index):
        if record.status != "ok":
            failure = record.failure
            phase = f" while {failure.phase}" if failure and failure.phase else ""
            cause = headline(failure) if failure else "no cause recorded"
            folder = run_folder.kind_dir(run_dir, record.role) / f"start-{record.start_index}"
            return (
                f"start-{record.start_index} failed{phase}: {cause} "
                f"(evidence and each rank's last lines: {folder / 'evidence.json'})"
            )
    return None


def subjects(
    gate: catalogue.Gate, starts: Sequence[Evidence], contract: Contract, prompt_ids: Sequence[str]
) -> list[tuple[str, catalogue.Subject]]:
    """(node id parameters, subject) of every check of `gate`, in a session's collection order: per start the
    contract asks for, whether or not the run holds it (a missing start fails its checks, as in a session)."""
    if gate.scope == "run":
        return [("", catalogue.Subject())]
    held = {s.start_index: s for s in starts}
    indexes = range(1, contract.reproduction.fresh_starts + 1)
    found: list[tuple[str, catalogue.Subject]] = []
    for i in indexes:
        start = held.get(i)
        if gate.scope == "start":
            found.append((f"start-{i}", catalogue.Subject(start, index=i)))
        elif gate.scope == "rank":
            ranks = range(contract.engine.tensor_parallel)
            found += [(f"start-{i}-rank-{r}", catalogue.Subject(start, rank=r, index=i)) for r in ranks]
        else:
            found += [(f"start-{i}-{p}", catalogue.Subject(start, prompt=p, index=i)) for p in prompt_ids]
    return found


def _missing_start(inputs: catalogue.Inputs, index: int) -> str:
    held = sorted(s.start_index for s in inputs.starts)
    return (
        f"start-{index}: no evidence (the run has starts {held}; the contract asks for "
        f"{inputs.contract.reproduction.fresh_starts}); looked in {inputs.run_dir}"
    )


def outcomes(
    inputs: catalogue.Inputs, blocked: str | None = None, added: Sequence[catalogue.Gate] = ()
) -> list[GateOutcome]:
    """Every check of every applicable gate (the catalogue's, then those other plugins `added`), as a
    session's reports would give them."""
    found = []
    extra = {g.name: g for g in added}
    for gate in (*catalogue.CATALOGUE, *added):
        skip = gate.inapplicable(inputs.contract)
        for params, subject in subjects(gate, inputs.starts, inputs.contract, inputs.prompt_ids):
            test = f"{GATE_TESTS}/{gate.test}" + (f"[{params}]" if params else "")
            if blocked is not None:
                outcome: Outcome = "skipped"
                why = f"skipped: not run after this session's first failure: {blocked}"
                found.append(GateOutcome(test, gate.name, subject.name, outcome, why))
                continue
            if gate.scope != "run" and subject.start is None:
                assert subject.index is not None
                found.append(
                    GateOutcome(test, gate.name, subject.name, "failed", _missing_start(inputs, subject.index))
                )
                continue
            if skip is not None:
                found.append(GateOutcome(test, gate.name, subject.name, "skipped", f"skipped: {skip}"))
                continue
            v = catalogue.check(gate.name, inputs, subject, extra)
            observed = {"b70_passed": v.passed, **v.observed}
            reasons = "" if v.passed else " | ".join(v.reasons)
            found.append(GateOutcome(test, v.gate, v.subject, "passed" if v.passed else "failed", reasons, observed))
    if blocked is not None and found:
        # The session's first test (in collection order: by file, then as declared) is the one that meets the
        # failed start and fails with it; every other is skipped.
        first = min(range(len(found)), key=lambda n: found[n].test.split("::")[0])
        found[first] = GateOutcome(found[first].test, found[first].gate, found[first].subject, "failed", blocked)
    return found


def judge(
    run_dir: Path,
    contract: Contract,
    starts: Sequence[Evidence],
    *,
    tables: Mapping[str, Any] | str,
    teacher_snapshots: Path,
    prompt_ids: Sequence[str] | None = None,
    problems: Sequence[str] = (),
    headline: Callable[[Failure], str] = _first_line,
    added: Sequence[catalogue.Gate] = (),
) -> Decision:
    """The Decision a gates session replaying `run_dir` under `contract` would reach. `tables` are the
    checkpoint tables (or why they cannot be read), `prompt_ids` the judged subset (--b70-prompts; the
    required pairs always come from the whole set), `problems` why the verdict cannot promote whatever the
    gates say (replay.judged_contract's), `added` the gates other plugins add (pytest_b70lab_catalogue)."""
    prompts = load_prompts(contract, fallback=run_dir / run_folder.PROMPTS_COPY)
    every = [p.id for p in prompts]
    judged = [p.id for p in select_prompts(prompts, list(prompt_ids), "prompts")] if prompt_ids else every
    inputs = catalogue.Inputs(contract, list(starts), tables, run_dir, judged, teacher_snapshots)
    blocked = blocked_by(starts, run_dir, headline)
    return Decision(
        contract.name,
        contract.digest,
        catalogue.required_subjects(contract, every, {g.name: g.scope for g in added}),
        outcomes(inputs, blocked, added),
        list(problems),
        [blocked] if blocked else [],
        tables_checked=dict(tables.get("checked") or {}) if isinstance(tables, Mapping) else {},
    )


def headline_line(decision: Decision, run_dir: Path) -> str:
    """The verdict's first line, as a session prints it."""
    return verdict.summary(decision, run_dir)[0][0]


def judge_folder(run_dir: Path, teacher_snapshots: Path, named: str | None = None) -> Decision:
    """A run folder's verdict judged now, as a replay under its recorded contract would reach it, with the
    checkpoint tables of the folder's own copy (no checkpoint is read: the surfaces that call this show saved
    runs on any machine)."""
    from ..evidence.record import EvidenceError
    from .replay import damaged_copies, judged_contract, recorded_before_identity

    starts = run_folder.read_starts(run_dir)
    contract, problems = judged_contract(starts, run_dir, named)
    problems += recorded_before_identity(starts, run_dir) + damaged_copies(run_dir, contract)
    try:
        tables: Mapping[str, Any] | str = run_folder.read_tables(run_dir, contract) or (
            f"{run_dir} holds no copy of the checkpoint tables ({run_folder.TABLES_COPY})"
        )
    except EvidenceError as e:
        tables = str(e)
    return judge(run_dir, contract, starts, tables=tables, teacher_snapshots=teacher_snapshots, problems=problems)


def unrecorded_headline(run_dir: Path, teacher_snapshots: Path) -> str:
    """What `b70lab report` and `evidence show` print for a folder without promotion.json: the verdict judged
    now, said to be no promotion (nothing was recorded), or why it cannot be judged."""
    from ..errors import LabError

    prefix = f"No verdict recorded: {run_dir.name} has no {run_folder.PROMOTION}"
    try:
        decision = judge_folder(run_dir, teacher_snapshots)
    except LabError as e:
        return f"{prefix}, and the gates cannot judge it now: {e}"
    return f"{prefix}; judged now from its evidence (not a promotion until a session records it): " + headline_line(
        decision, run_dir
    )
