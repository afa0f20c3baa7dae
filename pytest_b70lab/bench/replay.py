"""The replay part: `pytest -m gates --b70-evidence RUN` on a saved run."""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from . import BUNDLE, REPO
from .figures import Figure, checked, wall


def replay_time(run_dir: Path = BUNDLE, repeats: int = 5) -> Figure:
    """As a user types it, from the repository root (all test folders in reach). A replay writes its verdict
    into the run folder, so it replays a copy: the recorded bundle stays as it was committed."""
    import shutil

    walls = []
    with tempfile.TemporaryDirectory(prefix="b70bench-") as tmp:
        copy = Path(tmp) / run_dir.name
        shutil.copytree(run_dir, copy)
        # `=`: pytest fixes its root folder before plugins load, and would take a separate DIR outside the
        # repository for a test path (and its root folder: the project's ini unread, the cwd collected).
        cmd = [sys.executable, "-m", "pytest", "-m", "gates", f"--b70-evidence={copy}", "-q", "-p", "no:cacheprovider"]
        for _ in range(repeats):
            seconds, done = wall(cmd, REPO)
            checked(done, f"the replay of {run_dir}")
            walls.append(seconds)
    median = statistics.median(walls)
    return Figure(
        "replay",
        f"`pytest -m gates --b70-evidence` on {run_dir.name}",
        median,
        "s",
        "< 2 s",
        median < 2,
        f"median of {repeats} (min {min(walls):.2f} s)",
        {"walls_s": walls},
    )
