"""A shard's work on its box, as the task receives it (plain data: it crosses to the box pickled).

SweepWork runs today's sweep runner on the box, unchanged, for the shard's variants, into the box-local folder:
the same starts, order, session and judging as `b70lab sweep` on one machine. GateSessionWork runs one gates
session on the box, as a lab engineer runs it there (`pytest -m gates` in the lab's folder), into the box-local
folder. RehearsalWork and GateRehearsalWork lay a recorded run folder (a committed bundle) into the folder instead,
one file at a time with a pause between: the fleet's plumbing (placement, a lost box, the ledger, the transfer, the
driver's judging) exercised end to end in a minute without an engine, and the test suite's fleet test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..contract import schema as contract_mod
from ..contract.variants import Variant
from ..engine import environment
from ..errors import LabError
from ..evidence import run_folder
from ..isolation import processes
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


RUN_DIR = "run"  # a gates session's run folder, inside its box-local folder
SESSION_LOG = "pytest.log"  # the box's pytest output, beside it
SESSION_JUNIT = "gates.xml"
SESSION_JSON = "session.json"  # how the box's pytest ended: its exit code and command


class SessionError(LabError, RuntimeError):
    """A gates session cannot start on this box: the lab's folder is not where the driver's is, or the contract
    it reads there is not the one the batch asked for."""


@dataclass(frozen=True)
class SessionOutcome:
    returncode: int  # pytest's: 0 promotable, 1 a gate failed, 2 interrupted, 3 or 4 a usage or internal error
    command: list[str]


@dataclass(frozen=True)
class GateSessionWork:
    """One gates session of one contract, run on the box as `pytest -m gates` in the lab's folder (the boxes
    hold the lab's checkout at the driver's path: the prompts, the teacher snapshots, the mini's weights are the
    lab's own files). The contract travels as text and is held to the batch's digest before anything starts."""

    contract: str  # its name, as the batch shows it
    toml: str  # the contract's TOML, as DIR/contracts/ holds it
    digest: str
    lab_dir: str  # the lab's folder on the driver: the same path on every box
    pytest_args: tuple[str, ...] = ()

    def __call__(self, folder: Path, cache_root: Path, say: Progress) -> SessionOutcome:
        lab = Path(self.lab_dir)
        if not (lab / "pyproject.toml").is_file() and not (lab / "pytest.ini").is_file():
            raise SessionError(
                f"this box has no lab folder at {lab} (no pyproject.toml or pytest.ini there): every box holds the "
                "lab's checkout at the driver's path, at the same commit (docs/fleet.md)"
            )
        path = folder / "asked" / f"{self.contract}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.toml)
        digest = contract_mod.load(path).digest  # the prompts it pins are read from the box's lab folder, checked
        if digest != self.digest:
            raise SessionError(f"{path} reads as digest {digest[:16]} on this box, the batch's is {self.digest[:16]}")
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gates",
            "-p",
            "no:cacheprovider",
            # Path values joined with '=', as bench/reproduction.py does: a separate value would be read as a path
            # argument (pytest's rootdir guess) before the plugin's options are known.
            f"--rootdir={lab}",
            f"--b70-contract={path}",
            f"--b70-run-dir={folder / RUN_DIR}",
            f"--junitxml={folder / SESSION_JUNIT}",
            *self.pytest_args,
        ]
        env = environment.without_ray(dict(os.environ))
        env["B70LAB_CACHE_DIR"] = str(cache_root)
        say(f"gates: {self.contract} on this box: {' '.join(command[1:])}")
        with open(folder / SESSION_LOG, "w") as log:
            # Its own process group, ended with the worker (a lost box's session must not keep its engines).
            child = subprocess.Popen(
                processes.dying_with_parent(command, sys.executable),
                cwd=lab,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = child.wait()
            finally:
                if child.poll() is None:  # the worker itself is being stopped: the session tears its engines down
                    processes.end_group(child, wait_s=120.0)
        outcome = SessionOutcome(returncode, command)
        (folder / SESSION_JSON).write_text(json.dumps(asdict(outcome), indent=1) + "\n")
        return outcome


@dataclass(frozen=True)
class GateRehearsalWork:
    """A gates session's folder laid from one recorded run folder, a file every `pause_s` seconds."""

    bundle: str
    pause_s: float = 0.2

    def __call__(self, folder: Path, cache_root: Path, say: Progress) -> SessionOutcome:
        source = Path(self.bundle)
        for item in sorted(p for p in source.rglob("*") if p.is_file()):
            relative = item.relative_to(source)
            if relative.parts[0] == run_folder.PROMOTION or relative.suffix == ".xml":
                continue  # the verdict is the driver's to judge, never carried over
            (folder / RUN_DIR / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, folder / RUN_DIR / relative)
            time.sleep(self.pause_s)
        say(f"rehearsal: a gates session laid from {source}")
        outcome = SessionOutcome(0, ["rehearsal", str(source)])
        (folder / SESSION_JSON).write_text(json.dumps(asdict(outcome), indent=1) + "\n")
        return outcome
