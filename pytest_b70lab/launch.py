"""Start `vllm serve` as a child in its own process group, watch it come up, and take it down verifiably.

The server listens on a Unix socket inside a private (0700) folder, so only its owner can reach it. Every
output line is kept (`server.log`) and split by the rank tag vLLM puts in front of it (`ranks/<tag>.log`).
Teardown escalates SIGINT -> SIGTERM -> SIGKILL on the whole group and then checks every process that was
ever seen in the group or under the server: the report says, per process, whether it is gone.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from .in_engine import cpu_emulation
from .errors import LabError

# "(Worker_TP1_EP1 pid=123)", "(EngineCore pid=7)", "(APIServer pid=5)", "(Worker pid=9)", "(VllmWorker-0 pid=9)"
RANK_TAG = re.compile(r"^\((?P<tag>[A-Za-z][\w\-]*) pid=(?P<pid>\d+)\)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Start-up phases, recognised from vLLM's log lines; the first match of each moves the phase forward.
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"Starting to load model|Loading weights|Loading drafter model")),
    ("compiling", re.compile(r"Warming up model for the compilation|Dynamo bytecode transform|Compiling model")),
    ("allocating KV cache", re.compile(r"KV cache size|Explicitly set .* for KV cache")),
    ("starting API server", re.compile(r"init engine .*took|Starting vLLM (API )?server")),
    ("ready", re.compile(r"Application startup complete")),
)

FATAL = re.compile(r"Segfault encountered|Traceback \(most recent call last\)|died unexpectedly|"
                   r"RuntimeError|EngineCore failed to start")
TRACEBACK = "Traceback (most recent call last):"
# vLLM's log-record header after the rank tag ("ERROR 12-01 10:00:00 [multiproc_executor.py:953] "): vLLM
# repeats tag and header on every line of a multi-line record, a logged traceback's lines included.
LOG_HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ")
# A traceback's last line: the exception's class, dotted or not, then ": message" or nothing
# ("NotImplementedError: ...", "torch.OutOfMemoryError: ...", "AssertionError"). Any class, not a list of names.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s.*)?)?$")
# The processes that are ranks: "(Worker pid=)", "(Worker_TP1_EP1 pid=)", and early on "(VllmWorker-0 pid=)".
RANK_PROCESS = re.compile(r"^(?:Vllm)?Worker(?:$|[_\-])")


def split_line(line: str) -> tuple[str | None, str]:
    """A line of the engine's output as (the process tag vLLM put in front of it, or None; what it says, with
    the log-record header and trailing whitespace removed: vLLM ends a multi-line record's lines in "\\r")."""
    m = RANK_TAG.match(line)
    body = line[m.end():].removeprefix(" ") if m else line
    return (m.group("tag") if m else None), LOG_HEADER.sub("", body, count=1).rstrip()


def is_exception_line(body: str) -> bool:
    """`body` (split_line's) reads as the last line of a traceback: an exception's name, unindented."""
    return bool(body) and not body.startswith(TRACEBACK) and EXCEPTION_LINE.match(body) is not None


# What Python writes before the traceback of an exception it ignored (sys.unraisablehook: one raised in a
# __del__ during garbage collection, as vLLM's CPUDNNLGEMMHandler.__del__ does while a model compiles).
UNRAISABLE = "Exception ignored in"


class TracebackEnds:
    """Fed the engine's output line by line, says what each line is to a Python traceback, per process tag:
    END for the exception line that ends one (the first unindented exception line after `Traceback (most
    recent call last):`; its frames are indented), IGNORED for the `Traceback` line of an exception that
    Python reported and ignored (after `Exception ignored in: ...`: nothing failed), else None."""

    END, IGNORED = "end", "ignored"

    def __init__(self) -> None:
        self._open: dict[str | None, bool] = {}   # tag -> whether its open traceback counts
        # tag -> `Exception ignored in` notices whose traceback has not begun yet. Counted, not read off the
        # line before: two ranks' unraisable tracebacks go to stderr untagged and interleave, a notice in the
        # middle of another's line or a line or two before its own `Traceback` (seen while the model compiles).
        self._ignored: dict[str | None, int] = {}

    def feed(self, line: str) -> str | None:
        tag, body = split_line(line)
        if UNRAISABLE in body:
            self._ignored[tag] = self._ignored.get(tag, 0) + 1
        if body.startswith(TRACEBACK):
            pending = self._ignored.get(tag, 0)
            self._open[tag] = not pending
            if pending:
                self._ignored[tag] = pending - 1
                return self.IGNORED
            return None
        if tag in self._open and is_exception_line(body):
            return self.END if self._open.pop(tag) else None
        return None


def root_cause(errors: list[str]) -> tuple[str | None, str] | None:
    """Which of a failed start's error lines (EngineServer.first_errors, in the order they were written) says
    why it failed, as (process tag or None, what the line says):

    1. the first exception a rank raised: the last line of its first traceback
       (`NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.`);
    2. else a line naming a process that died (`Worker proc VllmWorker-1 died unexpectedly (exit code: 0)`):
       the executor writes it after a rank raised or was killed, which makes it the effect when 1 exists;
    3. else the first exception of another process (engine core, API server), one that points elsewhere for
       its cause last (vLLM's `... See root cause above.`);
    4. else the first other error line. A bare `Traceback (most recent call last):` names nothing: never."""
    lines = [split_line(e) for e in errors]
    exceptions = [(tag, body) for tag, body in lines if is_exception_line(body)]
    ranks = [(tag, body) for tag, body in exceptions if tag and RANK_PROCESS.match(tag)]
    died = [(tag, body) for tag, body in lines if "died unexpectedly" in body]
    others = sorted(exceptions, key=lambda e: "root cause" in e[1].lower())  # stable: in order otherwise
    rest = [(tag, body.strip()) for tag, body in lines if body.strip() and not body.strip().startswith(TRACEBACK)]
    return next((found[0] for found in (ranks, died, others, rest) if found), None)


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
        return {"clean": self.clean, "signals_sent": self.signals_sent, "seconds": round(self.seconds, 3),
                "log_line": self.log_line, "processes": [vars(p) for p in self.processes]}


def thread_binding(world_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `world_size` ranks on the cores this process may use.

    vLLM's `auto` gives each rank its own NUMA node, and a one-node machine has one: bind by hand. With
    more cores than ranks, each rank gets a core of its own and the rest serve the engine core, the API
    server and the measuring client. Otherwise the ranks share every core round-robin, and the launch turns
    vLLM's spinning SHM all-reduce off (ranks_need_blocking_allreduce), so that a waiting rank blocks and
    the engine core can use its core. Measured on 2 cores, TP2+EP2+DFlash with gloo: `0|1` 215 / 217 tok/s
    and 49 s starts against `0|0` 218 / ~210 tok/s and 87-95 s starts (the ranks then compile on one core);
    with the SHM all-reduce `0|0` was 16.5 tok/s (notes/2026-11-30-cpu-shm-allreduce-spins.md)."""
    cores = sorted(os.sched_getaffinity(0))
    usable = cores[:world_size] if len(cores) > world_size else cores
    return "|".join(str(usable[i % len(usable)]) for i in range(world_size))


def ranks_need_blocking_allreduce(world_size: int) -> bool:
    """Whether the ranks (plus the engine core and API server, which need a core too) outnumber the cores.
    vLLM's SHM all-reduce busy-waits without yielding, so then a rank spins out its time slice on every
    all-reduce while the peer it waits for cannot run; gloo blocks instead. Measured on 2 cores, TP2+EP2
    mini (notes/2026-11-30-cpu-shm-allreduce-spins.md): DFlash 111.6 -> 194.9 tok/s, target-only 27.2 -> 58.5."""
    return world_size > 1 and len(os.sched_getaffinity(0)) < world_size + 1


# The B70 launch profile (device "xpu"). Each setting names where it comes from; paths such as
# vllm/platforms/xpu.py are vLLM 0.32's sources (the vllm-cpu build in .venv carries the XPU build's Python files).
# torch.distributed backend of the ranks: vLLM's XPU platform fixes it (`XPUPlatform.dist_backend = "xccl"`,
# vllm/platforms/xpu.py, set when torch.distributed.is_xccl_available()); there is no flag or variable for it.
# vLLM's XPU installation docs ("distributed-backend"): torch-ccl below torch 2.8, the built-in xccl from 2.8.
XPU_DIST_BACKEND = "xccl"
# The rank processes: vLLM's own multiprocessing executor on one host, pinned so that an installed Ray cannot
# change it (`--distributed-executor-backend`, vllm/config/parallel.py; mp is the XPU docs' single-node example).
XPU_EXECUTOR_BACKEND = "mp"
# Per-rank inheritance that must not reach the ranks: vLLM's XPU worker sets LOCAL_RANK per rank and keeps an
# inherited LOCAL_WORLD_SIZE (vllm/v1/worker/xpu_worker.py init_device), and torch's XCCL process group turns
# them into CCL_PROCESS_LAUNCHER=none, CCL_LOCAL_RANK, CCL_LOCAL_SIZE (ProcessGroupXCCL.cpp), as oneCCL's
# docs require without an MPI launcher ("CCL_PROCESS_LAUNCHER"). A value from the caller's shell would give
# every rank the same one.
XPU_PER_RANK_VARIABLES = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "CCL_LOCAL_RANK", "CCL_LOCAL_SIZE",
                          "CCL_PROCESS_LAUNCHER")
# A host whose B70s are not Level Zero GPUs 0..N-1 (an integrated GPU listed first) names them, in rank order.
XPU_CARDS_VARIABLE = "B70LAB_XPU_CARDS"


def xpu_environment(world_size: int, devices: Iterable[int] | None = None) -> dict[str, str]:
    """The XPU variables of an engine start with `world_size` ranks, one card each: `devices`, else the cards
    listed in B70LAB_XPU_CARDS ("1,2,3,4"), else 0..N-1. Rank i runs on the i-th listed card: vLLM's XPU worker
    maps its local rank through ZE_AFFINITY_MASK (XPUPlatform.device_control_env_var, vllm/platforms/interface.py
    logical_device_id_to_visible_device_id), so the engine process sees all of them."""
    if devices is None and os.environ.get(XPU_CARDS_VARIABLE):
        devices = [int(d) for d in os.environ[XPU_CARDS_VARIABLE].split(",")]
    cards = list(range(world_size)) if devices is None else [int(d) for d in devices]
    if len(cards) != world_size or len(set(cards)) != world_size or min(cards, default=0) < 0:
        raise ValueError(f"the XPU profile needs {world_size} distinct card indices, one per rank; got {cards}")
    return {
        # Level Zero's device visibility (Level Zero specification, "Environment Variables"): the cards this
        # engine may use, in rank order. vLLM's device control variable on XPU (vllm/platforms/xpu.py).
        "ZE_AFFINITY_MASK": ",".join(map(str, cards)),
        # SYCL (so torch.xpu) sees Level Zero GPUs only (oneAPI DPC++ runtime docs, "Environment Variables",
        # ONEAPI_DEVICE_SELECTOR): no OpenCL or CPU device in the enumeration that the mask's indices refer to.
        "ONEAPI_DEVICE_SELECTOR": "level_zero:gpu",
        # vLLM starts its XPU workers with spawn only ("spawn is the only supported multiprocessing method on
        # XPU", vllm/platforms/xpu.py, which sets it when unset): said here, so the evidence records it.
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        # oneCCL's transport for the ranks' host-side exchange (oneCCL docs, "Environment Variables" /
        # "Transport Selection": mpi is the default and needs an MPI launcher; ofi is libfabric). vLLM's XPU
        # worker sets ofi when it is unset (vllm/v1/worker/xpu_worker.py).
        "CCL_ATL_TRANSPORT": "ofi",
        # How oneCCL hands Level Zero IPC handles between the ranks for the device all-reduce (oneCCL docs,
        # "CCL_ZE_IPC_EXCHANGE": drmfd, pidfd, sockets). The default pidfd (from 2021.14; Linux >= 5.6)
        # duplicates descriptors with pidfd_getfd, which needs ptrace access to the peer (pidfd_getfd(2)) and
        # Yama's default ptrace_scope=1 refuses it between sibling processes such as vLLM's workers; sockets
        # has no such precondition.
        "CCL_ZE_IPC_EXCHANGE": "sockets",
    }


def xpu_profile_summary(world_size: int) -> str:
    """One line for the dry run: what the XPU profile selects that the environment alone does not show."""
    return (f"xpu profile: {world_size} ranks on cards {xpu_environment(world_size)['ZE_AFFINITY_MASK']} "
            f"(rank i on the i-th), torch.distributed backend {XPU_DIST_BACKEND} (chosen by vLLM's XPU platform, "
            f"needs torch >= 2.8 built with XCCL), executor {XPU_EXECUTOR_BACKEND}")


def engine_environment(state_dir: Path, world_size: int, extra: dict[str, str] | None = None, *,
                       device: str = "cpu", offline: bool = True, materialize: bool = True) -> dict[str, str]:
    """The engine's environment: every cache inside `state_dir`, dev endpoints on; on CPU, the KV budget
    and thread binding; on XPU, the B70 profile (xpu_environment). With materialize=False nothing is created
    (to show a dry run's environment)."""
    caches = {
        "VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
        "XDG_CACHE_HOME": "xdg", "TMPDIR": "tmp", "VLLM_RPC_BASE_PATH": "ipc",
    }
    if offline:  # a hub model keeps the caller's HF_HOME: that is where its weights are
        caches["HF_HOME"] = "hf"
    state_dir = Path(state_dir).resolve() if materialize else Path(state_dir)
    emulation = cpu_emulation.requested() if device == "cpu" else None
    if emulation:  # compiled code of the real CPU must never be loaded into the emulated one, nor the reverse
        state_dir = state_dir / f"emulate-{emulation}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_"))}
    for var, sub in caches.items():
        path = state_dir / sub
        if materialize:
            path.mkdir(parents=True, exist_ok=True)
        env[var] = str(path)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_SERVER_DEV_MODE": "1",
                "PYTHONUNBUFFERED": "1"})
    if offline:
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if device == "cpu":
        env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": thread_binding(world_size)})
        if ranks_need_blocking_allreduce(world_size):
            env["VLLM_CPU_SHM_ALLREDUCE"] = "0"  # in_engine.fixes (patch 0006) reads it
    elif device == "xpu":
        for var in XPU_PER_RANK_VARIABLES:
            env.pop(var, None)
        env.update(xpu_environment(world_size))
    if emulation:  # read by torch, oneDNN and Inductor as they load: the in-process part is in_engine.cpu_emulation's
        env.update(cpu_emulation.EMULATION_ENVIRONMENT[emulation])
    if os.environ.get("B70LAB_VLLM_FIXES"):
        env["B70LAB_VLLM_FIXES"] = os.environ["B70LAB_VLLM_FIXES"]
    env.update(extra or {})
    return env


# The engine command's two module paths, recorded in every start's evidence: thin modules keep them
# (in_engine/ has the code), and tests that find engine processes by their command line use these names.
ENTRY_MODULE = "pytest_b70lab.vllm_entry"
EXTENSION_CLASS = "pytest_b70lab.worker_ext.AuditExtension"


def vllm_serve_command(model: str, socket_path: Path, args: Iterable[str], tcp: TcpListen | None = None) -> list[str]:
    where = ["--host", LOOPBACK, "--port", str(tcp.port)] if tcp else ["--uds", str(socket_path)]
    return [sys.executable, "-m", ENTRY_MODULE, "serve", model, *where, *args]


LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class TcpListen:
    """Benchmark-only mode: the API on loopback TCP behind a key, for tools that speak only TCP (`vllm bench
    serve`). The gates never use it: their engine answers on a private Unix socket. The key reaches the
    server through its environment (VLLM_API_KEY), never its command line, so logs and command.txt stay
    clean of it."""

    port: int
    api_key: str

    @staticmethod
    def fresh() -> TcpListen:
        import secrets
        import socket

        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        return TcpListen(port, secrets.token_urlsafe(24))

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


@dataclass(frozen=True)
class ServeConfig:
    """The engine arguments this harness passes, and nothing else. Prefix caching and async scheduling
    are always off and one sequence runs at a time: the lab's decode measurement conditions."""

    model: str | Path
    revision: str | None = None
    dtype: str = "float32"
    kv_cache_dtype: str = "fp8"
    block_size: int = 32
    tensor_parallel: int = 1
    expert_parallel: bool = False
    draft: str | Path | None = None
    draft_revision: str | None = None
    speculative_method: str = "dflash"
    num_speculative_tokens: int = 11
    max_model_len: int = 2048
    enforce_eager: bool = False
    attention_backend: str | None = None
    seed: int = 0
    tool_call_parser: str | None = None  # e.g. "poolside_v1": auto tool choice through vLLM's parser
    chat_template: Path | None = None    # None: the tokenizer's own
    device: str = "cpu"                  # "xpu": the B70 profile (executor pinned; environment in xpu_environment)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel

    @property
    def model_ref(self) -> str:
        return _model_ref(self.model)

    def args(self) -> list[str]:
        args = []
        if self.revision:
            args += ["--revision", self.revision]
        args += ["--dtype", self.dtype, "--kv-cache-dtype", self.kv_cache_dtype,
                 "--block-size", str(self.block_size), "--no-enable-prefix-caching", "--no-async-scheduling",
                 "--max-num-seqs", "1", "--max-model-len", str(self.max_model_len),
                 "--enable-prompt-tokens-details", "--seed", str(self.seed),
                 "--tensor-parallel-size", str(self.tensor_parallel),
                 "--worker-extension-cls", EXTENSION_CLASS]
        if self.expert_parallel:
            args.append("--enable-expert-parallel")
        if self.device == "xpu" and self.tensor_parallel > 1:
            args += ["--distributed-executor-backend", XPU_EXECUTOR_BACKEND]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.attention_backend:
            args += ["--attention-backend", self.attention_backend]
        if self.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.chat_template:
            args += ["--chat-template", str(self.chat_template)]
        if self.draft is not None:
            spec = {"method": self.speculative_method, "model": _model_ref(self.draft),
                    "num_speculative_tokens": self.num_speculative_tokens}
            if self.draft_revision:
                spec["revision"] = self.draft_revision
            args += ["--speculative-config", json.dumps(spec, sort_keys=True)]
        return args


def _model_ref(model: str | Path) -> str:
    """A local folder as an absolute path (the server runs in its log folder); a hub id as it is."""
    return str(Path(model).resolve()) if isinstance(model, Path) else model


def start_engine(config: ServeConfig, run_dir: Path, state_dir: Path, *, deadline_s: float = 900.0,
                 env_extra: dict[str, str] | None = None,
                 on_progress: Callable[[str, float], None] | None = None, niceness: int = 0,
                 tcp: TcpListen | None = None) -> EngineServer:
    """A ready server for `config`, or EngineStartError (after verified teardown of what was started)."""
    env = engine_environment(state_dir, config.world_size, {**(env_extra or {}),
                                                            **({"VLLM_API_KEY": tcp.api_key} if tcp else {})},
                             device=config.device)
    server = EngineServer(lambda sock: vllm_serve_command(config.model_ref, sock, config.args(), tcp), env, run_dir,
                          on_progress=on_progress, niceness=niceness, tcp=tcp)
    server.start()
    try:
        server.wait_ready(deadline_s)
    except BaseException:
        server.stop()
        raise
    return server


def _child_setup(niceness: int) -> Callable[[], None]:
    def setup() -> None:
        _die_with_parent()
        if niceness:
            os.nice(niceness)
    return setup


def _die_with_parent() -> None:
    """In the child before exec: own process group, and SIGTERM when the parent dies (a SIGKILLed pytest
    must not leave an engine behind)."""
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_live: set[EngineServer] = set()


def _stop_all_at_exit() -> None:
    for server in list(_live):
        server.stop()


atexit.register(_stop_all_at_exit)


class EngineServer:
    """One `vllm serve` child. Use as a context manager, or call start(), wait_ready() and stop()."""

    def __init__(self, command_args: Callable[[Path], list[str]], env: dict[str, str], log_dir: Path,
                 on_progress: Callable[[str, float], None] | None = None, tail_lines: int = 40,
                 niceness: int = 0, tcp: TcpListen | None = None):
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
            lambda: collections.deque(maxlen=tail_lines))
        self._seen: dict[int, ProcessRecord] = {}
        self._reader: threading.Thread | None = None
        self._lines_read = 0
        self.teardown: TeardownReport | None = None

    # --- start-up -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "ranks").mkdir(exist_ok=True)
        (self.log_dir / "command.txt").write_text(" ".join(self.command) + "\n")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.command, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=_child_setup(self.niceness), cwd=self.log_dir)
        _live.add(self)
        self._note_processes()
        self._reader = threading.Thread(target=self._read_output, name="b70lab-engine-log", daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        rank_files: dict[str, object] = {}
        with open(self.log_dir / "server.log", "w", encoding="utf-8") as server_log:
            for raw in self.proc.stdout:
                line = ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n")
                server_log.write(line + "\n")
                server_log.flush()
                self._lines_read += 1
                m = RANK_TAG.match(line)
                tag = m.group("tag") if m else "main"
                self._tails[tag].append(line)
                f = rank_files.get(tag)
                if f is None:
                    f = rank_files[tag] = open(self.log_dir / "ranks" / f"{tag}.log", "w", encoding="utf-8")
                f.write(line + "\n")  # type: ignore[attr-defined]
                # A traceback's exception line is an error line whatever its class (root_cause reads it); the
                # traceback of an exception Python ignored is none.
                seen = self._traceback_ends.feed(line)
                ends = seen == TracebackEnds.END
                if (FATAL.search(line) or ends) and seen != TracebackEnds.IGNORED and \
                        len(self.fatal_lines) < (40 if ends else 20):
                    self.fatal_lines.append(line)
                self._advance_phase(line)
        for f in rank_files.values():
            f.close()  # type: ignore[attr-defined]

    def _advance_phase(self, line: str) -> None:
        names = [name for name, _ in PHASES]
        current = names.index(self.phase) if self.phase in names else -1
        for index, (name, pattern) in enumerate(PHASES):
            if index > current and pattern.search(line):
                self.phase = name
                if self.on_progress:
                    self.on_progress(name, time.monotonic() - self.started_at)
                return

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def client(self, timeout: float = 60.0) -> httpx.Client:
        if self.tcp is not None:
            return httpx.Client(base_url=self.tcp.base_url, timeout=timeout,
                                headers={"Authorization": f"Bearer {self.tcp.api_key}"})
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket_path)),
                            base_url="http://b70lab-engine", timeout=timeout)

    def wait_ready(self, deadline_s: float) -> float:
        """Block until /health answers; returns seconds from start. Raises EngineStartError on death or
        on the deadline, with each rank's last lines."""
        assert self.proc is not None, "start() first"
        with self.client(timeout=5.0) as client:
            while True:
                self._note_processes()
                if self.proc.poll() is not None:
                    self._join_reader()
                    raise EngineStartError(self.failure_report(
                        f"the server exited with code {self.proc.returncode} during start-up "
                        f"(phase: {self.phase}, {self.elapsed():.0f} s)"))
                if self.elapsed() > deadline_s:
                    raise EngineStartError(self.failure_report(
                        f"the server was not ready within the {deadline_s:.0f} s start-up deadline "
                        f"(stalled in phase: {self.phase})"))
                if self.tcp is not None or self.socket_path.exists():
                    try:
                        if client.get("/health").status_code == 200:
                            self.ready_after = self.elapsed()
                            self._note_processes()
                            if self.on_progress and self.phase != "ready":
                                self.on_progress("ready", self.ready_after)
                            self.phase = "ready"
                            return self.ready_after
                    except httpx.TransportError:
                        pass
                time.sleep(1.0)

    def _join_reader(self, timeout: float = 10.0) -> None:
        if self._reader is not None:
            self._reader.join(timeout)

    def tails(self) -> dict[str, list[str]]:
        return {tag: list(lines) for tag, lines in sorted(self._tails.items())}

    def first_errors(self) -> list[str]:
        """The first few error lines of the engine's output, and any later line that says which process died
        or what a traceback raised (it can come after many ranks' tracebacks): what root_cause chooses from."""
        later = [line for line in self.fatal_lines[8:]
                 if "died unexpectedly" in line or is_exception_line(split_line(line)[1])]
        return self.fatal_lines[:8] + later[:4]

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
                listening.append({"pid": proc.pid, "process": name, "proto": kind, "address": ip, "port": port,
                                  "loopback": loopback})
                if not loopback:
                    problems.append(f"{name} (pid {proc.pid}) listens on {kind} {ip}:{port}, not loopback")
                elif self.tcp is None and proc.pid == self.proc.pid and kind == "tcp":
                    problems.append(f"the API server (pid {proc.pid}) listens on {ip}:{port}: the API belongs on "
                                    f"the private socket only")
        mode = stat.S_IMODE(self.socket_dir.stat().st_mode) if self.socket_dir.is_dir() else None
        if self.tcp is None and mode != 0o700:
            problems.append(f"the socket folder {self.socket_dir} has mode {oct(mode) if mode is not None else 'gone'}"
                            f", not 0o700")
        return {"api": f"tcp {self.tcp.base_url}" if self.tcp else f"unix {self.socket_path}",
                "socket_dir_mode": oct(mode) if mode is not None else None,
                "listening": sorted(listening, key=lambda x: (x["process"], x["port"])), "problems": problems}

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
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                for pid in pids:  # a process that left the group is still ours to end
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
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
