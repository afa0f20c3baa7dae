"""Signalling and finding the processes of a group or session: the engine server's teardown, the collective
probe's ranks and the quality sandbox's programs all end their children this way.

Only the standard library: the sandbox imports it, and the probe's and sandbox's process listings read
/proc directly (psutil does not expose a process's session, and the sandbox side must not need it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """`sig` to every process of the group at once; False when the group is gone (or not ours)."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_process(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_group(proc: subprocess.Popen, wait_s: float = 5.0) -> None:
    """SIGTERM to the child's group, then SIGKILL if the child has not exited within `wait_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not signal_group(proc.pid, sig):
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def own_group_dying_with_parent() -> None:
    """In a child before exec: its own session and process group, and SIGTERM when the parent dies (a
    SIGKILLed pytest must not leave an engine behind)."""
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


# The same, for a parent with threads (a Ray worker), where a preexec_fn may deadlock between fork and exec: the
# child is started with start_new_session=True and runs this first, then execs the command. It checks that its
# parent is still the one that started it, since a parent that died before the prctl would send no signal.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(143)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_parent(command: list[str], python: str) -> list[str]:
    """`command` wrapped to get SIGTERM when this process dies (start it with start_new_session=True)."""
    return [python, "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


@dataclass(frozen=True)
class ProcStat:
    pid: int
    name: str
    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgid: int
    session: int
    ppid: int = 0

    @property
    def live(self) -> bool:
        return self.state not in "ZX"


def proc_stats() -> list[ProcStat]:
    """Every process's /proc/PID/stat fields this module needs (written here: psutil has no session id)."""
    rows = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        head, _, rest = raw.rpartition(b")")  # the command name may hold spaces and ")"
        fields = rest.split()
        rows.append(
            ProcStat(
                int(name),
                head.split(b"(", 1)[-1].decode(errors="replace"),
                fields[0].decode(),
                int(fields[2]),
                int(fields[3]),
                int(fields[1]),
            )
        )
    return rows


def descendants(pid: int) -> list[ProcStat]:
    """The live processes below `pid` (children, their children, ...), found by parent links in one listing."""
    children: dict[int, list[ProcStat]] = {}
    for p in proc_stats():
        children.setdefault(p.ppid, []).append(p)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid != pid and child.live:
                found.append(child)
            todo.append(child.pid)
    return found


def threads_of_user(uid: int) -> int:
    """How many threads processes whose real user is `uid` have (what RLIMIT_NPROC counts)."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return count


def group_members(pgid: int) -> list[ProcStat]:
    """The live processes of a process group."""
    return [p for p in proc_stats() if p.pgid == pgid and p.live]


def session_members(sid: int) -> list[ProcStat]:
    """The live processes of a session (what a process that made its own group may still belong to)."""
    return [p for p in proc_stats() if p.session == sid and p.live]


def group_gone_within(pgid: int, grace_s: float) -> bool:
    """Whether the group is empty within `grace_s` (children may take a moment to follow their leader out)."""
    deadline = time.monotonic() + grace_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def major_faults(pid: int) -> int | None:
    """Page faults of `pid` that had to read from disk (majflt of /proc/PID/stat); None once it is gone."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count from its closing one.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[9]) if len(fields) > 9 else None


def holding_files_under(folder: str | os.PathLike[str]) -> list[int]:
    """The processes with a file under `folder` open (an engine's log, say): what is left of a start that was
    cut off, whatever its process group became. Processes this user may not inspect are not seen."""
    root = os.path.realpath(folder)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if target == root or target.startswith(root + "/"):
                found.append(int(name))
                break
    return found
