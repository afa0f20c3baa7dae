"""What a shard does on its box, inside the Ray worker that runs it: take the box (a lock for the whole machine, so
a re-run never overlaps a survivor and two Ray nodes on one machine never measure at once), put the worker back to the niceness and OOM score the box's own processes run at
(Ray lowers a worker's priority and makes it the OOM killer's first choice; the engines it launches inherit
both), run the shard's work into a box-local folder, and pack that folder for the driver. Nothing here imports
Ray: the task wrapper (fleet/driver.py) hands in what Ray knows (the node's labels, the raylet's pid)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from filelock import FileLock, Timeout

from ..errors import LabError
from ..evidence import host

RESOURCE = "b70_box"  # the custom resource a box node offers once: a shard asks for all of it
BOX_LABEL = "b70lab.box"  # the node label naming the box (`ray start --labels b70lab.box=NAME,...`)
CLASS_LABEL = "b70lab.host-class"  # the node label naming its host class (`b70lab fleet labels` prints both)
FLEET_DIR = "fleet"  # under the box's cache root: every shard's box-local folder
BOX_WAIT_S = 4 * 3600.0  # how long a shard waits for a box another shard holds (a sweep's shard takes an hour or two)
# How long a box keeps its own copy of a shard's folder: the driver judges the copy it unpacked, and a transfer
# that failed is a new attempt (a folder of its own), so the box's copy is only for a look at what it measured.
# A shard's folder holds its evidence and engine logs (about 4 MB for two variants); without this a box's cache
# grows by every sweep it ever measured.
KEEP_SHARD_FOLDERS_S = 7 * 86400.0


class BoxError(LabError, RuntimeError):
    """The box cannot run the shard: it is busy with another, or its Ray worker cannot be put back to the
    box's own priority and OOM score."""


@dataclass(frozen=True)
class BoxFacts:
    label: str  # the node's b70lab.box label
    digest: str  # host.box_identity's digest of the machine
    host_class: str | None  # the node's b70lab.host-class label
    node: str  # Ray's node id

    def line(self) -> str:
        return f"box {self.label} [{self.digest}]"


def class_key() -> str:
    """This machine's host class as a node label: its CPU identity's class (the FP8 path a start runs is added by
    each start's evidence)."""
    return host.host_class(host.cpu_identity(), None).key


def normalise(raylet_pid: int | None) -> dict[str, list[int]]:
    """Set this process's niceness and OOM score to the raylet's (what the box runs its own processes at: Ray
    starts workers at RAY_worker_niceness, default 15, and RAY_worker_oom_score_adjustment, default 1000);
    [before, after] of each. A BoxError where the worker may not go back (raising priority needs CAP_SYS_NICE,
    lowering an OOM score CAP_SYS_RESOURCE): start the box's node with both set to 0 (docs/fleet.md)."""
    target_nice, target_oom = 0, 0
    if raylet_pid:
        try:
            target_nice = psutil.Process(raylet_pid).nice()
            target_oom = int(Path(f"/proc/{raylet_pid}/oom_score_adj").read_text())
        except (psutil.Error, OSError, ValueError):
            pass
    nice0, oom0 = os.getpriority(os.PRIO_PROCESS, 0), _oom_score()
    try:
        if nice0 != target_nice:
            os.setpriority(os.PRIO_PROCESS, 0, target_nice)
        if oom0 != target_oom:
            Path("/proc/self/oom_score_adj").write_text(str(target_oom))
    except OSError as e:
        raise BoxError(
            f"this box's Ray worker runs at niceness {nice0} and OOM score {oom0}, the box's own processes at "
            f"{target_nice} and {target_oom}, and the worker may not go back ({e.strerror or e}): start the box's "
            "Ray node with RAY_worker_niceness=0 RAY_worker_oom_score_adjustment=0 (docs/fleet.md)"
        ) from e
    return {"niceness": [nice0, os.getpriority(os.PRIO_PROCESS, 0)], "oom_score_adj": [oom0, _oom_score()]}


def _oom_score() -> int:
    return int(Path("/proc/self/oom_score_adj").read_text())


def shard_folder(cache_root: Path, sweep: str, shard: str, attempt: int) -> Path:
    return Path(cache_root) / FLEET_DIR / sweep / shard / f"attempt-{attempt}"


def machine_lock() -> Path:
    """The lock that makes a machine one box: every Ray node on it takes the same file, so that two nodes on one
    machine (a test's cluster, a box started twice) never measure at once, whatever their cache roots."""
    return Path("/tmp") / f"b70lab-box-{os.getuid()}.lock"


def run(
    cache_root: Path,
    sweep: str,
    shard: str,
    attempt: int,
    work: Callable[[Path], Any],
    *,
    lock_path: Path | None = None,
    wait_s: float = BOX_WAIT_S,
    say: Callable[[str], None] | None = None,
) -> tuple[Path, Any]:
    """The shard's work under the box's lock, into a fresh box-local folder; (that folder, what the work
    returned). Where another shard holds the box, waits for it (a re-run never overlaps a survivor), and is a
    BoxError after `wait_s`."""
    lock_path = Path(lock_path or machine_lock())
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if say is not None:
            say(f"{shard}: another shard holds this box ({lock_path}); waiting for it, at most {wait_s:.0f} s")
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            raise BoxError(
                f"another shard held this box ({lock_path}) for {wait_s:.0f} s: a box measures one shard at a time"
            ) from None
    try:
        for old in prune(cache_root):
            if say is not None:
                say(f"{shard}: removed the box's copy of {old} (older than {KEEP_SHARD_FOLDERS_S / 86400:.0f} days)")
        folder = shard_folder(cache_root, sweep, shard, attempt)
        if folder.exists():  # this attempt's own leftovers (never another attempt's: each has its folder)
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        return folder, work(folder)
    finally:
        lock.release()


def prune(cache_root: Path, keep_s: float = KEEP_SHARD_FOLDERS_S, now: float | None = None) -> list[Path]:
    """Remove the box-local shard folders nothing was written into for `keep_s` (then their emptied shard and sweep
    folders); the removed ones, relative to the fleet folder. Called under the box's lock, so no shard on this
    machine is writing."""
    root = Path(cache_root) / FLEET_DIR
    now = time.time() if now is None else now
    removed = []
    for attempt in sorted(root.glob("*/*/attempt-*")):
        newest = max((p.lstat().st_mtime for p in (attempt, *attempt.rglob("*"))), default=now)
        if now - newest > keep_s:
            shutil.rmtree(attempt)
            removed.append(attempt.relative_to(root))
    for emptied in sorted({*root.glob("*/*"), *root.glob("*")}, key=lambda p: -len(p.parts)):
        if emptied.is_dir() and not any(emptied.iterdir()):
            emptied.rmdir()
    return removed


def pack(folder: Path) -> tuple[bytes, dict[str, str]]:
    """The folder as a gzipped tar (a few MB: evidence, logs, the verdicts) and the sha256 of every file in it,
    which the driver checks after unpacking."""
    digests = {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in digests:
            tar.add(folder / name, arcname=name, recursive=False)
    return buffer.getvalue(), digests


def unpack(payload: bytes, digests: dict[str, str], into: Path) -> None:
    """The shard's folder, unpacked into `into` (which must not exist) and checked file by file; a BoxError
    naming the first file that is missing, extra or different."""
    into = Path(into)
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    found = {
        str(p.relative_to(into)): hashlib.sha256(p.read_bytes()).hexdigest() for p in into.rglob("*") if p.is_file()
    }
    for name in sorted(set(found) | set(digests)):
        if found.get(name) != digests.get(name):
            what = "missing" if name not in found else "not listed" if name not in digests else "different"
            raise BoxError(f"{into / name}: {what} after the transfer from the box; the shard's folder is not kept")
