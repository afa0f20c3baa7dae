"""A sweep's folder and the order of its starts.

DIR/contracts/<variant>.toml     each variant's full contract, as the replay that judged it loaded it
DIR/variants/<variant>/          the variant's run folder (start-N/, promotion.json, judge.log: its verdict's lines)
DIR/variants/<variant>/teacher/  its own target-only teacher, when its target's output is not the base's
DIR/teachers/teacher-<digest>/   the snapshots recorded from those teachers (never the repository's)
DIR/probe/, DIR/launches.log     the collective probe before the first start; one line per engine launched
DIR/sweep.json, sweep.html, sweep-junit.xml   the table, its page, one JUnit test per variant
DIR/plan.json                    what the sweep was asked for, written first: `b70lab sweep --resume DIR` reads it
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

SWEEP_JSON = "sweep.json"
PLAN_JSON = "plan.json"
PLAN_SCHEMA = "b70lab.sweep-plan"
# Spelled as the evidence's (`b70lab.evidence`, version N); until 2026-12-03 it read "b70lab-sweep/1".
SWEEP_SCHEMA, SWEEP_VERSION = "b70lab.sweep", 1
SWEEP_HTML = "sweep.html"
JUNIT = "sweep-junit.xml"
CONTRACTS = "contracts"
VARIANTS = "variants"
TEACHERS = "teachers"
JUDGE_LOG = "judge.log"


def variant_dir(out: Path, name: str) -> Path:
    return Path(out) / VARIANTS / name


def contract_file(out: Path, name: str) -> Path:
    return Path(out) / CONTRACTS / f"{name}.toml"


def teachers_dir(out: Path) -> Path:
    return Path(out) / TEACHERS


@dataclass(frozen=True)
class PlannedStart:
    round: int  # 1-based
    variant: str
    index: int  # start-N within the variant's folder (or its teacher/ folder)
    own_teacher: bool = False

    def label(self) -> str:
        return f"{self.variant}{' teacher' if self.own_teacher else ''} start-{self.index}"


def start_order(
    names: Sequence[str], rounds: int, own_teachers: Collection[str] = (), session: Collection[str] = ()
) -> list[PlannedStart]:
    """Round 1 in the given order, round 2 reversed, round 3 as round 1 ... (A B C, C B A, A B C): whatever
    the machine drifts by over the sweep falls on every variant alike, and no variant always runs first or
    last. A variant's own teacher (one start: it only has to record the target's output) runs at the end of
    round 1, before any variant's second start. The starts of an interleaved sweep's `session` come last, in
    the same alternating order: the order they are launched in, to be alive together."""
    if rounds < 1:
        raise ValueError(f"a sweep needs at least one round, not {rounds}")

    def one_round(group: list[str], r: int) -> list[PlannedStart]:
        return [PlannedStart(r, name, r) for name in (group if r % 2 else list(reversed(group)))]

    order: list[PlannedStart] = []
    for r in range(1, rounds + 1):
        order += one_round([n for n in names if n not in session], r)
        if r == 1:
            order += [PlannedStart(1, name, 1, own_teacher=True) for name in names if name in own_teachers]
    members = [n for n in names if n in session]
    return order + [p for r in range(1, rounds + 1) for p in one_round(members, r)]
