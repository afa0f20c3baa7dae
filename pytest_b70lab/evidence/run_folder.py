"""A run folder: its layout, and the one way to read it back.

    RUN/start-1/evidence.json, RUN/start-1/server.log, RUN/start-1/ranks/<tag>.log   (likewise start-2 ...)
    RUN/teacher/start-1/...      a teacher's starts (target only); RUN/reference/... the unquantized-KV reference
    RUN/checkpoint-tables.json   the tables the load and scale audits compared with (per kind folder)
    RUN/prompts.jsonl            the prompt file as it was (per kind folder): replay needs no repository
    RUN/probe/                   the collective probe before the first start
    RUN/launches.log             one line per engine launched
    RUN/progress.log             what the xdist workers said while they worked (relayed to the controller)
    RUN/promotion.json           the verdict of the last session that used the folder

The engine's starts write it (engine/starts.py), the plugin replays it, `b70lab report`, `evidence diff` and
the bench read it: all through `read`, which checks every evidence file as `evidence.record.read` does and each
against the folder it lies in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the file names are read by the plugin's verdict at any session's end: no pydantic there
    from ..contract.schema import Contract
    from .record import Evidence

PROMOTION = "promotion.json"
TABLES_COPY = "checkpoint-tables.json"
PROMPTS_COPY = "prompts.jsonl"
LAUNCHES_LOG = "launches.log"
PROGRESS_LOG = "progress.log"
PROBE_DIR = "probe"
# Written by the first xdist worker that ran a kind's starts: the others (and any later call) read the evidence.
DONE_MARK = ".collected-{kind}.json"
# The kinds kept in a folder of their own; the candidate's starts lie in the run folder itself.
KIND_FOLDERS = ("teacher", "reference")


def kind_dir(run_dir: Path, kind: str) -> Path:
    """Where a run folder keeps the candidate's files (itself), the teacher's (teacher/) or the
    unquantized-KV reference's (reference/)."""
    return Path(run_dir) / kind if kind in KIND_FOLDERS else Path(run_dir)


def start_dir(run_dir: Path, kind: str, index: int) -> Path:
    return kind_dir(run_dir, kind) / f"start-{index}"


@dataclass(frozen=True)
class Run:
    """What a run folder holds of one kind: its starts in order, and (for the candidate) the verdict."""

    folder: Path
    starts: tuple[Evidence, ...]  # start-1, start-2, ... in order
    promotion: dict[str, Any] | None  # promotion.json, when a session recorded a verdict
    notes: tuple[str, ...] = ()  # what a reader should know of the files (an old, untagged promotion.json)

    @property
    def first(self) -> Evidence:
        """The start whose tokens stand for the run: the first that completed, else the first."""
        return next((s for s in self.starts if s.status == "ok"), self.starts[0])


def read(folder: Path, kind: str = "candidate", verdict: bool = True) -> Run:
    """Every start-N/evidence.json of `kind` in start order (each checked as `evidence.record.read` does, against
    the folder it lies in, and an interleaved session's starts against each other: evidence.timeline) and, with `verdict`, RUN/promotion.json (None when no session recorded one). Any
    problem is an EvidenceError naming the file; a folder without starts is not one (the caller says what it
    needs)."""
    from . import record as evidence
    from .record import EvidenceError

    folder = Path(folder)
    if not folder.is_dir():
        raise EvidenceError(f"no run folder at {folder}")
    base = kind_dir(folder, kind)
    numbered = sorted(
        (int(p.name.removeprefix("start-")), p)
        for p in base.glob("start-*")
        if p.is_dir() and p.name.removeprefix("start-").isdigit()
    )
    starts = []
    for index, folder_of_start in numbered:
        start = evidence.read(folder_of_start / evidence.FILENAME)
        if start.start_index != index:
            raise EvidenceError(
                f"{folder_of_start / evidence.FILENAME} records start {start.start_index}, but lies "
                f"in {folder_of_start.name}: the run folder was rearranged"
            )
        starts.append(start)
    from .timeline import SHOWN, session_contradictions

    if contradictions := session_contradictions(starts):
        raise EvidenceError(
            f"the interleaved starts under {base} contradict each other (refused; the evidence cannot be trusted): "
            + "; ".join(contradictions[:SHOWN])
            + (f"; and {len(contradictions) - SHOWN} more" if len(contradictions) > SHOWN else "")
        )
    promotion, notes = read_promotion(folder) if verdict else (None, [])
    return Run(folder, tuple(starts), promotion, tuple(notes))


def read_promotion(folder: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """(promotion.json through its model, as a dict; what a reader should know of it), (None, []) when no
    session recorded one. A damaged or foreign file is an EvidenceError naming it."""
    from . import promotion
    from .record import EvidenceError

    path = Path(folder) / PROMOTION
    if not path.exists():
        return None, []
    try:
        document, notes = promotion.read(path)
    except promotion.PromotionError as e:
        raise EvidenceError(str(e)) from e
    return document.model_dump(mode="json", by_alias=True), notes


def read_starts(folder: Path, kind: str = "candidate") -> list[Evidence]:
    """The saved starts of `kind`, for replay with no engine: at least one, or an EvidenceError. The folder's
    promotion.json is not read: the replay writes its own."""
    from .record import FILENAME, EvidenceError

    starts = read(folder, kind, verdict=False).starts
    if not starts:
        raise EvidenceError(f"no {kind} evidence under {kind_dir(Path(folder), kind)} (expected start-N/{FILENAME})")
    return list(starts)


def tables_path(run_dir: Path, contract: Contract) -> Path:
    """Where a run folder keeps the checkpoint tables of `contract`'s kind: a kind's own folder in a session's
    run folder; the folder itself where a teacher or reference run is a run folder of its own (a sweep's
    target-only variant, the recorded teacher bundle)."""
    paths = [kind_dir(run_dir, contract.kind) / TABLES_COPY, Path(run_dir) / TABLES_COPY]
    return next((p for p in paths if p.is_file()), paths[0])


def read_tables(run_dir: Path, contract: Contract) -> dict[str, Any] | None:
    """The run folder's copy of the checkpoint tables (None when it has none), checked against the contract it
    was written for and against itself: an EvidenceError naming the file otherwise."""
    from . import checkpoint
    from . import record as evidence

    path = tables_path(run_dir, contract)
    if not path.is_file():
        return None
    tables = evidence.read_json(path, "checkpoint tables", evidence.EvidenceError)
    if not isinstance(tables, dict) or "target" not in tables:
        raise evidence.EvidenceError(f"checkpoint tables {path} have no target table: the file is damaged")
    if tables.get("contract_digest") != contract.digest:
        raise evidence.EvidenceError(
            f"checkpoint tables {path} were written for contract digest "
            f"{tables.get('contract_digest')}, this run is {contract.name} "
            f"({contract.digest})"
        )
    found = [
        problem
        for part in ("target", "draft")
        if isinstance(tables.get(part), dict)
        for problem in checkpoint.table_contradictions(tables[part], part)
    ]
    if found:
        raise evidence.EvidenceError(
            f"checkpoint tables {path}: {found[0]}"
            + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
            + ": the copy contradicts itself, so no gate is judged against it"
        )
    return tables
