"""What the launcher says when the machine fails a start: a rank the kernel's OOM killer took (from the kernel's
own report) and a run folder whose disk is full (from a real ENOSPC: /dev/full, and a small tmpfs as root).

fixtures/kernel-logs/memcg-oom-kill.txt is the kernel's report of a real kill (tests/faults,
rank-killed-by-the-oom-killer: rank 1 of the mini in a memory cgroup of 256 MiB), as /dev/kmsg gave it, the
session's cgroup path made generic."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from pytest_b70lab.engine import disk, oom
from pytest_b70lab.engine.logs import failure_headline, root_cause
from pytest_b70lab.evidence import record as evidence

REPO = Path(__file__).resolve().parents[2]
REPORT = (REPO / "fixtures" / "kernel-logs" / "memcg-oom-kill.txt").read_text().splitlines()
CGROUP = "/lab.slice/session-7.scope/b70lab-oom-5125"


def test_the_kernels_report_names_the_killed_process_and_its_cgroup() -> None:
    (kill,) = oom.parse_kills(REPORT)
    assert kill == oom.OomKill(5324, "VLLM::Worker_TP", "CONSTRAINT_MEMCG", CGROUP, 694284)


def test_a_kill_of_the_whole_machine_is_said_as_such() -> None:
    global_report = [line.replace("CONSTRAINT_MEMCG", "CONSTRAINT_NONE") for line in REPORT]
    global_report[-1] = global_report[-1].replace("Memory cgroup out of memory", "Out of memory")
    (kill,) = oom.parse_kills(global_report)
    assert "the machine ran out of memory" in oom.describe(kill, None)
    # A `Killed process` line without its summary (the ring wrapped between them) is still a kill.
    (alone,) = oom.parse_kills(REPORT[-1:])
    assert alone.pid == 5324 and alone.memcg is None


def test_the_oom_line_is_the_root_cause_over_the_executors_died_unexpectedly() -> None:
    (kill,) = oom.parse_kills(REPORT)
    said = f"(Worker_TP1_EP1 pid=5324) {oom.describe(kill, 256 * 2**20)}"
    died = (
        "(EngineCore pid=5300) ERROR 12-04 03:05:10 [multiproc_executor.py:315] Worker proc VllmWorker-1 died "
        "unexpectedly, shutting down executor."
    )
    assert root_cause([died, said]) == (
        "Worker_TP1_EP1",
        f"out of memory: the kernel's OOM killer killed pid 5324 (VLLM::Worker_TP) at the limit of memory cgroup "
        f"{CGROUP} (limit 256 MiB); its anonymous resident memory was 678 MiB",
    )
    failure = evidence.Failure(message="the server exited with code 1 during start-up", first_errors=[died, said])
    assert "cause on Worker_TP1_EP1: out of memory: the kernel's OOM killer killed pid 5324" in failure_headline(
        failure
    )


def test_where_the_kernel_log_is_closed_the_counter_still_says_the_killer_ran(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 10\noom_kill 3\n")
    assert oom.kill_count(vmstat) == 3
    assert oom.kill_count(tmp_path / "absent") is None
    assert oom.counted_only(3, 3) is None
    assert "killed 2 process(es) on this machine during the start" in (oom.counted_only(3, 5) or "")
    assert oom.kernel_log(0.0, tmp_path / "absent") is None


def test_a_memory_limit_is_read_from_either_cgroup_version(tmp_path: Path) -> None:
    (tmp_path / "memory" / "a" / "b").mkdir(parents=True)
    (tmp_path / "memory" / "a" / "b" / "memory.limit_in_bytes").write_text(f"{256 * 2**20}\n")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "memory.max").write_text("max\n")
    assert oom.memcg_limit("/a/b", tmp_path) == 256 * 2**20
    assert oom.memcg_limit("/c", tmp_path) is None
    assert oom.memcg_limit("/gone", tmp_path) is None


def _enospc() -> OSError:
    """A real ENOSPC: /dev/full refuses every write with it."""
    try:
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"x")
    except OSError as e:
        return e
    raise AssertionError("/dev/full accepted a write")


def test_a_full_disk_is_said_with_the_file_the_disk_and_what_fills_it(tmp_path: Path) -> None:
    error = _enospc()
    assert disk.is_full(error) and error.errno == errno.ENOSPC
    (tmp_path / "start-1").mkdir()
    (tmp_path / "big.bin").write_bytes(b"\0" * 300_000)
    (tmp_path / "start-1" / "small.log").write_text("x")
    said = disk.full_message(tmp_path / "start-1" / "server.log", error, tmp_path)
    assert said.startswith(f"the disk under the run folder is full: could not write {tmp_path}/start-1/server.log")
    assert "(No space left on device)" in said and " free of " in said
    assert said.endswith(
        f"largest files under {tmp_path}: {tmp_path}/big.bin (293.0 KiB), {tmp_path}/start-1/small.log (1 B)"
    )


def test_the_reserve_is_set_aside_and_given_back(tmp_path: Path) -> None:
    held = disk.hold_reserve(tmp_path)
    assert held.stat().st_blocks * 512 >= disk.RESERVE_BYTES  # allocated, not a sparse file
    (tmp_path / "start-1").mkdir()
    assert disk.release_reserve(tmp_path) and not held.exists()
    assert not disk.release_reserve(tmp_path)
    disk.drop_reserve(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_disk_without_room_for_the_reserve_stops_the_run_before_any_start(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "b70lab-test", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"this machine refuses a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        with pytest.raises(disk.DiskFullError) as raised:
            disk.hold_reserve(small)
        assert str(raised.value).startswith("no start was launched: 8 MiB for the starts' evidence could not be")
        assert f"tmpfs at {small} has " in str(raised.value) and not (small / disk.RESERVE).exists()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
