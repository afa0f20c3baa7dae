"""A real fleet sweep with engines on a real Ray cluster on loopback (a head and two box nodes sharing this machine:
its lock measures one shard at a time): `b70lab sweep --fleet` of two variants in two shards, the box of the shard
being measured killed while its engines run, the driver interrupted (SIGINT) while the shard runs again on the
other box, then `b70lab sweep --resume`. Run by test_fleet_engine.py inside a network namespace that holds only
loopback. Writes what it saw as JSON to REPORT; the sweep's folder is WORKDIR/sweep.

Usage: python engine_cluster.py WORKDIR REPORT.json CACHE_ROOT"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
CONTRACT = "mini-laguna-cpu-int4"
VARY = "speculative.num_speculative_tokens=9,10"  # speculation only: the base's teacher judges both
PROMPTS = "code-publish-ladder,tool-convert-ladder"  # a smoke sweep: two prompts, one round (verdicts incomplete)
INTO_ENGINES_S = 25.0  # how far into a shard's engine starts the kill and the interrupt come
WAIT_S = 900.0  # the longest any one step may take


def b70lab(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "b70lab"), *args]


def engines(cache_root: Path) -> list[psutil.Process]:
    """The engine processes of fleet shards on this machine: they run in a start's folder, under the boxes' cache
    root (the fault matrix finds a session's engines by their folder the same way)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.cwd().startswith(str(cache_root / "fleet")) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_for(what: str, check, timeout_s: float = WAIT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.5)
    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")


def events(out: Path) -> list:
    from pytest_b70lab.fleet.ledger import Ledger, LedgerError

    try:
        return Ledger(out).events if (out / "fleet.json").is_file() else []
    except LedgerError:
        return []  # being written


def measuring(out: Path, cache_root: Path):  # type: ignore[no-untyped-def]
    """(shard, attempt, box label) of the attempt that holds the machine and has an engine up, or None."""
    from pytest_b70lab.fleet import box
    from pytest_b70lab.fleet import sweep as fleet_sweep

    if not (out / "plan.json").is_file() or not engines(cache_root):
        return None
    sweep = fleet_sweep.sweep_id(out)
    for e in reversed(events(out)):
        if e.event == "started" and box.shard_folder(cache_root, sweep, e.shard, e.attempt).is_dir():
            return e.shard, e.attempt, e.box.split()[1]
    return None


def gone_within(pids: list[int], timeout_s: float) -> list[int]:
    """Of `pids`, those still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if not alive:
            return []
        time.sleep(0.5)
    return alive


def main(work: Path, report_path: Path, cache_root: Path) -> int:
    from ray_netns import start_cluster

    report: dict = {}
    cluster, boxes = start_cluster(work, {"box-a": cache_root, "box-b": cache_root})
    out = work / "sweep"
    try:
        sweep = b70lab("sweep", "--contract", CONTRACT, "--vary", VARY, "--prompts", PROMPTS, "--rounds", "1")
        sweep += ["--shard-size", "1", "--out", str(out), "--fleet", cluster.address]
        with open(work / "driver.log", "w") as log:
            driver = subprocess.Popen(sweep, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            # 1. The box of the shard being measured, killed while its engines run.
            shard, attempt, label = wait_for("a shard's engines", lambda: measuring(out, cache_root))
            time.sleep(INTO_ENGINES_S)
            running = [p.pid for p in engines(cache_root)]
            cluster.remove_node(boxes[label], allow_graceful=False)
            report["killed"] = {"shard": shard, "attempt": attempt, "box": label, "engines": running}
            report["killed"]["left_after_60_s"] = gone_within(running, 60.0)
            # 2. The driver interrupted while that shard runs again, on the other box.
            again = wait_for(
                f"{shard} running again",
                lambda: (m := measuring(out, cache_root)) and m[0] == shard and m[1] > attempt and m,
            )
            time.sleep(INTO_ENGINES_S)
            running = [p.pid for p in engines(cache_root)]
            driver.send_signal(signal.SIGINT)
            report["interrupted"] = {"shard": again[0], "attempt": again[1], "box": again[2], "engines": running}
            report["interrupted"]["returncode"] = driver.wait(timeout=300)
            report["interrupted"]["left_after_120_s"] = gone_within(running, 120.0)
        report["ledger_interrupted"] = [e.__dict__ for e in events(out)]
        # 3. Resumed: the finished shard kept, the interrupted one run again.
        with open(work / "resume.log", "w") as log:
            resumed = subprocess.run(
                b70lab("sweep", "--resume", str(out)), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )
        report["resumed"] = {"returncode": resumed.returncode}
        report["ledger"] = [e.__dict__ for e in events(out)]
        report["engines_left"] = [p.pid for p in engines(cache_root)]
    except BaseException:
        # Ray's own shutdown output would bury the cause: it goes into the report first.
        report["error"] = traceback.format_exc()
        raise
    finally:
        report_path.write_text(json.dumps(report, indent=1, default=str))
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    # A child started from here must take SIGINT as Ctrl-C: a shell that started this script in the background may
    # have left SIGINT ignored, which exec keeps.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
