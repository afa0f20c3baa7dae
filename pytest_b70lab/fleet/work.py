"""A shard's work on its box, as the task receives it (plain data: it crosses to the box pickled).

SweepWork runs today's sweep runner on the box, unchanged, for the shard's variants, into the box-local folder:
the same starts, order, session and judging as `b70lab sweep` on one machine. RehearsalWork lays a recorded run
folder (a committed bundle) into the shard's folder for each variant, one file at a time with a pause between:
the fleet's plumbing (placement, a lost box, the ledger, the transfer, the driver's judging) exercised end to end
in a minute without an engine, and the test suite's fleet test."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import schema as contract_mod
from ..contract.variants import Variant
from ..evidence import run_folder
from ..judge import replay
from ..sweep import plan, runner

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepWork:
    """The shard's variants (base first) as full contracts in TOML, with what each changes."""

    contracts: dict[str, str]  # variant name -> its contract's TOML, as DIR/contracts/ holds it
    changes: dict[str, dict[str, Any]]
    rounds: int
    schedule: str
    prompt_ids: list[str] | None = None
    probe: bool = True
    asked: dict[str, Any] = field(default_factory=dict)

    def variants(self, folder: Path) -> list[Variant]:
        """The variants, each contract read back through the loader from a file (to the digest plan.json names)."""
        found = []
        for name, text in self.contracts.items():
            path = folder / "asked" / f"{name}.toml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            found.append(Variant(name, contract_mod.load(path), self.changes.get(name, {})))
        return found

    def __call__(self, folder: Path, cache_root: Path, say: Progress) -> runner.Outcome:
        grid = self.variants(folder)
        out = folder / "sweep"
        return runner.run(
            grid[0].contract,
            grid,
            self.rounds,
            out,
            cache_root,
            say,
            self.prompt_ids,
            probe=self.probe,
            asked=self.asked,
            schedule=self.schedule,
        )


@dataclass(frozen=True)
class RehearsalWork:
    """Every variant of the shard laid from one recorded run folder, a file every `pause_s` seconds."""

    bundle: str  # a run folder (a committed evidence bundle)
    variants: tuple[str, ...]
    pause_s: float = 0.2

    def __call__(self, folder: Path, cache_root: Path, say: Progress) -> runner.Outcome:
        source = Path(self.bundle)
        starts = run_folder.read_starts(source)
        contract = replay.recorded_contract(starts, source)
        out = folder / "sweep"
        order = []
        for name in self.variants:
            path = plan.contract_file(out, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(contract_mod.to_toml(contract))
            target = plan.variant_dir(out, name)
            for item in sorted(p for p in source.rglob("*") if p.is_file()):
                relative = item.relative_to(source)
                if relative.parts[0] == run_folder.PROMOTION or relative.suffix == ".xml":
                    continue  # a verdict is the driver's to write, never carried over
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target / relative)
                time.sleep(self.pause_s)
            order += [plan.PlannedStart(1, name, s.start_index) for s in starts]
            say(f"rehearsal: {name} laid from {source}")
        outcome = runner.Outcome(order, status={p.label(): "ok" for p in order})
        return outcome
