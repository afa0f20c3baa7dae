"""What every bench reports: a figure against its goal, the table they make, and the two helpers the benches
share (a timed subprocess, a checked one)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LabError


@dataclass
class Figure:
    """One row of the table: what was measured, the goal, whether it was met (None: not measurable)."""

    part: str
    measure: str
    value: float | None
    unit: str
    goal: str
    met: bool | None
    detail: str = ""
    raw: dict = field(default_factory=dict)

    def cells(self) -> list[str]:
        value = "-" if self.value is None else f"{self.value:.3f}" if self.unit == "x" else f"{self.value:.1f}"
        verdict = {True: "met", False: "MISSED", None: "n/a"}[self.met]
        return [self.part, self.measure, f"{value} {self.unit}".strip(), self.goal, verdict, self.detail]


def table(figures: Sequence[Figure]) -> str:
    rows = [["part", "measure", "figure", "goal", "", "detail"], ["---"] * 6] + [f.cells() for f in figures]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def wall(cmd: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, done


def checked(done: subprocess.CompletedProcess, what: str, ok: Sequence[int] = (0,)) -> None:
    if done.returncode not in ok:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise BenchError(f"{what} exited with {done.returncode}:\n{tail}")


class BenchError(LabError, RuntimeError):
    """A part could not be measured (the command it times failed); the message says which and why."""
