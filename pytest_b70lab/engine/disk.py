"""The run folder's disk. A start that fills it must still leave whole evidence of why it failed, so every
run of starts sets space aside first (a reserve file) and gives it back to write a failed start's evidence; and
when a write fails for want of space, one line says which disk and file, and what fills it."""

from __future__ import annotations

import errno
import heapq
import os
from pathlib import Path

import psutil

from ..evidence.record import EvidenceError

RESERVE = ".b70lab-reserve"
# A failed start's evidence holds every rank's last lines (~100 KB for the mini's six ranks), a served one
# every request's chunks (~1 MB with the quality answers); promotion.json and the done mark follow it.
RESERVE_BYTES = 8 * 2**20
FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(EvidenceError):
    """No space to write what a run must keep: the message names the disk, the file and what fills it."""


def is_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in FULL


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _mount(path: Path) -> tuple[str, str]:
    """The mount point holding `path` and its file system type (psutil reads /proc/self/mounts)."""
    resolved = str(path.resolve())
    found = ("/", "?")
    for part in psutil.disk_partitions(all=True):
        point = part.mountpoint
        if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) >= len(found[0]):
            found = (point, part.fstype)
    return found


def _largest(folder: Path, count: int = 3, limit: int = 5000) -> list[tuple[int, Path]]:
    sizes: list[tuple[int, Path]] = []
    for seen, path in enumerate(folder.rglob("*")):
        if seen >= limit:
            break
        try:
            if path.is_file() and not path.is_symlink():
                sizes.append((path.stat().st_size, path))
        except OSError:
            continue
    return heapq.nlargest(count, sizes)


def full_message(path: Path, error: OSError, folder: Path) -> str:
    """`could not write PATH (No space left on device): tmpfs at /mnt/run has 0 B free of 64.0 MiB; largest
    files under FOLDER: ...`: what a tired engineer needs to free the disk."""
    point, fstype = _mount(path.parent if not path.exists() else path)
    try:
        usage = psutil.disk_usage(point)
        space = f"{fstype} at {point} has {_size(usage.free)} free of {_size(usage.total)}"
    except OSError:
        space = f"{fstype} at {point}"
    largest = ", ".join(f"{p} ({_size(n)})" for n, p in _largest(folder) if n > 0)
    return f"the disk under the run folder is full: could not write {path} ({error.strerror or error}); {space}" + (
        f"; largest files under {folder}: {largest}" if largest else ""
    )


def hold_reserve(run_dir: Path) -> Path:
    """Set RESERVE_BYTES aside in `run_dir` (allocated, not sparse: posix_fallocate). A disk that cannot give
    them stops the run before any start, naming it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError as e:
        path.unlink(missing_ok=True)
        if is_full(e):
            raise DiskFullError(
                f"no start was launched: {RESERVE_BYTES // 2**20} MiB for the starts' evidence could not be set "
                f"aside; {full_message(path, e, run_dir)}"
            ) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: no reserve
            raise
    return path


def release_reserve(folder: Path) -> bool:
    """Give back the reserve held in `folder` (the kind's folder a start folder sits in): True when space was
    freed. Only that one: another kind's reserve may be serving a start collected beside it."""
    try:
        (folder / RESERVE).unlink()
    except FileNotFoundError:
        return False
    return True


def drop_reserve(folder: Path) -> None:
    release_reserve(folder)
