"""`b70lab sweep --fleet ADDRESS`: the sweep cut into shards (plan.json), each shard run on a box by the fleet's
driver, and every variant judged here, in the shard it was measured in, with the same judge as on one machine.
One table: a row per (shard, variant), each shard's own base first, each variant's paired figure against its own
shard's base, every row naming its box and host class."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import schema as contract_mod
from ..contract.variants import Variant
from ..evidence import host, run_folder
from ..evidence.record import EvidenceError
from ..sweep import plan, runner, table
from . import driver, shards
from .ledger import Ledger
from .work import RehearsalWork, SweepWork

Progress = Callable[[str], None]


@dataclass
class FleetOutcome:
    shards: list[shards.Shard]
    results: dict[str, driver.ShardResult]
    judged: dict[str, dict[str, str]] = field(default_factory=dict)  # shard -> variant -> why not judged ("")
    problems: list[str] = field(default_factory=list)

    def merged(self) -> runner.Outcome:
        """The shards' outcomes as one, each start named by its shard: what sweep.json's order and status keep."""
        order, status = [], {}
        for s in self.shards:
            result = self.results.get(s.name)
            if result is None:
                continue
            for p in result.outcome.order:
                named = plan.PlannedStart(p.round, f"{s.name}/{p.variant}", p.index, p.own_teacher)
                order.append(named)
                status[named.label()] = result.outcome.status.get(p.label(), "not run")
        merged = runner.Outcome(order, status)
        merged.judged = {f"{s}/{v}": why for s, per in self.judged.items() for v, why in per.items()}
        return merged


def sweep_id(out: Path) -> str:
    """The name a sweep's shards have on every box: the folder's name and a digest of its plan."""
    return f"{Path(out).name}-{hashlib.sha256((Path(out) / plan.PLAN_JSON).read_bytes()).hexdigest()[:12]}"


def plan_shards(out: Path, grid: list[Variant], shard_size: int, resume: bool) -> list[shards.Shard]:
    if resume:
        record = runner.read_plan(out)
        runner.check_resumable(out, grid, record)
        return shards.from_plan(record, [v.name for v in grid])
    return shards.split([v.name for v in grid], shard_size)


def sweep_work(
    grid: list[Variant], s: shards.Shard, rounds: int, schedule: str, prompt_ids: list[str] | None, probe: bool
) -> SweepWork:
    by_name = {v.name: v for v in grid}
    chosen = [by_name[n] for n in s.variants]
    return SweepWork(
        contracts={v.name: contract_mod.to_toml(v.contract) for v in chosen},
        changes={v.name: dict(v.changes) for v in chosen},
        rounds=rounds,
        schedule=schedule,
        prompt_ids=prompt_ids,
        probe=probe,
        asked={"shard": s.name},
    )


def run(
    grid: list[Variant],
    out: Path,
    address: str,
    work_of: Callable[[shards.Shard], SweepWork | RehearsalWork],
    shard_list: list[shards.Shard],
    asked: dict[str, Any],
    say: Progress,
    *,
    resume: bool = False,
    host_class: str | None = None,
    cache_root: Path,
    prompt_ids: list[str] | None = None,
) -> FleetOutcome:
    """Plan (unless resumed), run the shards not yet finished, judge every variant of every shard here."""
    out = Path(out)
    driver.reachable(address)  # before anything is written: a wrong address leaves no sweep folder behind
    if not resume:
        runner.prepare(out, grid, {**asked, "fleet": address, "shards": [s.as_plan() for s in shard_list]})
    ledger = Ledger(out)
    kept = {s.name for s in shard_list if ledger.finished(s.name) and (out / shards.SHARDS_DIR / s.name).is_dir()}
    for s in shard_list:
        folder = out / shards.SHARDS_DIR / s.name
        if s.name in kept and (done := ledger.finished(s.name)) is not None:
            say(f"fleet: {s.name} kept from the interrupted sweep (finished on {done.box})")
        elif folder.exists():
            raise runner.SweepError(f"{folder} exists but the ledger has no finished attempt of {s.name}: move it away")
    driver.connect(address)
    outcome = FleetOutcome(shard_list, {})
    todo = [s for s in shard_list if s.name not in kept]
    try:
        outcome.results = driver.run_shards(sweep_id(out), todo, work_of, out, ledger, say, host_class)
    except driver.FleetError as e:
        outcome.problems.append(str(e))
    finally:
        driver.disconnect()
    for s in shard_list:
        if s.name in kept:
            outcome.results[s.name] = _kept_result(out, s, ledger)
    return outcome


def _kept_result(out: Path, s: shards.Shard, ledger: Ledger) -> driver.ShardResult:
    event = ledger.finished(s.name)
    assert event is not None
    folder = out / shards.SHARDS_DIR / s.name
    order, status = [], {}
    for v in s.variants:  # each start's status as its evidence says it, read again (never taken from the ledger)
        for start in _read_starts(_shard_sweep(folder) / plan.VARIANTS / v):
            planned = runner.PlannedStart(start.start_index, v, start.start_index)
            order.append(planned)
            status[planned.label()] = runner.ended_status(start) or "not run: interrupted"
    return driver.ShardResult(s.name, event.attempt, {"label": event.box}, folder, runner.Outcome(order, status), {})


def _read_starts(variant: Path) -> list[Any]:
    try:
        return list(run_folder.read_starts(variant))
    except EvidenceError:  # the variant's row says why its folder does not read (table._read)
        return []


def _shard_sweep(folder: Path) -> Path:
    return folder / "sweep"


def judge_and_tabulate(
    outcome: FleetOutcome, grid: list[Variant], prompt_ids: list[str] | None, cache_root: Path, say: Progress
) -> list[table.Row]:
    """Every variant judged in its shard's folder, then the rows: grouped by host class, within it by shard, each
    shard's base first."""
    by_name = {v.name: v for v in grid}
    base = grid[0]
    rows: list[table.Row] = []
    for s in outcome.shards:
        result = outcome.results.get(s.name)
        if result is None:
            continue
        where = _shard_sweep(result.folder)
        chosen = [by_name[n] for n in s.variants]
        own = {v.name for v in chosen if runner.needs_own_teacher(v, base.contract)}
        judged = outcome.judged.setdefault(s.name, {})
        for v in chosen:
            judged[v.name] = _box_contract_differs(where, v) or runner.judge(
                v, where, prompt_ids, v.name in own, cache_root, progress=say
            )
        for row in table.rows(where, base, chosen, judged, getattr(result.outcome, "alone", {})):
            row.shard = s.name
            row.folder = str(Path(shards.SHARDS_DIR) / s.name / "sweep" / row.folder)
            row.host_class = _row_class(where / plan.VARIANTS / row.variant)
            rows.append(row)
    return sorted(rows, key=lambda r: (r.host_class or "", r.shard or "", not r.is_base))


def _box_contract_differs(where: Path, v: Variant) -> str:
    """Why the box's copy of the variant's contract is not the plan's ("" where it is): the box judged nothing
    the driver did not ask for."""
    path = plan.contract_file(where, v.name)
    try:
        digest = contract_mod.load(path).digest
    except contract_mod.ContractError as e:
        return f"{path}: {str(e).splitlines()[0]}"
    return "" if digest == v.contract.digest else f"{path} is digest {digest[:16]}, the plan's {v.contract.digest[:16]}"


def _row_class(variant_folder: Path) -> str | None:
    starts = _read_starts(variant_folder)
    labels = {host.start_class(s).label for s in starts}
    return labels.pop() if len(labels) == 1 else ("mixed: " + "; ".join(sorted(labels)) if labels else None)
