"""The overhead part: `pytest -m gates` wall time against a bare script making the same starts and requests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from . import REPO
from .figures import Figure, checked, wall
from .start import bare_starts


def gates_overhead(contract_name: str, cache_root: Path, out_dir: Path, say: Callable[[str], None] = print) -> Figure:
    say("overhead: pytest -m gates")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gates",
        "-m",
        "gates",
        f"--b70-contract={contract_name}",
        f"--b70-run-dir={out_dir / 'gates'}",
        f"--b70-cache-dir={cache_root}",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
    ]
    gates_s, done = wall(cmd, REPO)
    (out_dir / "gates.log").write_text(done.stdout + done.stderr)
    checked(done, "pytest -m gates", ok=(0, 1))  # a NOT PROMOTABLE verdict still costs what it costs
    say(f"overhead: pytest -m gates took {gates_s:.1f} s; now the bare script")
    bare_s = bare_starts(contract_name, cache_root, out_dir, say)
    ratio = gates_s / bare_s
    return Figure(
        "overhead",
        "`pytest -m gates` wall / bare starts + requests",
        ratio,
        "x",
        "<= 1.05",
        ratio <= 1.05,
        f"{gates_s:.1f} s vs {bare_s:.1f} s",
        {"gates_s": gates_s, "bare_s": bare_s},
    )
