"""The fault matrix: real faults injected into real engine starts (pytest_b70lab/in_engine/faults.py, armed by
B70LAB_FAULT), and pytest itself interrupted, each in its own gates session run as a user runs it.

Every row asserts the same four things: the session ends within its start deadline plus 30 s; the verdict is
`NOT PROMOTABLE: start-1 ...` naming the phase (and, where vLLM says it, the rank); the start's
evidence.json has status failed with every rank's last lines; and no process of the engine is left, checked
by working directory, pid and process group. Rows marked `ci` run in `make test`; `pytest -m faults` runs
them all (notes/2026-11-30-fault-matrix.md has the table).

Four rows are faults the machine causes (at the end: the kernel's OOM killer, a full disk under the run folder,
a /dev/shm too small, a corrupted compile cache), made with what the kernel offers; each skips naming why where
this machine refuses it (notes/2026-12-04-faults-the-machine-causes.md).

One row of another kind fails no start: it slows start-2 alone, and fresh-start reproduction must catch it
(test_a_slower_second_start_fails_reproduction, in `make test`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from pytest_b70lab.contract import schema as contract_mod
from pytest_b70lab.engine import disk, probe

pytestmark = pytest.mark.faults
REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "fixtures" / "contracts" / "mini-laguna-cpu.toml"
GATES = REPO / "tests" / "gates"
# The evidence checks alone (the gate suite is the plugin's, collected in tests/gates: plugin/collect.py).
SMOKE = (str(GATES), "-k", "test_evidence_complete")


@dataclass
class Row:
    id: str
    fault: str | None  # B70LAB_FAULT, or None
    start_s: float  # the contract's start deadline for this row
    verdict: str  # regex the verdict line must match
    ci: bool = False
    args: list[str] = field(default_factory=list)
    signal: int | None = None  # sent to pytest once `when` is seen in the start's server.log
    when: str | None = None
    engine_starts: bool = True  # False: the row must stop before any engine process exists
    rank_tails: bool = True  # False: the row ends before the ranks exist (only the server's lines)
    absent: tuple[str, ...] = ()  # what the verdict line must not say
    # The preflight probe runs in the rows about it; every other row passes --b70-no-probe: the probe is
    # theirs to test, and each row would spend its ~10 s before the start the row is about.
    probe: bool = False


# Serving the smoke test's prompts takes ~7 s: an interrupt "during decode" sent at the first completion could
# land after start-1 had finished serving (CI saw start-1 `ok` and the interrupt in start-2). Rank 0's steps are
# stretched 10x, so the interrupt finds start-1 decoding.
SLOW_SERVING = "slow-decode:0:900"

ROWS = [
    Row(
        "probe-catches-collective-stall",
        "collective-stall:1",
        120,
        r"NOT PROMOTABLE: start-1 could not begin: collective probe failed: rank 0: stopped after entered, never "
        r"completed; rank 1: stopped after entered, never completed; the all_reduce did not complete within 20 s",
        ci=True,
        engine_starts=False,
        probe=True,
    ),
    Row(
        "collective-stall-without-probe",
        "collective-stall:1",
        75,
        r"NOT PROMOTABLE: start-1 failed while [\w ]+: the server was not ready within the 75 s start-up deadline",
    ),
    Row(
        "rank-dies-loading-weights",
        "die-loading:1",
        240,
        r"NOT PROMOTABLE: start-1 failed while [\w ]+: the server exited with code \d+ during start-up.*; "
        r"cause( on [\w\-]+)?: .+",
    ),
    # A rank's exception names the failure, whatever its class: not the engine core's "WorkerProc initialization
    # failed ... See stack trace for root cause", nor a bare "Traceback" line.
    Row(
        "rank-raises-loading-weights",
        "raise-loading:1",
        240,
        r"NOT PROMOTABLE: start-1 failed while [\w ]+: the server exited with code \d+ during start-up.*; "
        r"cause on Worker_TP1[\w\-]*: [\w.]*InjectedFault: b70lab fault injected: rank 1 cannot load its weights",
        ci=True,
        absent=("root cause", "Traceback"),
    ),
    # As on a CPU without AVX-512, where the refusal comes after the compile warm-up (~2.5 min here: not in
    # make test's budget): not the executor's "died unexpectedly" that follows it, nor a bare "Traceback".
    Row(
        "rank-raises-allocating-kv-cache",
        "raise-kv-cache:1",
        240,
        r"NOT PROMOTABLE: start-1 failed while [\w ]+: the server exited with code \d+ during start-up.*; "
        r"cause on Worker_TP1[\w\-]*: NotImplementedError: b70lab fault injected: rank 1 refuses its FP8 KV cache",
        absent=("died unexpectedly", "Traceback"),
    ),
    Row(
        "rank-killed-mid-decode",
        "die-decode:1:20",
        240,
        r"NOT PROMOTABLE: start-1 failed while serving the gate prompts: .*",
        ci=True,
    ),
    Row(
        "engine-core-exits",
        "engine-core-exit:20",
        240,
        r"NOT PROMOTABLE: start-1 failed while serving the gate prompts: .*",
    ),
    Row(
        "stream-cut-mid-response",
        "stream-cut:10",
        240,
        r"NOT PROMOTABLE: start-1 failed while serving the gate prompts: .*",
    ),
    Row(
        "never-ready",
        None,
        12,
        r"NOT PROMOTABLE: start-1 failed while [\w ]+: the server was not ready within the 12 s start-up deadline",
        ci=True,
        rank_tails=False,
    ),
    Row("sigint-during-start-up-n0", None, 240, r"", signal=signal.SIGINT, when="loading weights"),
    Row("sigterm-during-start-up-n0", None, 240, r"", signal=signal.SIGTERM, when="loading weights", ci=True),
    Row(
        "sigint-during-the-probe-n0",
        None,
        240,
        r"",
        signal=signal.SIGINT,
        when="probing",
        engine_starts=False,
        probe=True,
    ),
    Row(
        "sigterm-during-the-probe-n2",
        None,
        240,
        r"",
        signal=signal.SIGTERM,
        when="probing",
        engine_starts=False,
        args=["-n", "2"],
        probe=True,
    ),
    Row("sigint-during-start-up-n2", None, 240, r"", signal=signal.SIGINT, when="loading weights", args=["-n", "2"]),
    Row("sigterm-during-start-up-n2", None, 240, r"", signal=signal.SIGTERM, when="loading weights", args=["-n", "2"]),
    Row("sigint-during-decode-n0", SLOW_SERVING, 240, r"", signal=signal.SIGINT, when="serving"),
    Row("sigterm-during-decode-n0", SLOW_SERVING, 240, r"", signal=signal.SIGTERM, when="serving"),
    Row("sigint-during-decode-n2", SLOW_SERVING, 240, r"", signal=signal.SIGINT, when="serving", args=["-n", "2"]),
    Row(
        "sigterm-during-decode-n2",
        SLOW_SERVING,
        240,
        r"",
        signal=signal.SIGTERM,
        when="serving",
        args=["-n", "2"],
        ci=True,
    ),
    Row(
        "rank-killed-mid-decode-n2",
        "die-decode:1:20",
        240,
        r"NOT PROMOTABLE: start-1 failed while serving the gate prompts: .*",
        args=["-n", "2"],
    ),
]
# When to interrupt: a file of the run folder and what it must show by then.
WHEN = {
    "probing": ("probe/rank-1.jsonl", re.compile(r'"stage": "initialized"')),
    "loading weights": ("start-1/server.log", re.compile(r"Starting to load model|Loading weights")),
    "serving": ("start-1/server.log", re.compile(r"\"POST /v1/completions HTTP")),
}


def _fault_contract(tmp_path: Path, start_s: float, schedule: str = "sequential", passes: int | None = None) -> Path:
    """The mini contract with the row's start-up deadline. The faults are of one start at a time, so the rows
    run it sequentially (the interleaved schedule would also start, and then end, a second engine around each
    fault); the slowdown row keeps the contract's interleaved schedule and tolerance, with its own passes."""
    text = CONTRACT.read_text()
    text = re.sub(r"(?m)^start_s = .*$", f"start_s = {start_s:g}", text)
    if schedule == "sequential":
        text = re.sub(r"(?m)^(schedule|passes) = .*\n", "", text)
    elif passes is not None:
        text, n = re.subn(r"(?m)^passes = .*$", f"passes = {passes}", text)
        assert n == 1, "the mini contract has no [reproduction] passes to set"
    path = tmp_path / "mini-laguna-cpu-fault.toml"
    path.write_text(text)
    return path


def _engine_processes(run_dir: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.cwd().startswith(str(run_dir)) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _probe_ranks(run_dir: Path) -> list[psutil.Process]:
    """The preflight probe's rank processes of this run (they run in the repository, named by their folder)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if probe.RANK_MODULE in cmd and any(str(run_dir) in a for a in cmd):
            found.append(p)
    return found


def _run(
    row: Row,
    tmp_path: Path,
    cache_root: Path,
    tests: tuple[str, ...] = SMOKE,
    contract: Path | None = None,
    env_extra: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    watch: Callable[[Path], None] | None = None,
) -> tuple[int, str, float, Path, list[int]]:
    """The row's gates session as a user runs it; `prefix` wraps its command (a private mount namespace),
    `watch` is called with the run folder every half second while it runs (to fill its disk, ...)."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "B70LAB_CACHE_DIR": str(cache_root), **(env_extra or {})}
    env.pop("B70LAB_FAULT", None)
    if row.fault:
        env["B70LAB_FAULT"] = row.fault
    contract = contract or _fault_contract(tmp_path, row.start_s)
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gates",
        *tests,
        "-p",
        "no:cacheprovider",
        "-q",
        f"--b70-contract={contract}",
        f"--b70-run-dir={run_dir}",
        *row.args,
        *([] if row.probe else ["--b70-no-probe"]),
    ]
    t0 = time.monotonic()
    # Its own process group: SIGINT goes to the whole group, as a terminal's Ctrl-C does; SIGTERM to the
    # pytest process alone, as a cancelled CI job or `kill` does.
    session = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen_pids: set[int] = set()
    limit = row.start_s + 30 + 120  # the session's own deadline + 30 s, plus the probe and imports before it
    try:
        if row.signal is not None:
            relative, pattern = WHEN[row.when]
            while time.monotonic() - t0 < limit and session.poll() is None:
                log = run_dir / relative
                text = log.read_text(errors="replace") if log.is_file() else ""
                seen_pids |= {p.pid for p in _engine_processes(run_dir)} | {p.pid for p in _probe_ranks(run_dir)}
                engine_up = row.when == "probing" or len(_engine_processes(run_dir)) >= 2
                if pattern.search(text) and engine_up:
                    break
                time.sleep(0.3)
            if session.poll() is not None:
                early = session.communicate()[0]
                pytest.fail(f"{row.id}: the session ended before it could be interrupted:\n{early[-3000:]}")
            if row.signal == signal.SIGINT:
                os.killpg(session.pid, signal.SIGINT)
            else:
                session.send_signal(row.signal)
        while session.poll() is None and time.monotonic() - t0 < limit:
            seen_pids |= {p.pid for p in _engine_processes(run_dir)} | {p.pid for p in _probe_ranks(run_dir)}
            if watch is not None:
                watch(run_dir)
            time.sleep(0.5)
        out = session.communicate(timeout=max(1.0, limit - (time.monotonic() - t0)))[0]
    except subprocess.TimeoutExpired:
        session.kill()
        pytest.fail(f"{row.id}: the session outlived its limit of {limit:.0f} s")
    return session.returncode, out, time.monotonic() - t0, run_dir, sorted(seen_pids)


def _verdict_line(out: str) -> str:
    lines = out.split("b70lab promotion verdict", 1)[-1].splitlines()
    return next((line for line in lines if line.startswith("NOT PROMOTABLE") or line.startswith("PROMOTABLE")), "")


def _in_budget(row: Row, request: pytest.FixtureRequest) -> None:
    if not row.ci and (request.config.getoption("-m") or "").strip() != "faults":
        pytest.skip("not in make test's budget: run `pytest -m faults` for the whole matrix")


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_fault(row: Row, request: pytest.FixtureRequest, tmp_path: Path, b70_cache_root: Path) -> None:
    _in_budget(row, request)
    code, out, wall, run_dir, pids = _run(row, tmp_path, b70_cache_root)
    _check_ended(row, code, out, wall, run_dir, pids)


def _check_no_orphans(row: Row, out: str, run_dir: Path, pids: list[int]) -> None:
    time.sleep(2)
    left = [(p.pid, p.name()) for p in _engine_processes(run_dir)]
    assert not left, f"{row.id}: engine processes outlived the session: {left}\n{out[-3000:]}"
    still = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not still, f"{row.id}: pids seen during the run are still alive: {still}"


def _check_ended(row: Row, code: int, out: str, wall: float, run_dir: Path, pids: list[int]) -> None:
    """What every row of the matrix asserts (the module's docstring)."""
    _check_no_orphans(row, out, run_dir, pids)
    assert code != 0, out[-3000:]
    limit = row.start_s + 30 + 120
    assert wall < limit, f"{row.id}: {wall:.0f} s"
    evidence_file = run_dir / "start-1" / "evidence.json"
    assert not _probe_ranks(run_dir), f"{row.id}: probe ranks outlived the session"
    if row.when == "probing":  # interrupted before any start: no evidence, nothing left
        assert not evidence_file.exists() and "KeyboardInterrupt" in out, out[-3000:]
        return
    if not row.engine_starts:
        assert not evidence_file.exists(), f"{row.id}: an engine started"
        probe = json.loads((run_dir / "probe" / "probe.json").read_text())
        assert probe["passed"] is False and all(r["gone"] for r in probe["ranks"]), probe
    else:
        record = json.loads(evidence_file.read_text())
        starts = sorted(p.parent.name for p in run_dir.glob("start-*/evidence.json"))
        assert record["status"] == "failed" and record["failure"], (
            f"{row.id}: start-1 is {record['status']!r}, expected failed (evidence of {starts}): "
            f"{record.get('failure')}\n{out[-3000:]}"
        )
        tails = record["failure"]["tails"]
        ranks = [tag for tag in tails if tag.startswith("Worker")]
        assert len(ranks) >= 2 or (not row.rank_tails and tails), f"{row.id}: last lines of {sorted(tails)}"
        assert record["teardown"]["clean"] is True, record["teardown"]
    if "-n" in row.args and row.when == "serving":
        # The worker's engine progress reached the controller's terminal (xdist discards the worker's own).
        shown = re.search(r"b70lab: \[gw\d+\] \S+ start-1: loading weights \(\d+ s\)", out)
        assert shown, f"{row.id}: no engine progress from a worker in the controller's output:\n{out[-3000:]}"
    if row.signal is None:
        line = _verdict_line(out)
        assert re.match(row.verdict, line), f"{row.id}: verdict {line!r}\n{out[-3000:]}"
        assert not [text for text in row.absent if text in line], f"{row.id}: verdict {line!r}"
    else:
        record = json.loads(evidence_file.read_text())
        assert record["failure"]["message"].startswith("interrupted"), record["failure"]["message"][:300]
    promotion = run_dir / "promotion.json"
    if promotion.exists():  # every exit leaves the folder's verdict truthful
        verdict = json.loads(promotion.read_text())
        assert verdict["promotable"] is False, f"{row.id}: promotion.json says promotable: {verdict}"
    print(f"{row.id}: exit {code}, {wall:.0f} s, verdict: {_verdict_line(out)[:200]}")


# --- a slowdown that only gate 7 can see ------------------------------------------------------------------

# Rank 0 of start-2 only stretches each of its model steps: both starts succeed with the same tokens, start-2
# decodes slower, and fresh-start reproduction must fail naming the paired figure. The row keeps the mini
# contract's interleaved schedule and its paired tolerance T (0.10). Stretching rank 0's steps by P % slows the
# whole TP2 step by about half of P %: P = 42, a start 2T slower, gave paired figures of 0.768-0.821 over 10
# sessions of three passes, every one caught (notes/2026-12-04-interleaved-tolerance-teeth-and-absolute-figure.md).
# At one pass identical starts spread by up to ~0.07, so `make test` keeps P = 50 (about 0.78, a margin of 0.12
# below 1 - T) at one pass: the smallest slowdown that the cheapest session still fails every time.
MINI_PAIRED_TOLERANCE = contract_mod.load("mini-laguna-cpu").reproduction.paired
SLOWDOWN_PERCENT = 50
SLOWDOWN = Row("start-2-decodes-slower", f"slow-decode:0:{SLOWDOWN_PERCENT}:2", 240, r"", ci=True)
SLOWDOWN_PASSES = 1
REPRODUCTION = (str(GATES), "-k", "test_fresh_start_reproduction")


def test_a_slower_second_start_fails_reproduction(tmp_path: Path, b70_cache_root: Path) -> None:
    row = SLOWDOWN
    contract = _fault_contract(tmp_path, row.start_s, schedule="interleaved", passes=SLOWDOWN_PASSES)
    code, out, wall, run_dir, _ = _run(row, tmp_path, b70_cache_root, tests=REPRODUCTION, contract=contract)
    time.sleep(2)
    assert not _engine_processes(run_dir), f"{row.id}: engine processes outlived the session\n{out[-3000:]}"
    assert code == 1, f"{row.id}: exit {code}, expected 1 (a gate failed)\n{out[-3000:]}"
    for index, armed in ((1, False), (2, True)):
        record = json.loads((run_dir / f"start-{index}" / "evidence.json").read_text())
        assert record["status"] == "ok", f"{row.id}: start-{index} is {record['status']}: {record.get('failure')}"
        assert record["teardown"]["clean"] is True, record["teardown"]
        rank0 = next((run_dir / f"start-{index}" / "ranks").glob("Worker_TP0*.log")).read_text(errors="replace")
        fired = f"stretches every model step by {SLOWDOWN_PERCENT} %" in rank0
        assert fired == armed, f"{row.id}: the slowdown fired in start-{index}: {fired}, expected {armed}"
    promotion = json.loads((run_dir / "promotion.json").read_text())
    assert promotion["promotable"] is False and "fresh-start-reproduction" in promotion["failed_gates"], promotion
    (failed,) = [f for f in promotion["failed"] if f["gate"] == "fresh-start-reproduction"]
    assert "paired figure start-2 / start-1" in failed["reasons"], failed["reasons"]
    (test,) = [g for g in promotion["gates"] if g["gate"] == "fresh-start-reproduction"]
    ratio = test["observed"]["paired_ratio_start2"]
    assert ratio < 1 - MINI_PAIRED_TOLERANCE, f"{row.id}: paired figure {ratio}: start-2 was not measurably slower"
    line = _verdict_line(out)
    assert line.startswith("NOT PROMOTABLE") and "fresh-start-reproduction" in out.split(line, 1)[-1][:2000], line
    print(
        f"{row.id}: exit {code}, {wall:.0f} s, paired figure {ratio}, endpoint medians "
        f"{test['observed'].get('endpoint_medians')}"
    )


# --- faults the machine causes ------------------------------------------------------------------------------
# A full disk under the run folder, a rank the kernel's OOM killer kills, a /dev/shm too small for the contract,
# a corrupted compile cache: each real, made with what the kernel offers (a tmpfs, a memory cgroup, a mount
# namespace, a private cache copy); where this machine refuses it, the row skips saying why.


def _mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {size} tmpfs as the run folder needs root here (uid {os.geteuid()})")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "b70lab-disk", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"this machine refuses a tmpfs at {where}: {done.stderr.decode().strip()}")


def _fill(folder: Path) -> int:
    """Write zeros into folder/filler until the disk says no space; the bytes written."""
    written = 0
    with open(folder / "filler", "wb", buffering=0) as f:
        chunk = b"\0" * 2**20
        while True:
            try:
                written += f.write(chunk) or 0
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return written


DISK_FULL = Row(
    "run-folder-disk-fills-during-start-up",
    None,
    240,
    r"NOT PROMOTABLE: start-1 failed while [\w ]+: the disk under the run folder is full: could not write "
    r"\S+/start-1/(server\.log|ranks/\S+\.log) \(No space left on device\); tmpfs at \S+ has [\d.]+ \w+ free of "
    r"64\.0 MiB; largest files under \S+: \S+/filler",
    ci=True,
)


def test_the_run_folders_disk_fills_during_a_start(
    request: pytest.FixtureRequest, tmp_path: Path, b70_cache_root: Path
) -> None:
    """The disk fills while start-1 loads its weights (another job's file takes every byte left): the start
    fails naming the disk, the file it could not write and what fills it, and its evidence is whole (the run's
    reserve is given back for it); nothing half-written is left, and a replay gives the same verdict."""
    _in_budget(DISK_FULL, request)
    row, run_dir = DISK_FULL, tmp_path / "run"
    run_dir.mkdir()
    _mount_tmpfs(run_dir, "64m")
    filled: list[int] = []

    def fill_once_loading(folder: Path) -> None:
        log = folder / "start-1" / "server.log"
        if not filled and log.is_file() and WHEN["loading weights"][1].search(log.read_text(errors="replace")):
            filled.append(_fill(folder))

    try:
        code, out, wall, _, pids = _run(row, tmp_path, b70_cache_root, watch=fill_once_loading)
        assert filled, f"{row.id}: the session ended before start-1 loaded weights\n{out[-3000:]}"
        _check_ended(row, code, out, wall, run_dir, pids)
        record = json.loads((run_dir / "start-1" / "evidence.json").read_text())
        assert "the disk under the run folder is full" in record["failure"]["message"], record["failure"]
        torn = [p.name for p in run_dir.rglob("*") if p.name.startswith(".evidence-") or p.name == disk.RESERVE]
        assert not torn, f"{row.id}: half-written evidence or the reserve left behind: {torn}"
        replay = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "gates", *SMOKE, "-p", "no:cacheprovider", "-q"]
            + [f"--b70-contract={tmp_path / 'mini-laguna-cpu-fault.toml'}", f"--b70-evidence={run_dir}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert _verdict_line(replay.stdout) == _verdict_line(out), (
            f"{row.id}: the replay's verdict differs:\n{_verdict_line(replay.stdout)}\n{_verdict_line(out)}"
        )
        print(f"{row.id}: filled {filled[0] / 2**20:.1f} MiB; {wall:.0f} s; verdict: {_verdict_line(out)[:300]}")
    finally:
        subprocess.run(["umount", "-l", str(run_dir)], check=False)


@contextlib.contextmanager
def _memory_cgroup(limit: int) -> Iterator[Path]:
    """A child of this process's memory cgroup (cgroup v1's memory hierarchy, or v2 where the parent delegates
    its memory controller) with `limit` bytes and no swap; skips naming why where the machine refuses it."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if "memory" in line.split(":", 2)[1].split(",")]
    v2 = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    v2_root = next((p.mountpoint for p in psutil.disk_partitions(all=True) if p.fstype == "cgroup2"), None)
    if v1:
        parent, limit_file, swap = Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/"), "memory.limit_in_bytes", None
    elif v2 and v2_root:
        parent, limit_file, swap = Path(v2_root) / v2[0].lstrip("/"), "memory.max", "memory.swap.max"
        controllers = (parent / "cgroup.subtree_control").read_text().split()
        if "memory" not in controllers:
            pytest.skip(f"cgroup {parent} does not delegate the memory controller (subtree_control: {controllers})")
    else:
        pytest.skip("no memory cgroup here: neither a cgroup v1 memory hierarchy nor cgroup v2")
    folder = parent / f"b70lab-oom-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / limit_file).write_text(str(limit))
        with contextlib.suppress(OSError):
            (folder / (swap or "memory.swappiness")).write_text("0")
    except OSError as e:
        with contextlib.suppress(OSError):
            folder.rmdir()
        pytest.skip(f"this machine refuses a memory cgroup under {parent}: {e}")
    try:
        yield folder
    finally:
        for _ in range(20):  # the killed rank leaves it as its zombie is reaped
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.5)


OOM_LIMIT = 256 * 2**20
OOM = Row(
    "rank-killed-by-the-oom-killer",
    "memory-cgroup:1",
    240,
    r"NOT PROMOTABLE: start-1 failed while [\w ]+: the server exited with code \d+ during start-up.*; "
    r"cause on Worker_TP1[\w\-]*: out of memory: the kernel's OOM killer killed pid \d+ \(.*\) at the limit of "
    r"memory cgroup \S+b70lab-oom-\d+ \(limit 256 MiB\); its anonymous resident memory was \d+ MiB",
    ci=True,
)


def test_a_rank_killed_by_the_oom_killer(request: pytest.FixtureRequest, tmp_path: Path, b70_cache_root: Path) -> None:
    """Rank 1 moves into a memory cgroup of 256 MiB as it loads its weights (faults.py, memory-cgroup); its KV
    cache does not fit and the kernel kills it: the root cause says out of memory, naming the rank, the cgroup
    and its limit, where vLLM's own lines say only that a worker died."""
    _in_budget(OOM, request)
    from pytest_b70lab.in_engine import faults

    with _memory_cgroup(OOM_LIMIT) as folder:
        code, out, wall, run_dir, pids = _run(OOM, tmp_path, b70_cache_root, env_extra={faults.CGROUP_ENV: str(folder)})
    _check_ended(OOM, code, out, wall, run_dir, pids)


SHM_SIZE = "32m"
SMALL_SHM = Row(
    "dev-shm-too-small",
    None,
    240,
    r"NOT PROMOTABLE: start-1 could not begin: .*/dev/shm.*32 MiB free",
    ci=True,
    engine_starts=False,
    probe=True,
)


def _private_mount(fstype: str, where: str, options: str) -> tuple[str, ...]:
    """A command prefix that runs the session in a mount namespace of its own with `fstype` mounted at
    `where` (root, or an unprivileged user namespace mapping this user to root); skips where refused."""
    user = () if os.geteuid() == 0 else ("--map-root-user",)
    prefix = ("unshare", "--mount", "--propagation", "private", *user, "sh", "-c")
    script = f'mount -t {fstype} -o {options} b70lab-{fstype} {where} && exec "$@"'
    tried = subprocess.run([*prefix, script, "sh", "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"this machine refuses a private mount namespace with {fstype} at {where}: {tried.stderr.strip()}")
    return (*prefix, script, "sh")


def test_a_dev_shm_too_small_stops_the_session_before_any_start(
    request: pytest.FixtureRequest, tmp_path: Path, b70_cache_root: Path
) -> None:
    """/dev/shm of 32 MiB in the session's own mount namespace (Docker's default is 64 MiB): the capability
    preflight stops the session with its /dev/shm line before the probe or any engine process."""
    _in_budget(SMALL_SHM, request)
    row = SMALL_SHM
    prefix = _private_mount("tmpfs", "/dev/shm", f"size={SHM_SIZE}")
    code, out, wall, run_dir, pids = _run(row, tmp_path, b70_cache_root, prefix=prefix)
    assert code != 0 and not pids, f"{row.id}: exit {code}, processes seen {pids}\n{out[-3000:]}"
    assert not (run_dir / "start-1").exists() and not (run_dir / "probe").exists(), f"{row.id}: something started"
    line = _verdict_line(out)
    assert re.match(row.verdict, line), f"{row.id}: verdict {line!r}\n{out[-3000:]}"
    print(f"{row.id}: exit {code}, {wall:.0f} s, verdict: {line[:300]}")


AOT_CACHE = Path("engine-state") / "vllm" / "torch_compile_cache" / "torch_aot_compile"
# Every gate but fresh-start reproduction: run sequentially, the two starts' speeds drift too far for its
# tolerance (the row is about what start-2 serves, not how fast).
CACHE_GATES = (str(GATES), "-k", "not test_fresh_start_reproduction")
# Out of make test (200 s on an AVX2-only CPU, where the 800-token default took the room): `pytest -m faults` runs it.
CORRUPT_CACHE = Row("compile-cache-corrupted-between-starts", None, 240, r"")


def _corrupt(folder: Path) -> list[tuple[Path, str]]:
    """Truncate one AOT artifact (rank 0's of the largest compiled graph) to half, garble another (rank 1's:
    4 KiB of random bytes in its middle); what was done to which file."""
    models = sorted(folder.glob("*/rank_*/model"), key=lambda p: (-p.stat().st_size, str(p)))
    ranks = {p.parent.name: p for p in models if p.parent.parent == models[0].parent.parent}
    truncated, garbled = ranks["rank_0_0"], ranks["rank_1_0"]
    size = truncated.stat().st_size
    os.truncate(truncated, size // 2)
    with open(garbled, "r+b") as f:
        f.seek(garbled.stat().st_size // 2)
        f.write(os.urandom(4096))
    return [(truncated, f"truncated to {size // 2} of {size} bytes"), (garbled, "4 KiB in its middle garbled")]


def test_a_corrupted_compile_cache_is_compiled_again(
    request: pytest.FixtureRequest, tmp_path: Path, b70_cache_root: Path
) -> None:
    """A private cache (the shared one's models, an engine state of its own: never the compile cache that later
    sessions load): start-1 compiles and saves its graphs; between the starts one artifact is truncated and
    another garbled. Start-2 must not serve what it cannot load: vLLM compiles again (each artifact named in
    its log and in the session's progress), and the compile topology and the teacher still hold."""
    _in_budget(CORRUPT_CACHE, request)
    row = CORRUPT_CACHE
    # A short path: vLLM's IPC sockets live under it, and an AF_UNIX path holds at most 107 bytes (under
    # tmp_path, zmq refused one: "ipc path ... is longer than 107 characters").
    cache = Path(tempfile.mkdtemp(prefix="b70lab-cache-"))
    request.addfinalizer(lambda: shutil.rmtree(cache, ignore_errors=True))
    (cache / "engine-state").mkdir(parents=True)
    for shared in ("mini", "checkpoint-tables"):
        if (b70_cache_root / shared).exists():
            (cache / shared).symlink_to(b70_cache_root / shared)
    done: list[tuple[Path, str]] = []

    def corrupt_between_starts(run_dir: Path) -> None:
        if not done and (run_dir / "start-1" / "evidence.json").is_file():
            done.extend(_corrupt(cache / AOT_CACHE))

    code, out, wall, run_dir, pids = _run(row, tmp_path, cache, tests=CACHE_GATES, watch=corrupt_between_starts)
    _check_no_orphans(row, out, run_dir, pids)
    assert done, f"{row.id}: start-1 never finished, nothing was corrupted\n{out[-3000:]}"
    summary = out.strip().splitlines()[-1]
    line = _verdict_line(out)
    assert " passed" in summary and "failed" not in summary and "error" not in summary, f"{row.id}: {summary}"
    assert line.startswith("NOT PROMOTABLE (incomplete)") and "1 of " in line, f"{row.id}: {line}"
    assert "did not run (deselected, not collected, or lost with a worker): fresh-start-reproduction" in line, line
    log = (run_dir / "start-2" / "server.log").read_text(errors="replace")
    for artifact, what in done:
        assert f"Compiling model again due to a load failure from {artifact}" in log, f"{row.id}: {artifact} {what}"
        assert f"compile cache artifact {artifact} did not load" in out, f"{row.id}: {artifact}: not in the progress"
    print(f"{row.id}: {'; '.join(f'{p}: {w}' for p, w in done)}; {wall:.0f} s; start-2 compiled again; gates held")
