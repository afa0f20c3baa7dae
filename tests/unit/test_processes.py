"""The one module that ends process groups (engine teardown, the probe's ranks, the sandbox's programs), on
real child processes: a group with a grandchild in it, found through /proc and ended as a whole."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pytest_b70lab.isolation import processes

# A child that starts a grandchild in its own group, prints the grandchild's pid, and sleeps.
FAMILY = (
    "import subprocess, sys, time\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(g.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _family() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", FAMILY], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


def test_a_group_is_found_through_proc_and_ended_whole() -> None:
    proc, grandchild = _family()
    try:
        members = {p.pid for p in processes.group_members(proc.pid)}
        assert members == {proc.pid, grandchild}
        assert {p.pid for p in processes.session_members(proc.pid)} == members
        processes.end_group(proc, wait_s=5.0)
        assert processes.group_gone_within(proc.pid, 5.0), processes.group_members(proc.pid)
    finally:
        processes.signal_group(proc.pid)
        proc.wait(timeout=5)


def test_signalling_what_is_gone_says_so_instead_of_raising() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait(timeout=30)
    time.sleep(0.1)
    assert processes.signal_group(proc.pid) is False
    assert processes.signal_process(proc.pid) is False
    assert processes.group_members(proc.pid) == []


def test_the_group_and_session_read_from_proc_are_the_kernels() -> None:
    """/proc/PID/stat puts the command name in parentheses (it may hold spaces and ")"), then the fields."""
    me = next(p for p in processes.proc_stats() if p.pid == os.getpid())
    assert (me.pgid, me.session, me.live) == (os.getpgid(0), os.getsid(0), True)
