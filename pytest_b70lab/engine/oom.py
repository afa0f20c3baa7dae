"""What the kernel's OOM killer did to a start's processes. A rank it kills gets SIGKILL: no traceback, only
vLLM's "died unexpectedly" from the executor, which names no cause. The kernel says it in its log
(/dev/kmsg, readable by root or where `dmesg_restrict` is 0), with the memory cgroup whose limit was hit;
where the log cannot be read, /proc/vmstat's `oom_kill` counter still says that the killer ran.

No library reads /dev/kmsg records or the OOM report's `oom-kill:` line (psutil and the dmesg wrappers on PyPI
shell out to dmesg or do not parse it), so the few lines below do."""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .logs import OUT_OF_MEMORY

KMSG = Path("/dev/kmsg")
VMSTAT = Path("/proc/vmstat")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What every line this module writes begins with: logs.root_cause puts such a line first.
PREFIX = OUT_OF_MEMORY
# The kernel's summary of one kill (mm/oom_kill.c, dump_oom_victim): comma-separated key=value pairs.
OOM_KILL = re.compile(r"oom-kill:(?P<fields>\S+)")
# The line that follows it: "Memory cgroup out of memory: Killed process 2399 (python3) total-vm:..., anon-rss:72064kB"
KILLED = re.compile(r"Killed process (?P<pid>\d+) \((?P<task>[^)]*)\).*?anon-rss:(?P<anon_kb>\d+)kB")


@dataclass(frozen=True)
class OomKill:
    pid: int
    task: str
    constraint: str  # CONSTRAINT_MEMCG: a cgroup's limit; CONSTRAINT_NONE: the whole machine
    memcg: str | None  # the cgroup whose limit was hit (oom_memcg), as the kernel names it
    anon_rss_kb: int | None  # what the process held when it was killed


def kill_count(vmstat: Path = VMSTAT) -> int | None:
    """The kernel's count of OOM kills since boot (Linux 4.13+), or None where it is not kept."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def kernel_log(since_s: float, device: Path = KMSG) -> list[str] | None:
    """The kernel log's messages stamped at or after `since_s` (CLOCK_MONOTONIC seconds, time.monotonic()'s
    clock, which printk's stamps follow on Linux), or None where the log cannot be read."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found: list[str] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # the ring wrapped past this record: read on
                    continue
                break  # EAGAIN: nothing more
            if not record:
                break
            header, _, message = record.decode("utf-8", "replace").partition(";")
            fields = header.split(",")
            if len(fields) >= 3 and fields[2].isdigit() and int(fields[2]) >= since_s * 1e6:
                found.append(message.split("\n", 1)[0])
    finally:
        os.close(fd)
    return found


def parse_kills(messages: list[str]) -> list[OomKill]:
    """Each process the OOM killer killed, from the kernel's messages in order: an `oom-kill:` summary, then
    its `Killed process` line."""
    kills: list[OomKill] = []
    summary: dict[str, str] = {}
    for message in messages:
        if m := OOM_KILL.search(message):
            summary = dict(p.split("=", 1) for p in m.group("fields").split(",") if "=" in p)
            continue
        if m := KILLED.search(message):
            pid = int(m.group("pid"))
            same = summary.get("pid") == str(pid)
            kills.append(
                OomKill(
                    pid=pid,
                    task=m.group("task"),
                    constraint=summary.get("constraint", "CONSTRAINT_NONE") if same else "CONSTRAINT_NONE",
                    memcg=summary.get("oom_memcg") if same else None,
                    anon_rss_kb=int(m.group("anon_kb")),
                )
            )
            summary = {}
    return kills


def memcg_limit(memcg: str, root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of cgroup `memcg` (as the kernel names it, from its hierarchy's root) in bytes, from
    cgroup v2's memory.max or v1's memory.limit_in_bytes; None: unlimited or gone."""
    relative = memcg.strip("/")
    for folder, name in (
        (root / relative, "memory.max"),
        (root / "unified" / relative, "memory.max"),
        (root / "memory" / relative, "memory.limit_in_bytes"),
    ):
        try:
            value = (folder / name).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 1 << 60:  # v1 says "unlimited" with a huge number, v2 with "max"
            return int(value)
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def describe(kill: OomKill, limit: int | None) -> str:
    """One line: what killed the process and why, for a rank's root cause."""
    held = (
        f"; its anonymous resident memory was {_mib(kill.anon_rss_kb * 1024)}" if kill.anon_rss_kb is not None else ""
    )
    if kill.constraint == "CONSTRAINT_MEMCG" and kill.memcg:
        where = f"memory cgroup {kill.memcg}" + (f" (limit {_mib(limit)})" if limit is not None else "")
        return f"{PREFIX}the kernel's OOM killer killed pid {kill.pid} ({kill.task}) at the limit of {where}{held}"
    return f"{PREFIX}the kernel's OOM killer killed pid {kill.pid} ({kill.task}): the machine ran out of memory{held}"


def counted_only(before: int | None, after: int | None) -> str | None:
    """Where the kernel log cannot be read: the killer ran during the start (which process, it cannot say)."""
    if before is None or after is None or after <= before:
        return None
    return (
        f"{PREFIX}the kernel's OOM killer killed {after - before} process(es) on this machine during the start "
        f"(/proc/vmstat oom_kill {before} -> {after}); its log ({KMSG}) is not readable here to say which: "
        f"see `dmesg` as root"
    )
