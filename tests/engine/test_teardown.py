"""No engine process outlives a gates session, also when the session is interrupted mid-start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
LOADING = re.compile(r"Starting to load model|Loading weights")  # the ranks exist and are loading


def _engine_processes(run_dir: Path) -> list[psutil.Process]:
    """Every process of an engine started for `run_dir`: the server runs in its start folder, and its
    children inherit that working directory."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.cwd().startswith(str(run_dir)):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_ctrl_c_during_start_up_leaves_no_engine_behind(tmp_path: Path, b70_cache_root: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "B70LAB_CACHE_DIR": str(b70_cache_root)}
    session = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gates",
            "-p",
            "no:cacheprovider",
            "-x",
            str(REPO / "tests" / "gates"),
            "-k",
            "test_evidence_complete",  # the evidence checks: the plugin's gate suite, collected in tests/gates
            f"--b70-run-dir={run_dir}",
            "--b70-no-probe",
        ],  # interrupted while the ranks load weights: the probe before them only costs time
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as a terminal delivers it: a session started from a background job inherits SIGINT ignored,
        # and Python then never raises KeyboardInterrupt (seen when CI itself ran as a background job).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = run_dir / "start-1" / "server.log"
    output = ""
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # interrupt mid-start: once the ranks load weights
            loading = log.is_file() and LOADING.search(log.read_text(errors="replace"))
            if (loading and len(_engine_processes(run_dir)) >= 2) or session.poll() is not None:
                break
            time.sleep(0.5)
        assert session.poll() is None, f"the session ended before it could be interrupted:\n{session.stdout.read()}"
        assert _engine_processes(run_dir), "no engine process was seen before the interrupt"
        session.send_signal(signal.SIGINT)
        try:
            output, _ = session.communicate(timeout=180)
        except subprocess.TimeoutExpired as e:
            session.kill()
            output = (e.output or b"").decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
            pytest.fail(f"the session did not end within 180 s of Ctrl-C:\n{output[-3000:]}")
    finally:
        if session.poll() is None:
            session.kill()
    time.sleep(2)
    left = [
        (p.pid, p.name()) for p in _engine_processes(run_dir) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert not left, f"engine processes outlived the interrupted session: {left}\n{output[-2000:]}"
    record = json.loads((run_dir / "start-1" / "evidence.json").read_text())
    assert record["status"] == "failed" and record["failure"]["message"].startswith("interrupted")
    assert record["teardown"]["clean"] is True, record["teardown"]
