"""The lab's own parallel layout, TP4 + EP4, through every gate on the mini.

The per-rank audits (scales, backend, compile topology, launch flags, load) are only fully exercised with
four ranks: a rank-indexing mistake that two ranks hide shows here. Four ranks on two cores run because
the launch turns vLLM's spinning SHM all-reduce off when the ranks outnumber the cores
(notes/2026-11-30-cpu-shm-allreduce-spins.md); before that a session took 568 s at 7 tok/s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.evidence.run_folder import read_starts

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
LAB_LAYOUT = "mini-laguna-cpu-tp4ep4"


def test_the_lab_layout_is_promotable(tmp_path: Path, b70_cache_root: Path) -> None:
    c = contract.load(LAB_LAYOUT)
    assert (c.engine.tensor_parallel, c.engine.expert_parallel) == (4, True)
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "tests" / "gates"),
            "-m",
            "gates",
            "--b70-contract",
            LAB_LAYOUT,
            f"--b70-run-dir={run}",
            "-p",
            "no:cacheprovider",
            "-q",
            "--b70-no-probe",
        ],  # the layout's audits are the point: the probe is the gates lane's (saves ~20 s)
        cwd=REPO,
        env={**os.environ, "B70LAB_CACHE_DIR": str(b70_cache_root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1500,
    )
    out = done.stdout[-8000:]
    verdict = json.loads((run / "promotion.json").read_text()) if (run / "promotion.json").exists() else {}
    assert done.returncode == 0 and verdict.get("promotable") is True, out
    starts = read_starts(run)
    assert len(starts) == c.reproduction.fresh_starts
    for start in starts:
        assert sorted(a["tp_rank"] for a in start.audits) == [0, 1, 2, 3], f"start-{start.start_index}: {out}"
    print(next(line for line in out.splitlines() if line.startswith("PROMOTABLE")))
