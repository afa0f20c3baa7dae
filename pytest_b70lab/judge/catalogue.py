"""The gate catalogue: every gate and evidence check declared once, with its scope, what it reads, when it applies
and how its rule is called. The pytest items of a gates session (plugin/suite/, collected in tests/gates/) and
the in-process judge (judge/folder.py) both judge through `Gate.check`, so a gate cannot be wired one way in a
session and another in a sweep; every surface validates a gate's name against this catalogue. The rules
themselves are pure functions, one module per family of gates."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract.schema import Contract
from ..evidence.record import Evidence
from . import (
    cold_prompts,
    engine_resolution,
    evidence_checks,
    exactness,
    load_audit,
    reproduction,
    scale_audits,
    teacher,
    topology,
)
from .rules import Verdict, subject

# Every gate a promotion needs, and what it is judged per: each (start, rank), (start, prompt), start, or
# the run as a whole. The verdict derives the required (gate, subject) pairs from this and the contract.
GATE_SCOPES = {
    "target-scale-audit": "rank",
    "draft-cache-audit": "rank",
    "engine-resolution": "rank",
    "metrics-agree": "start",
    "teacher-exactness": "prompt",
    "cold-prompt": "prompt",
    "compile-topology": "rank",
    "fresh-start-reproduction": "run",
    "launch-flags": "rank",
    "load-audit": "start",
    "spec-counters": "start",
    "token-count": "prompt",
}
# The evidence checks: that each start left all the evidence a gate reads, and that nothing outlived it or
# could reach it. A promotion requires them per start like any gate, so a selection that drops one leaves the
# run incomplete instead of promotable.
EVIDENCE_CHECK_SCOPES = {
    "evidence-start": "start",
    "evidence-ranks": "start",
    "evidence-metrics": "start",
    "evidence-prompts": "start",
    "evidence-teardown": "start",
    "evidence-exposure": "start",
    "evidence-probe": "start",
    "evidence-logs": "start",
}
SCOPES = {**GATE_SCOPES, **EVIDENCE_CHECK_SCOPES}
GATE_NAMES = tuple(SCOPES)
SPECULATIVE_GATES = frozenset({"draft-cache-audit", "spec-counters"})
FP8_ONLY_GATES = frozenset({"target-scale-audit", "teacher-exactness"})


def inapplicable(gate: str, contract: Contract) -> str | None:
    """Why `contract` does not need `gate`, or None: no speculation, no draft gates; the unquantized-KV
    reference (kind "reference") stores no FP8 and has no calibrated scales to audit, and its tokens are not
    held to the FP8 teacher (what FP8 KV changes is what it is there to measure)."""
    if contract.speculative is None and gate in SPECULATIVE_GATES:
        return (
            "the contract has no draft" if gate == "draft-cache-audit" else "the contract has no speculative decoding"
        )
    if contract.kind == "reference" and gate in FP8_ONLY_GATES:
        if gate == "teacher-exactness":
            return "the unquantized-KV reference is not held to the FP8 teacher"
        return "the unquantized-KV reference has no calibrated KV scales"
    return None


def applicable_gates(contract: Contract) -> list[str]:
    """The catalogue less what the contract makes inapplicable (`inapplicable`)."""
    return [g for g in GATE_NAMES if inapplicable(g, contract) is None]


SCOPE_NAMES = ("rank", "prompt", "start", "run")


def required_subjects(
    contract: Contract, prompt_ids: list[str], extra_gates: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """Every (gate, subject) pair a promotion of `contract` needs, from the contract alone: its fresh starts,
    tensor-parallel ranks and prompt set; `extra_gates` ({name: scope}) are the gates other plugins add
    (hookspec `pytest_b70lab_gates`), required for every subject of their scope like the catalogue's."""
    starts = range(1, contract.reproduction.fresh_starts + 1)
    per = {
        "rank": [subject(s, rank=r) for s in starts for r in range(contract.engine.tensor_parallel)],
        "prompt": [subject(s, prompt=p) for s in starts for p in prompt_ids],
        "start": [subject(s) for s in starts],
        "run": [subject()],
    }
    scopes = {**{gate: SCOPES[gate] for gate in applicable_gates(contract)}, **(extra_gates or {})}
    return [(gate, subj) for gate, scope in scopes.items() for subj in per[scope]]


# What a gate reads, as the docs' table says it.
START, ALL_STARTS, TABLES, SNAPSHOT, FOLDER, PROMPTS = (
    "start evidence",
    "every start's evidence",
    "checkpoint tables",
    "teacher snapshot",
    "run folder",
    "prompt set",
)


@dataclass(frozen=True)
class Inputs:
    """Everything a gate may read of one run. `checkpoints` is the tables, or why they cannot be read (the
    gates that need them then fail with that reason)."""

    contract: Contract
    starts: Sequence[Evidence]
    checkpoints: Mapping[str, Any] | str
    run_dir: Path
    prompt_ids: Sequence[str]
    teacher_snapshots: Path


@dataclass(frozen=True)
class Subject:
    """Whom one check judges: a start (and one of its ranks or prompts), or the run (start None)."""

    start: Evidence | None = None
    rank: int | None = None
    prompt: str | None = None
    index: int | None = None  # the start's index where its evidence is missing (start None)

    @property
    def name(self) -> str:
        index = self.start.start_index if self.start is not None else self.index
        return subject(index, rank=self.rank, prompt=self.prompt)


Rule = Callable[[Inputs, Subject], Verdict]


@dataclass(frozen=True)
class Gate:
    name: str
    reads: tuple[str, ...]
    test: str  # its test in the shipped suite, <file>::<function> as collected in the gates folder: the node ids a session keeps
    rule: Rule
    # A gate another plugin adds (hookspecs.pytest_b70lab_catalogue) says its scope here and applies to every
    # contract; the catalogue's own take theirs from SCOPES and inapplicable above.
    declared_scope: str | None = None

    @property
    def scope(self) -> str:
        return self.declared_scope or SCOPES[self.name]

    def inapplicable(self, contract: Contract) -> str | None:
        """Why the contract does not need this gate (its tests skip with it), or None."""
        return None if self.declared_scope is not None else inapplicable(self.name, contract)

    def check(self, inputs: Inputs, subject: Subject) -> Verdict:
        return self.rule(inputs, subject)


class NotJudgeable(Exception):
    """A check that cannot be judged from what the run holds: the message is its failure."""


def _start(s: Subject) -> Evidence:
    assert s.start is not None, "a start, rank or prompt check is given its start"
    return s.start


def _rank(s: Subject) -> int:
    assert s.rank is not None, "a rank check is given its rank"
    return s.rank


def _prompt(s: Subject) -> str:
    assert s.prompt is not None, "a prompt check is given its prompt"
    return s.prompt


def _tables(inputs: Inputs) -> Mapping[str, Any]:
    if isinstance(inputs.checkpoints, str):
        raise NotJudgeable(inputs.checkpoints)
    return inputs.checkpoints


def _target_scale_audit(i: Inputs, s: Subject) -> Verdict:
    calibrated = (_tables(i).get("target") or {}).get("kv_scales")
    return scale_audits.target_scale_audit(_start(s), _rank(s), i.contract, calibrated)


def _load_audit(i: Inputs, s: Subject) -> Verdict:
    tables = _tables(i)
    return load_audit.load_audit(
        _start(s), i.contract, tables.get("target"), tables.get("draft"), tables.get("problems")
    )


def _teacher_exactness(i: Inputs, s: Subject) -> Verdict:
    path = teacher.snapshot_path(i.teacher_snapshots, i.contract, _prompt(s))
    try:
        snapshot: dict[str, Any] | None = teacher.read(path)
    except teacher.TeacherSnapshotError as e:
        if path.exists():  # corrupted: say so rather than "missing"
            raise NotJudgeable(f"{e}; re-record with `{teacher.RECORD_COMMAND.format(name=i.contract.name)}`") from e
        snapshot = None
    return exactness.teacher_exactness(_start(s), _prompt(s), i.contract, snapshot, str(path))


def _evidence_ranks(i: Inputs, s: Subject) -> Verdict:
    start = _start(s)
    folder = i.run_dir / f"start-{start.start_index}"
    # A replayed bundle may carry the evidence without the logs: then only the evidence is judged.
    sizes = None
    if (folder / "ranks").is_dir():
        sizes = {rel: (folder / rel).stat().st_size for rel in start.logs.values() if (folder / rel).is_file()}
    return evidence_checks.evidence_ranks(start, i.contract, sizes)


def _of_rank(rule: Callable[[Evidence, int, Contract], Verdict]) -> Rule:
    """A rule of (start, rank, contract), as the catalogue calls it."""
    return lambda i, s: rule(_start(s), _rank(s), i.contract)


def _of_start(rule: Callable[[Evidence, Contract], Verdict]) -> Rule:
    """A rule of (start, contract)."""
    return lambda i, s: rule(_start(s), i.contract)


def _of_evidence(rule: Callable[[Evidence], Verdict]) -> Rule:
    """A rule of the start's evidence alone."""
    return lambda i, s: rule(_start(s))


RANKS, PROMPT_GATES, RUN_GATES, EVIDENCE = (
    "test_rank_gates.py",
    "test_prompt_gates.py",
    "test_run_gates.py",
    "test_evidence_complete.py",
)
CATALOGUE: tuple[Gate, ...] = (
    Gate("target-scale-audit", (START, TABLES), f"{RANKS}::test_target_scale_audit", _target_scale_audit),
    Gate("draft-cache-audit", (START,), f"{RANKS}::test_draft_cache_audit", _of_rank(scale_audits.draft_cache_audit)),
    Gate(
        "engine-resolution", (START,), f"{RANKS}::test_engine_resolution", _of_rank(engine_resolution.engine_resolution)
    ),
    Gate("compile-topology", (START,), f"{RANKS}::test_compile_topology", _of_rank(topology.compile_topology)),
    Gate("launch-flags", (START,), f"{RANKS}::test_launch_flags", _of_rank(engine_resolution.launch_flags)),
    Gate("teacher-exactness", (START, SNAPSHOT), f"{PROMPT_GATES}::test_teacher_exactness", _teacher_exactness),
    Gate(
        "cold-prompt",
        (START,),
        f"{PROMPT_GATES}::test_cold_prompt",
        lambda i, s: cold_prompts.cold_prompt(_start(s), _prompt(s)),
    ),
    Gate(
        "token-count",
        (START,),
        f"{PROMPT_GATES}::test_token_count",
        lambda i, s: exactness.token_count(_start(s), _prompt(s), i.contract),
    ),
    Gate("metrics-agree", (START,), f"{RUN_GATES}::test_metrics_agree", _of_start(engine_resolution.metrics_agree)),
    Gate("spec-counters", (START,), f"{RUN_GATES}::test_spec_counters", _of_start(engine_resolution.spec_counters)),
    Gate("load-audit", (START, TABLES), f"{RUN_GATES}::test_load_audit", _load_audit),
    Gate(
        "fresh-start-reproduction",
        (ALL_STARTS,),
        f"{RUN_GATES}::test_fresh_start_reproduction",
        lambda i, s: reproduction.reproduction(list(i.starts), i.contract),
    ),
    Gate(
        "evidence-start",
        (START,),
        f"{EVIDENCE}::test_the_start_succeeded",
        _of_evidence(evidence_checks.evidence_start),
    ),
    Gate("evidence-ranks", (START, FOLDER), f"{EVIDENCE}::test_every_rank_was_audited_and_logged", _evidence_ranks),
    Gate(
        "evidence-metrics",
        (START,),
        f"{EVIDENCE}::test_metrics_were_scraped_before_and_after",
        _of_evidence(evidence_checks.evidence_metrics),
    ),
    Gate(
        "evidence-prompts",
        (START, PROMPTS),
        f"{EVIDENCE}::test_every_prompt_produced_the_contract_token_count",
        lambda i, s: evidence_checks.evidence_prompts(_start(s), i.prompt_ids, i.contract),
    ),
    Gate(
        "evidence-teardown",
        (START,),
        f"{EVIDENCE}::test_teardown_left_no_process",
        _of_evidence(evidence_checks.evidence_teardown),
    ),
    Gate(
        "evidence-exposure",
        (START,),
        f"{EVIDENCE}::test_only_its_owner_could_reach_the_engine",
        _of_evidence(evidence_checks.evidence_exposure),
    ),
    Gate(
        "evidence-probe",
        (START,),
        f"{EVIDENCE}::test_the_collective_probe_passed_before_the_first_start",
        _of_start(evidence_checks.evidence_probe),
    ),
    Gate(
        "evidence-logs",
        (START,),
        f"{EVIDENCE}::test_nothing_the_launcher_found_in_the_logs_is_ignored",
        _of_evidence(evidence_checks.evidence_logs),
    ),
)
BY_NAME: dict[str, Gate] = {g.name: g for g in CATALOGUE}


def gate(name: str, added: Mapping[str, Gate] | None = None) -> Gate:
    """A gate of the catalogue, or of those other plugins `added`."""
    return BY_NAME[name] if name in BY_NAME else (added or {})[name]


def check(name: str, inputs: Inputs, subject: Subject, added: Mapping[str, Gate] | None = None) -> Verdict:
    """One gate on one subject; a check that cannot be judged is a failed verdict saying why."""
    try:
        return gate(name, added).check(inputs, subject)
    except NotJudgeable as e:
        return Verdict(name, subject.name, False, [str(e)])
