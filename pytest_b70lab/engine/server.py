"""Start `vllm serve` as a child in its own process group, watch it come up, and take it down verifiably.

The server listens on a Unix socket inside a private (0700) folder, so only its owner can reach it. Every
output line is kept (`server.log`) and split by the rank tag vLLM puts in front of it (`ranks/<tag>.log`).
Teardown escalates SIGINT -> SIGTERM -> SIGKILL on the whole group and then checks every process that was
ever seen in the group or under the server: the report says, per process, whether it is gone."""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
import psutil

from ..errors import LabError
from ..isolation import processes
from . import disk, oom
from .command import ServeConfig, TcpListen, vllm_serve_command
from .environment import engine_environment
from .logs import ANSI, FATAL, RANK_TAG, TracebackEnds, is_exception_line, split_line

# Start-up phases, recognised from vLLM's log lines; the first match of each moves the phase forward.
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"Starting to load model|Loading weights|Loading drafter model")),
    ("compiling", re.compile(r"Warming up model for the compilation|Dynamo bytecode transform|Compiling model")),
    ("allocating KV cache", re.compile(r"KV cache size|Explicitly set .* for KV cache")),
    ("starting API server", re.compile(r"init engine .*took|Starting vLLM (API )?server")),
    ("ready", re.compile(r"Application startup complete")),
)


# Inside a long phase (compiling took 65 s on the mini; loading weights takes minutes on the B70), a progress
# line this often: the elapsed time and what the ranks' logs last said.
HEARTBEAT_S = 10.0
# vLLM's line when an artifact of its AOT compile cache does not load (truncated, garbled: any exception of the
# loader, vllm/compilation/decorators.py): it compiles again and saves over it
# (notes/2026-12-04-faults-the-machine-causes.md). Relayed as progress: the start takes a compile longer.
CACHE_REJECTED = re.compile(r"Compiling model again due to a load failure from (?P<path>\S+), reason: (?P<reason>.*)")


class EngineStartError(LabError, RuntimeError):
    """The server did not become ready; the message carries the last lines of every rank."""


@dataclass
class ProcessRecord:
    pid: int
    name: str
    cmdline: str
    gone: bool = False
    how: str = ""


@dataclass
class TeardownReport:
    signals_sent: list[str] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)
    seconds: float = 0.0
    # Lines of server.log read before the first signal: what vLLM logs after it (the API server's
    # EngineDeadError once its engine core is stopped) is the shutdown's doing, not the start's.
    log_line: int | None = None

    @property
    def clean(self) -> bool:
        return all(p.gone for p in self.processes)

    def survivors(self) -> list[ProcessRecord]:
        return [p for p in self.processes if not p.gone]

    def as_dict(self) -> dict:
        return {
            "clean": self.clean,
            "signals_sent": self.signals_sent,
            "seconds": round(self.seconds, 3),
            "log_line": self.log_line,
            "processes": [vars(p) for p in self.processes],
        }


def start_engine(
    config: ServeConfig,
    run_dir: Path,
    state_dir: Path,
    *,
    deadline_s: float = 900.0,
    env_extra: dict[str, str] | None = None,
    on_progress: Callable[[str, float], None] | None = None,
    niceness: int = 0,
    tcp: TcpListen | None = None,
) -> EngineServer:
    """A ready server for `config`, or EngineStartError (after verified teardown of what was started)."""
    env = engine_environment(
        state_dir,
        config.world_size,
        {**(env_extra or {}), **({"VLLM_API_KEY": tcp.api_key} if tcp else {})},
        device=config.device,
    )
    server = EngineServer(
        lambda sock: vllm_serve_command(config.model_ref, sock, config.args(), tcp),
        env,
        run_dir,
        on_progress=on_progress,
        niceness=niceness,
        tcp=tcp,
    )
    server.start()
    try:
        server.wait_ready(deadline_s)
    except BaseException:
        server.stop()
        raise
    return server


def _child_setup(niceness: int) -> Callable[[], None]:
    def setup() -> None:
        processes.own_group_dying_with_parent()
        if niceness:
            os.nice(niceness)

    return setup


_live: set[EngineServer] = set()


def _stop_all_at_exit() -> None:
    for server in list(_live):
        server.stop()


atexit.register(_stop_all_at_exit)


class EngineServer:
    """One `vllm serve` child. Use as a context manager, or call start(), wait_ready() and stop()."""

    def __init__(
        self,
        command_args: Callable[[Path], list[str]],
        env: dict[str, str],
        log_dir: Path,
        on_progress: Callable[[str, float], None] | None = None,
        tail_lines: int = 40,
        niceness: int = 0,
        tcp: TcpListen | None = None,
    ):
        self._command_args = command_args
        self.tcp = tcp
        self.env = env
        self.log_dir = Path(log_dir).resolve()
        self.on_progress = on_progress
        self.niceness = niceness
        self.socket_dir = Path(tempfile.mkdtemp(prefix="b70lab-"))  # short path: AF_UNIX allows ~107 bytes
        os.chmod(self.socket_dir, 0o700)
        self.socket_path = self.socket_dir / "engine.sock"
        self.command = command_args(self.socket_path)
        self.proc: subprocess.Popen | None = None
        self.phase = "starting"
        self.started_at = 0.0
        self.ready_after: float | None = None
        self.fatal_lines: list[str] = []
        self._traceback_ends = TracebackEnds()
        self._tails: dict[str, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=tail_lines)
        )
        self._seen: dict[int, ProcessRecord] = {}
        self._reader: threading.Thread | None = None
        self._lines_read = 0
        self._last_said: tuple[str | None, str] | None = None  # (rank tag, what it said) of the last log line
        self._last_progress = 0.0
        self.teardown: TeardownReport | None = None
        self._pid_tags: dict[int, str] = {}  # pid -> the tag vLLM writes before its lines ("Worker_TP1")
        self._oom_kills_before: int | None = None
        self._oom_lines: list[str] = []
        self.write_error: str | None = None  # why a log of this start could not be written (the disk is full)

    # --- start-up -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "ranks").mkdir(exist_ok=True)
        (self.log_dir / "command.txt").write_text(" ".join(self.command) + "\n")
        self.started_at = self._last_progress = time.monotonic()
        self._oom_kills_before = oom.kill_count()
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_setup(self.niceness),
            cwd=self.log_dir,
        )
        _live.add(self)
        self._note_processes()
        self._reader = threading.Thread(target=self._read_output, name="b70lab-engine-log", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        """Drain the engine's output into server.log and a file per rank. A write that fails (the disk is full)
        stops the writing, never the draining: an undrained pipe would block vLLM mid-line, and the start's
        failure must come from the launcher, naming the file (write_error), not from a deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        rank_files: dict[str, TextIO] = {}
        server_log: TextIO | None = self._open_log(self.log_dir / "server.log")
        for raw in self.proc.stdout:
            line = ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n")
            self._lines_read += 1
            m = RANK_TAG.match(line)
            tag = m.group("tag") if m else "main"
            if m:  # the last tag wins: vLLM renames "VllmWorker-1" to "Worker_TP1_EP1" once it has its ranks
                self._pid_tags[int(m.group("pid"))] = tag
            self._tails[tag].append(line)
            if said := split_line(line)[1].strip():
                self._last_said = (m.group("tag") if m else None, said)
            if self.write_error is None and server_log is not None:
                if tag not in rank_files and (opened := self._open_log(self.log_dir / "ranks" / f"{tag}.log")):
                    rank_files[tag] = opened
                self._write(server_log, line)
                if tag in rank_files:
                    self._write(rank_files[tag], line)
            # A traceback's exception line is an error line whatever its class (root_cause reads it); the
            # traceback of an exception Python ignored is none.
            seen = self._traceback_ends.feed(line)
            ends = seen == TracebackEnds.END
            if (
                (FATAL.search(line) or ends)
                and seen != TracebackEnds.IGNORED
                and len(self.fatal_lines) < (40 if ends else 20)
            ):
                self.fatal_lines.append(line)
            self._advance_phase(line)
            if rejected := CACHE_REJECTED.search(line):
                self._progress(
                    f"compile cache artifact {rejected['path']} did not load ({rejected['reason'][:120]}): "
                    f"vLLM compiles again"
                )
        for f in (server_log, *rank_files.values()):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()

    def _open_log(self, path: Path) -> TextIO | None:
        try:
            return open(path, "w", encoding="utf-8")
        except OSError as e:
            self._write_failed(path, e)
            return None

    def _write(self, f: TextIO, line: str) -> None:
        try:
            f.write(line + "\n")
            f.flush()
        except OSError as e:
            self._write_failed(Path(f.name), e)

    def _write_failed(self, path: Path, error: OSError) -> None:
        if self.write_error is None:
            folder = self.log_dir.parent
            self.write_error = (
                disk.full_message(path, error, folder) if disk.is_full(error) else (f"could not write {path}: {error}")
            )

    def check_writes(self) -> None:
        """Raise EngineStartError once a log of this start could not be written (see _read_output)."""
        if self.write_error is not None:
            raise EngineStartError(self.failure_report(self.write_error))

    def _advance_phase(self, line: str) -> None:
        names = [name for name, _ in PHASES]
        current = names.index(self.phase) if self.phase in names else -1
        for index, (name, pattern) in enumerate(PHASES):
            if index > current and pattern.search(line):
                self.phase = name
                self._progress(name)
                return

    def _progress(self, what: str) -> None:
        self._last_progress = time.monotonic()
        if self.on_progress:
            self.on_progress(what, self._last_progress - self.started_at)

    def _heartbeat(self) -> None:
        """No progress line for HEARTBEAT_S: say that the phase goes on, and what the logs last said."""
        if time.monotonic() - self._last_progress < HEARTBEAT_S:
            return
        tag, said = self._last_said or (None, "nothing yet")
        said = said if len(said) <= 100 else said[:99] + "…"
        self._progress(f"{self.phase}, still; last log line{f' ({tag})' if tag else ''}: {said}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def client(self, timeout: float = 60.0) -> httpx.Client:
        if self.tcp is not None:
            return httpx.Client(
                base_url=self.tcp.base_url, timeout=timeout, headers={"Authorization": f"Bearer {self.tcp.api_key}"}
            )
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path)), base_url="http://b70lab-engine", timeout=timeout
        )

    def wait_ready(self, deadline_s: float) -> float:
        """Block until /health answers; returns seconds from start. Raises EngineStartError on death or
        on the deadline, with each rank's last lines."""
        assert self.proc is not None, "start() first"
        with self.client(timeout=5.0) as client:
            while True:
                self._note_processes()
                if self.proc.poll() is not None:
                    self._join_reader()
                    raise EngineStartError(
                        self.failure_report(
                            f"the server exited with code {self.proc.returncode} during start-up "
                            f"(phase: {self.phase}, {self.elapsed():.0f} s)"
                        )
                    )
                self.check_writes()
                if self.elapsed() > deadline_s:
                    raise EngineStartError(
                        self.failure_report(
                            f"the server was not ready within the {deadline_s:.0f} s start-up deadline "
                            f"(stalled in phase: {self.phase})"
                        )
                    )
                if self.tcp is not None or self.socket_path.exists():
                    try:
                        if client.get("/health").status_code == 200:
                            self.ready_after = self.elapsed()
                            self._note_processes()
                            if self.phase != "ready":
                                self._progress("ready")
                            self.phase = "ready"
                            return self.ready_after
                    except httpx.TransportError:
                        pass
                self._heartbeat()
                time.sleep(1.0)

    def _join_reader(self, timeout: float = 10.0) -> None:
        if self._reader is not None:
            self._reader.join(timeout)

    def tails(self) -> dict[str, list[str]]:
        return {tag: list(lines) for tag, lines in sorted(self._tails.items())}

    def first_errors(self) -> list[str]:
        """The first few error lines of the engine's output, and any later line that says which process died
        or what a traceback raised (it can come after many ranks' tracebacks): what root_cause chooses from.
        First, what the kernel's OOM killer did to the start's processes: a killed rank writes nothing."""
        later = [
            line
            for line in self.fatal_lines[8:]
            if "died unexpectedly" in line or is_exception_line(split_line(line)[1])
        ]
        return self.oom_kills() + self.fatal_lines[:8] + later[:4]

    def oom_kills(self) -> list[str]:
        """A line per process of this start the kernel's OOM killer killed, tagged as vLLM tags that process's
        lines (`(Worker_TP1 pid=123) out of memory: ...`); once found, kept."""
        if self._oom_lines or self.proc is None:
            return self._oom_lines
        # printk's clock and CLOCK_MONOTONIC can drift apart in a guest: a margin, the pids decide
        messages = oom.kernel_log(self.started_at - 60.0)
        if messages is None:
            counted = oom.counted_only(self._oom_kills_before, oom.kill_count())
            return [counted] if counted else []
        ours = set(self._seen) | set(self._pid_tags)
        for kill in oom.parse_kills(messages):
            if kill.pid in ours:
                tag = self._pid_tags.get(kill.pid)
                line = oom.describe(kill, oom.memcg_limit(kill.memcg) if kill.memcg else None)
                self._oom_lines.append(f"({tag} pid={kill.pid}) {line}" if tag else line)
        return self._oom_lines

    def failure_report(self, headline: str) -> str:
        parts = [headline, f"logs: {self.log_dir / 'server.log'} (per rank: {self.log_dir / 'ranks'})"]
        if shown := self.first_errors():
            parts.append("first error lines:\n  " + "\n  ".join(shown))
        for tag, lines in self.tails().items():
            parts.append(f"--- last lines of {tag} ---\n  " + "\n  ".join(lines[-12:]))
        return "\n".join(parts)

    # --- who can reach the engine ---------------------------------------------------------------------

    def exposure(self) -> dict:
        """Every socket the engine's processes listen on, seen from outside with psutil, and the mode of the
        private socket's folder: the evidence that only its owner could reach it (the API and its
        development endpoints on the 0700 Unix socket; the ranks' rendezvous and Gloo on loopback only)."""
        import ipaddress
        import stat

        listening, problems = [], []
        for proc in self._group_members():
            try:
                name = proc.name()
                sockets = proc.net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            for sock in sockets:
                # TCP listens; a bound UDP socket (no status, no peer) receives from anyone who can route to it.
                if sock.status != psutil.CONN_LISTEN and not (sock.status == psutil.CONN_NONE and not sock.raddr):
                    continue
                ip, port = sock.laddr.ip, sock.laddr.port
                loopback = ipaddress.ip_address(ip.split("%")[0]).is_loopback
                kind = "tcp" if sock.type == socket.SOCK_STREAM else "udp"
                listening.append(
                    {"pid": proc.pid, "process": name, "proto": kind, "address": ip, "port": port, "loopback": loopback}
                )
                if not loopback:
                    problems.append(f"{name} (pid {proc.pid}) listens on {kind} {ip}:{port}, not loopback")
                elif self.tcp is None and self.proc is not None and proc.pid == self.proc.pid and kind == "tcp":
                    problems.append(
                        f"the API server (pid {proc.pid}) listens on {ip}:{port}: the API belongs on "
                        f"the private socket only"
                    )
        mode = stat.S_IMODE(self.socket_dir.stat().st_mode) if self.socket_dir.is_dir() else None
        if self.tcp is None and mode != 0o700:
            problems.append(
                f"the socket folder {self.socket_dir} has mode {oct(mode) if mode is not None else 'gone'}, not 0o700"
            )
        return {
            "api": f"tcp {self.tcp.base_url}" if self.tcp else f"unix {self.socket_path}",
            "socket_dir_mode": oct(mode) if mode is not None else None,
            "listening": sorted(listening, key=lambda x: (x["process"], x["port"])),
            "problems": problems,
        }

    # --- teardown -------------------------------------------------------------------------------------

    def _group_members(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        members: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.proc.pid)
            members[root.pid] = root
            for child in root.children(recursive=True):
                members[child.pid] = child
        except psutil.NoSuchProcess:
            pass
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == self.proc.pid:
                    members[p.pid] = p
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        return list(members.values())

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of every process of the server's group so far (None: none could be read)."""
        total, read = 0.0, False
        for p in self._group_members():
            try:
                times = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total, read = total + times.user + times.system, True
        return total if read else None

    def major_faults(self) -> int | None:
        """Page faults that read from disk, over every process of the server's group so far (None: none read)."""
        found = [processes.major_faults(p.pid) for p in self._group_members()]
        counts = [n for n in found if n is not None]
        return sum(counts) if counts else None

    def _note_processes(self) -> None:
        for p in self._group_members():
            if p.pid not in self._seen:
                try:
                    self._seen[p.pid] = ProcessRecord(p.pid, p.name(), " ".join(p.cmdline())[:200])
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def stop(self, grace_s: float = 20.0) -> TeardownReport:
        """SIGINT, then SIGTERM, then SIGKILL to the group, each with a grace period, then verify."""
        if self.teardown is not None:
            return self.teardown
        report = TeardownReport()
        t0 = time.monotonic()
        if self.proc is not None:
            report.log_line = self._lines_read
            self._note_processes()
            ended_by = {pid: "exited before teardown" for pid in self._seen if not self._alive(pid)}
            for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                pids = [pid for pid in self._seen if self._alive(pid)]
                if not pids:
                    break
                report.signals_sent.append(sig.name)
                processes.signal_group(self.proc.pid, sig)
                for pid in pids:  # a process that left the group is still ours to end
                    processes.signal_process(pid, sig)
                end = time.monotonic() + wait
                while time.monotonic() < end:
                    self.proc.poll()
                    self._note_processes()
                    if not any(self._alive(pid) for pid in self._seen):
                        break
                    time.sleep(0.2)
                for pid in self._seen:
                    if pid not in ended_by and not self._alive(pid):
                        ended_by[pid] = f"ended after {sig.name}"
            self.proc.poll()
            self._join_reader()
            for pid, record in sorted(self._seen.items()):
                record.gone = not self._alive(pid)
                record.how = ended_by.get(pid, "exited") if record.gone else "STILL RUNNING"
                report.processes.append(record)
        report.seconds = time.monotonic() - t0
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        _live.discard(self)
        self.teardown = report
        return report

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
