"""Run model-generated Python (a function plus its `check(candidate)` test) without trusting it.

Generated code can loop forever, fork without end, fill memory, write where it should not or talk to the
network, and the quality gate runs hundreds of such samples in the same session as the engine. Every one of
those must end as a failed sample with a short reason, never as a hung or crashed session, and no process
may outlive its run. So the code runs in layers, each enough to stop the obvious attacks on its own:

- always: a fresh folder as cwd, HOME and TMPDIR; a minimal environment; `python -I -B`; resource limits
  (CPU, address space, file size, process count, no core); no-new-privileges; output kept to a tail; a
  wall-clock timeout; a Python audit hook that ends the program at the first write outside its folder,
  network use, process creation, signal to another process or ctypes use, with a marker on stderr;
- where the machine allows it (probed once, see `os_layers()`): a new network namespace (no network at
  all), a new mount namespace in which every inherited mount is read-only and fresh tmpfs lie over /tmp,
  /var/tmp, /dev/shm and the folder itself, a new PID namespace (the kernel kills and reaps everything when
  its first process ends), and a pids cgroup where one is writable (bounds the process count, lists every
  process to kill). As root the program then runs as the user `nobody`; as an ordinary user the namespaces
  come from an unprivileged user namespace that maps only the user's own id, so the program holds no
  capability and, the file system being read-only, cannot touch the user's files either.

The audit hook is not a security boundary (CPython documents it so); the OS layers are, and the hook is what
makes a blocked attempt show up as "blocked: ..." rather than as some OSError. Why our own namespaces and not
bubblewrap: without its setuid bit (Debian's default) bubblewrap asks the kernel for the same unprivileged
user namespace, so it adds nothing where that is refused, and it would be one more program to install.
Where no OS layer works, `require_isolation` refuses to run generated code unless told otherwise.

A small launcher runs between this process and the program (this file run as a script, not a `preexec_fn`,
which is unsafe with threads and cannot stay behind to reap): it unshares, mounts, becomes the child subreaper, forks the
program (whose first step is joining the cgroup), reaps everything and reports the program's exit status and
CPU time on a status pipe.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "SandboxResult",
    "run_python",
    "os_layers",
    "require_isolation",
    "Unisolated",
    "PROBE_FAILURES",
    "BASE_LAYERS",
    "OS_LAYERS",
    "USER_OS_LAYERS",
    "ALLOW_UNISOLATED_ENV",
]

BLOCKED_STATUS = 97  # the audit hook's exit status; with the marker on stderr it means "blocked: ..."
SETUP_STATUS = 125  # the launcher could not set up a layer it was asked for
MARKER = "[b70lab-sandbox] "
BASE_LAYERS = ("tempdir", "rlimits", "no-new-privs")
# As root, in the order they are probed (each kept only if it works with the ones before it).
OS_LAYERS = ("pids-cgroup", "netns", "mountns-tmpfs", "readonly-root", "pidns", "unprivileged-user")
# As an ordinary user: the user namespace first, since the others need it.
USER_OS_LAYERS = ("userns", "netns", "mountns-tmpfs", "readonly-root", "pidns", "pids-cgroup")
PROBE_FAILURES: dict[str, str] = {}  # filled by os_layers(): why a layer is not used on this machine
ALLOW_UNISOLATED_ENV = "B70LAB_ALLOW_UNISOLATED_CODE"  # "1": run generated code with no OS layer (recorded)

# Linux constants the stdlib does not export (os.unshare and its CLONE_* arrive in Python 3.12).
_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
# mount_setattr(2) (Linux 5.12; one number on every architecture), to make every inherited mount read-only.
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 38, 36
_THROWAWAY = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # world-writable places, tmpfs in the mount ns


class Unisolated(Exception):
    """No OS layer works here and running generated code without one was not allowed."""


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exit status 0, not timed out, nothing blocked, nothing left behind
    reason: str  # "passed", "exit status 1: AssertionError", "CPU limit", "blocked: ...", ...
    returncode: int | None  # the program's; negative: killed by that signal; None: no status came back
    stdout_tail: str
    stderr_tail: str
    seconds: float  # wall clock, set-up and teardown included
    layers: tuple[str, ...]  # the isolation layers that were active for this run
    timed_out: bool = False
    cpu_s: float | None = None  # the program's CPU time, as the launcher reaped it


# The preamble runs in the sandboxed interpreter (possibly another Python version than this one: keep it
# plain). It installs the audit hook, then runs the program as __main__. A blocked event ends the process at
# once with os._exit rather than raising, so a program cannot catch the error and carry on.
_PREAMBLE = r"""
import os, sys
def _sandbox(box, program):
    import _posixsubprocess
    # bound now: the program may rebind the module attributes later
    real, join, isabs, isdir = os.path.realpath, os.path.join, os.path.isabs, os.path.isdir
    fsdecode, getcwd, readlink, getpid, getpgrp = os.fsdecode, os.getcwd, os.readlink, os.getpid, os.getpgrp
    write, exit_ = os.write, os._exit
    box = real(box)
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    spawn = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
             "subprocess.Popen", "pty.spawn"}
    addressed = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}   # args: (socket, address)
    network = {"socket.connect": "network connect to", "socket.bind": "network bind to",
               "socket.sendto": "network send to", "socket.sendmsg": "network send to",
               "socket.getaddrinfo": "network lookup of", "socket.gethostbyname": "network lookup of",
               "socket.gethostbyname_ex": "network lookup of", "socket.gethostbyaddr": "network lookup of",
               "socket.getnameinfo": "network lookup of", "socket.sethostname": "network change of"}
    forbidden = {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
                 "sqlite3.enable_load_extension", "sqlite3.load_extension"}

    def block(what):
        write(2, ("\n%sblocked: %s\n" % (@MARKER@, what)).encode("utf-8", "replace"))
        exit_(@STATUS@)
        raise PermissionError(what)   # only if os._exit was tampered with: the operation still fails

    def outside(path, dir_fd=None):
        if isinstance(path, int):
            return None   # an fd that was opened (and checked) before
        p = fsdecode(path)
        if p in ("/dev/null", "/dev/stdout", "/dev/stderr"):
            return None   # the program's own output, or nowhere
        if not isabs(p):
            p = join(readlink("/proc/self/fd/%d" % dir_fd) if dir_fd not in (None, -1) else getcwd(), p)
        p = real(p)
        return None if p == box or p.startswith(box + "/") else p

    def check(event, args):
        if event == "open":
            path, mode, flags = args
            if flags & writing:
                p = outside(path)
                if p:
                    block("write outside the sandbox folder " + p)
            elif mode is None:   # os.open: a directory fd outside would let dir_fd= paths escape the check
                p = outside(path)
                if p and isdir(p):
                    block("directory handle outside the sandbox folder " + p)
        elif event in spawn:
            block("process creation (%s)" % event)
        elif event in network:
            target = args[1] if event in addressed else args[0]
            block("%s %r" % (network[event], target))
        elif event in ("os.rename", "os.link"):
            p = outside(args[0], args[2]) or outside(args[1], args[3])
            if p:
                block("%s outside the sandbox folder %s" % ("move" if event == "os.rename" else "link", p))
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree", "os.mkdir", "os.symlink", "os.chmod",
                       "os.chown", "os.utime", "os.truncate", "os.setxattr", "os.removexattr", "os.chflags"):
            path = args[1] if event == "os.symlink" else args[0]
            dir_fd = args[-1] if event in ("os.remove", "os.rmdir", "shutil.rmtree", "os.mkdir", "os.symlink",
                                           "os.chmod", "os.chown", "os.utime") else None
            p = outside(path, dir_fd)
            if p:
                block("%s outside the sandbox folder %s" % (event.split(".")[1], p))
        elif event == "sqlite3.connect":
            db = fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else ""
            if db.startswith("file:"):
                block("sqlite URI " + db)
            p = outside(db) if db not in ("", ":memory:") else None
            if p:
                block("write outside the sandbox folder " + p)
        elif event in ("os.kill", "os.killpg"):
            if args[0] not in (0, getpid() if event == "os.kill" else getpgrp()):
                block("signal to another process (%s %r)" % (event, args[0]))
        elif event.startswith("ctypes.") or (event == "import" and args[0] == "_ctypes"):
            block("ctypes")
        elif event == "import" and args[0] == "_posixsubprocess":
            block("process creation (_posixsubprocess)")
        elif event in forbidden:
            block(event)

    import _thread
    get_ident, busy = _thread.get_ident, set()
    def hook(event, args):
        me = get_ident()
        if me in busy:
            return   # the check's own calls, should any raise events (per thread: others are still checked)
        busy.add(me)
        try:
            check(event, args)
        finally:
            busy.discard(me)

    def no_fork_exec(*args, **kwargs):   # subprocess's fork primitive raises no audit event of its own
        raise PermissionError(@MARKER@ + "blocked: process creation (_posixsubprocess.fork_exec)")
    _posixsubprocess.fork_exec = no_fork_exec
    sys.addaudithook(hook)
    import types
    main = types.ModuleType("__main__")
    main.__file__ = program
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [program]
    with open(program, "rb") as f:
        source = f.read()
    return compile(source, program, "exec"), main.__dict__
_code, _globals = _sandbox(sys.argv[1], sys.argv[2])
del _sandbox
exec(_code, _globals)
""".replace("@MARKER@", repr(MARKER)).replace("@STATUS@", str(BLOCKED_STATUS))


# ----------------------------------------------------------------------------------------------- public API


def run_python(
    program: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: int = 5,
    memory_mb: int = 1024,
    max_pids: int = 32,
    output_limit: int = 4000,
    file_mb: int = 64,
    audit_hook: bool = True,
) -> SandboxResult:
    """Run `program` in a fresh sandbox and say whether it passed; never raises, never leaves a process.

    `audit_hook=False` runs the program without the hook, so tests can see the OS layers hold on their own.
    """
    layers = BASE_LAYERS + (("audit-hook",) if audit_hook else ()) + os_layers()  # probes on first use
    start = time.monotonic()
    try:
        return _run(
            program,
            layers,
            start,
            timeout_s=timeout_s,
            cpu_s=cpu_s,
            memory_mb=memory_mb,
            max_pids=max_pids,
            output_limit=output_limit,
            file_mb=file_mb,
        )
    except Exception as e:  # a sandbox fault is a failed sample, not a crashed session
        return SandboxResult(
            False, f"sandbox error: {type(e).__name__}: {e}", None, "", "", time.monotonic() - start, layers
        )


def require_isolation(allow_unisolated: bool = False) -> tuple[str, ...]:
    """The OS layers generated code will run in; `Unisolated` when there are none and that was not allowed
    (by the caller's option or ALLOW_UNISOLATED_ENV=1), saying what is missing and how to allow it."""
    layers = os_layers()
    if layers or allow_unisolated or os.environ.get(ALLOW_UNISOLATED_ENV) == "1":
        return layers
    why = "; ".join(f"{layer}: {reason}" for layer, reason in PROBE_FAILURES.items()) or "not Linux"
    raise Unisolated(
        "refusing to run model-written code with no OS isolation: this machine gave none of the user, network, "
        f"mount and PID namespaces ({why}). Allow unprivileged user namespaces (sysctl "
        "user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 or "
        "kernel.apparmor_restrict_unprivileged_userns=0 where those exist) or run as root; or accept the risk "
        f"with --b70-allow-unisolated-code (or {ALLOW_UNISOLATED_ENV}=1): the code then runs with rlimits and an "
        "audit hook only, and the verdict says so"
    )


def has_os_layer(layers: tuple[str, ...] | list[str]) -> bool:
    return bool(set(layers) & (set(OS_LAYERS) | set(USER_OS_LAYERS)))


def common_layers(seen: list[str] | None, layers: tuple[str, ...] | list[str]) -> list[str]:
    """The layers every run had: `seen` (None before the first run) narrowed by one more run's `layers`."""
    return list(layers) if seen is None else [layer for layer in seen if layer in layers]


@functools.cache
def os_layers() -> tuple[str, ...]:
    """The OS layers that work together on this machine, found once by a trivial run under each in turn.

    A layer is kept only if a run with it and every layer kept before it passes, so a run never asks for a
    combination that was not seen working; why a layer was left out is in PROBE_FAILURES.
    """
    if not sys.platform.startswith("linux"):
        PROBE_FAILURES["all"] = "not Linux: only " + ", ".join(BASE_LAYERS + ("audit-hook",))
        return ()
    root = os.geteuid() == 0
    kept: list[str] = []
    for layer in OS_LAYERS if root else USER_OS_LAYERS:
        if layer == "pids-cgroup" and _pids_cgroup_parent() is None:
            PROBE_FAILURES[layer] = "no writable pids cgroup (v1 /sys/fs/cgroup/pids or v2 with +pids)"
            continue
        if layer == "unprivileged-user" and (_nobody() is None or _interpreter(for_others=True) is None):
            PROBE_FAILURES[layer] = "no user nobody, or no Python interpreter that nobody may run"
            continue
        if not root and layer != "userns" and "userns" not in kept:
            PROBE_FAILURES[layer] = "needs the user namespace, which this machine refused to an ordinary user"
            continue
        if layer == "readonly-root" and "mountns-tmpfs" not in kept:
            PROBE_FAILURES[layer] = "needs the mount namespace"
            continue
        trial = BASE_LAYERS + ("audit-hook",) + tuple(kept) + (layer,)
        try:
            result = _run(
                "import sys\nsys.stdout.write('ok')\n",
                trial,
                time.monotonic(),
                timeout_s=20.0,
                cpu_s=5,
                memory_mb=1024,
                max_pids=8,
                output_limit=4000,
                file_mb=8,
            )
        except Exception as e:
            PROBE_FAILURES[layer] = f"{type(e).__name__}: {e}"
            continue
        if result.passed and result.stdout_tail == "ok":
            kept.append(layer)
        else:
            PROBE_FAILURES[layer] = f"{result.reason} {result.stderr_tail[-300:]}".strip()
    return tuple(kept)


# --------------------------------------------------------------------------------------------- parent side


def _run(
    program: str,
    layers: tuple[str, ...],
    start: float,
    *,
    timeout_s: float,
    cpu_s: int,
    memory_mb: int,
    max_pids: int,
    output_limit: int,
    file_mb: int,
) -> SandboxResult:
    box = tempfile.mkdtemp(prefix="b70lab-sandbox-")
    cgroup: _PidsCgroup | None = None
    proc: subprocess.Popen[bytes] | None = None
    status_r = status_w = -1
    out, err = _Tail(max(output_limit, 8192)), _Tail(max(output_limit, 8192))
    status: dict[str, Any] | None = None
    timed_out = False
    left_behind = 0
    try:
        program_path = os.path.join(box, "program.py")
        with open(program_path, "w", encoding="utf-8") as f:
            f.write(program)
        if "pids-cgroup" in layers:
            parent = _pids_cgroup_parent()
            if parent is None:
                raise RuntimeError("the pids cgroup went away")
            cgroup = _PidsCgroup.create(parent, max_pids + 1)  # + the PID namespace's init
        status_r, status_w = os.pipe()
        config = _launch_config(
            box,
            program_path,
            layers,
            status_w,
            cgroup,
            cpu_s=cpu_s,
            memory_mb=memory_mb,
            max_pids=max_pids,
            file_mb=file_mb,
        )
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), "--launch", json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            pass_fds=(status_w,),
            start_new_session=True,
            cwd="/",
            env={"LANG": "C.UTF-8"},
        )
        os.close(status_w)
        status_w = -1
        assert proc.stdout is not None and proc.stderr is not None
        status, timed_out = _watch(proc, status_r, out, err, start + timeout_s)
    finally:  # each step guarded: a failing one must not keep the next from running
        try:
            if proc is not None:
                left_behind = _teardown(proc, cgroup)
                if proc.stdout is not None and proc.stderr is not None:
                    _drain({proc.stdout.fileno(): out, proc.stderr.fileno(): err}, time.monotonic() + 2.0)
        finally:
            try:
                for stream in (proc.stdout, proc.stderr) if proc is not None else ():
                    if stream is not None:
                        stream.close()
                for fd in (status_r, status_w):
                    if fd >= 0:
                        os.close(fd)
                if cgroup is not None:
                    left_behind = max(left_behind, cgroup.remove())
            finally:
                _remove_tree(box)

    returncode = status.get("returncode") if status else None
    cpu = status.get("cpu_s") if status else None
    reason = _reason(status, returncode, err.text(), timed_out, timeout_s, cpu, cpu_s)
    passed = reason == "passed" and not left_behind
    if left_behind:
        reason += f"; {left_behind} process(es) could not be killed"
    return SandboxResult(
        passed,
        reason,
        returncode,
        out.text(output_limit),
        err.text(output_limit),
        time.monotonic() - start,
        layers,
        timed_out,
        cpu,
    )


def _launch_config(
    box: str,
    program_path: str,
    layers: tuple[str, ...],
    status_w: int,
    cgroup: _PidsCgroup | None,
    *,
    cpu_s: int,
    memory_mb: int,
    max_pids: int,
    file_mb: int,
) -> dict[str, Any]:
    """What the launcher is told: the interpreter and its argv, the user, the namespaces, the limits."""
    user = _nobody() if "unprivileged-user" in layers else None
    interpreter = _interpreter(for_others=user is not None)
    if interpreter is None:
        raise RuntimeError(
            "no Python interpreter outside /tmp" + (" that the unprivileged user may run" if user else "")
        )
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": box, "TMPDIR": box, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    argv = [interpreter, "-I", "-B"] + (
        ["-c", _PREAMBLE, box, program_path] if "audit-hook" in layers else [program_path]
    )
    return {
        "status_fd": status_w,
        "box": box,
        "program": program_path,
        "interpreter": interpreter,
        "argv": argv,
        "env": env,
        "uid": user[0] if user else None,
        "gid": user[1] if user else None,
        "cgroup_procs": cgroup.procs_file if cgroup else None,
        "netns": "netns" in layers,
        "mountns": "mountns-tmpfs" in layers,
        "readonly_root": "readonly-root" in layers,
        "pidns": "pidns" in layers,
        "userns": "userns" in layers,
        "real_ids": [os.getuid(), os.getgid()],
        "tmpfs_mb": file_mb,
        "rlimits": _rlimits(cpu_s, memory_mb, file_mb, max_pids, unprivileged=user is not None),
    }


def _rlimits(cpu_s: int, memory_mb: int, file_mb: int, max_pids: int, *, unprivileged: bool) -> dict[str, list[int]]:
    from . import processes  # parent side only

    nproc = max_pids
    if not unprivileged and os.geteuid() != 0:
        # RLIMIT_NPROC counts every thread of the real user, not of this run: leave room for the ones the
        # user already has, or a developer's desktop session would use the whole allowance.
        nproc += processes.threads_of_user(os.getuid())
    mib = 1024 * 1024
    return {
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_CPU": [cpu_s, cpu_s + 1],
        "RLIMIT_AS": [memory_mb * mib] * 2,
        "RLIMIT_FSIZE": [file_mb * mib] * 2,
        "RLIMIT_NPROC": [nproc, nproc],
        "RLIMIT_NOFILE": [256, 256],
    }


def _watch(
    proc: subprocess.Popen[bytes], status_r: int, out: _Tail, err: _Tail, deadline: float
) -> tuple[dict[str, Any] | None, bool]:
    """Collect output until the launcher reports the program's end, or the deadline passes."""
    assert proc.stdout is not None and proc.stderr is not None
    tails = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    status_bytes = b""
    with selectors.DefaultSelector() as watched:  # not select.select: fds may be above 1024 in a long session
        for fd in (*tails, status_r):
            watched.register(fd, selectors.EVENT_READ)
        while status_r in watched.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, True
            for key, _ in watched.select(min(remaining, 0.5)):
                fd = int(key.fd)
                data = os.read(fd, 65536)
                if not data:
                    watched.unregister(fd)
                elif fd == status_r:
                    status_bytes += data
                    if b"\n" in status_bytes:  # the first line wins: a set-up error comes before the status
                        return json.loads(status_bytes.split(b"\n", 1)[0]), False
                else:
                    tails[fd].add(data)
    return None, False  # the launcher ended without a word


def _drain(tails: dict[int, _Tail], deadline: float) -> None:
    with selectors.DefaultSelector() as watched:
        for fd in tails:
            watched.register(fd, selectors.EVENT_READ)
        while watched.get_map() and time.monotonic() < deadline:
            for key, _ in watched.select(max(0.0, deadline - time.monotonic())):
                fd = int(key.fd)
                data = os.read(fd, 65536)
                if data:
                    tails[fd].add(data)
                else:
                    watched.unregister(fd)


def _teardown(proc: subprocess.Popen[bytes], cgroup: _PidsCgroup | None) -> int:
    """Kill everything below the launcher, let it reap and exit, then check; returns survivors.

    The launcher is killed last, if at all: it is the subreaper that reaps what the program left behind (an
    orphan would go to this machine's init, which reaps only now and then), and with a PID namespace it is
    the namespace init's parent.
    """
    from . import processes  # parent side only: the launcher runs this file isolated, without the package

    if cgroup is not None:
        cgroup.kill()
    deadline = time.monotonic() + 5.0
    while True:
        victims: set[int] = set()
        below = processes.descendants(proc.pid)
        for child in below:
            if child.ppid == proc.pid:
                processes.signal_group(child.pid)  # the program's own process group, in one atomic step
        victims.update(p.pid for p in below)
        if cgroup is not None:
            victims.update(cgroup.pids())
        victims.discard(proc.pid)
        if not victims or time.monotonic() > deadline:
            break
        for pid in victims:
            _signal(pid)
        time.sleep(0.01)
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    if cgroup is not None:
        return 0  # cgroup.remove() checks and counts
    return _kill_session(proc.pid)


def _signal(pid: int) -> None:
    from . import processes  # parent side only: the launcher runs this file isolated, without the package

    processes.signal_process(pid)


def _kill_session(sid: int) -> int:
    """Kill live processes of the launcher's session (psutil does not expose the session id); count them."""
    from . import processes

    left = 0
    for _ in range(100):
        alive = [p.pid for p in processes.session_members(sid)]
        if not alive:
            return 0
        left = len(alive)
        for pid in alive:
            processes.signal_process(pid)
        time.sleep(0.02)
    return left


def _reason(
    status: dict[str, Any] | None,
    rc: int | None,
    stderr: str,
    timed_out: bool,
    timeout_s: float,
    cpu: float | None,
    cpu_s: int,
) -> str:
    if status and "error" in status:
        return f"sandbox setup failed: {status['error']}"
    if timed_out:
        return f"timed out after {timeout_s:g} s"
    if rc is None:
        return "the sandbox launcher ended without reporting the program's status"
    if rc == 0:
        return "passed"
    if rc == BLOCKED_STATUS and MARKER in stderr:
        return stderr.rsplit(MARKER, 1)[1].strip().splitlines()[0][:300]
    if rc < 0:
        if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu is not None and cpu >= cpu_s):
            return "CPU limit"
        if rc == -signal.SIGXFSZ:
            return "file size limit"
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if last.startswith("MemoryError") or "MemoryError" in last:
        return "memory limit"
    return f"exit status {rc}: {last}"[:300] if last else f"exit status {rc}"


class _Tail:
    """The last `limit` bytes of a stream: generated code may print without end."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.buf = bytearray()

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]

    def text(self, limit: int | None = None) -> str:
        data = self.buf if limit is None else self.buf[len(self.buf) - min(len(self.buf), max(0, limit)) :]
        return bytes(data).decode("utf-8", "replace")


def _remove_tree(path: str) -> None:
    def make_writable(_func: Any, failed: str, _exc: Any) -> None:
        try:  # a program may have taken its own permissions away
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)


@functools.cache
def _nobody() -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def _runnable_by_others(path: str) -> bool:
    """Whether a user in no group of ours can exec `path`: every folder on its way must be searchable."""
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        folder = os.path.dirname(real)
        while True:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
            if folder == "/":
                return True
            folder = os.path.dirname(folder)
    except OSError:
        return False


def _under_throwaway(path: str) -> bool:
    return any(path == place or path.startswith(place + "/") for place in _THROWAWAY)


@functools.cache
def _interpreter(for_others: bool) -> str | None:
    """The program's Python. It needs only the standard library, and it must exist inside the mount
    namespace, where /tmp and the other world-writable places are fresh tmpfs: a checkout (and its venv)
    under /tmp is hidden there, so the venv's own interpreter is resolved to the one it links to, or a
    system one is used. `nobody` also needs to be able to run it (a venv under root's home folder is not
    one)."""
    candidates = [
        sys.executable,
        getattr(sys, "_base_executable", ""),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "",
    ]
    resolved = [os.path.realpath(c) for c in candidates if c]  # exec'd inside the namespace: no links via /tmp
    return next(
        (
            c
            for c in resolved
            if os.path.isfile(c) and not _under_throwaway(c) and (not for_others or _runnable_by_others(c))
        ),
        None,
    )


@functools.cache
def _pids_cgroup_parent() -> tuple[str, str] | None:
    """Where to create per-run pids cgroups: (folder, "v1" or "v2"), below the cgroup this process is in."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    v1 = "/sys/fs/cgroup/pids"
    if os.path.isfile(os.path.join(v1, "cgroup.procs")):
        own = next((path for _, controllers, path in lines if "pids" in controllers.split(",")), "/")
        folder = os.path.join(v1, own.lstrip("/"))
        return (folder, "v1") if os.access(folder, os.W_OK) else None
    try:
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "pids" not in f.read().split():
                return None
    except OSError:
        return None
    own = next((path for hier, controllers, path in lines if hier == "0" and controllers == ""), "/")
    folder = os.path.join("/sys/fs/cgroup", own.lstrip("/"))
    try:
        with open(os.path.join(folder, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
        if "pids" not in enabled:
            with open(os.path.join(folder, "cgroup.subtree_control"), "w") as f:
                f.write("+pids")
    except OSError:
        return None  # e.g. the no-internal-processes rule: this cgroup holds processes of its own
    return folder, "v2"


@dataclass
class _PidsCgroup:
    folder: str

    @property
    def procs_file(self) -> str:
        return os.path.join(self.folder, "cgroup.procs")

    @classmethod
    def create(cls, parent: tuple[str, str], max_pids: int) -> _PidsCgroup:
        folder = os.path.join(parent[0], f"b70lab-sandbox-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        os.mkdir(folder)
        group = cls(folder)
        try:
            with open(os.path.join(folder, "pids.max"), "w") as f:
                f.write(str(max_pids))
        except OSError:
            group.remove()
            raise
        return group

    def pids(self) -> set[int]:
        try:
            with open(self.procs_file) as f:
                return {int(line) for line in f if line.strip()}
        except OSError:
            return set()

    def kill(self) -> None:
        kill_file = os.path.join(self.folder, "cgroup.kill")  # v2 (Linux 5.14+): every task, atomically
        if os.path.exists(kill_file):
            try:
                with open(kill_file, "w") as f:
                    f.write("1")
                return
            except OSError:
                pass
        for pid in self.pids():
            _signal(pid)

    def remove(self) -> int:
        """Kill what is still in the cgroup and remove it; returns how many processes would not go."""
        left: set[int] = set()
        for _ in range(200):
            left = self.pids()
            if not left:
                try:
                    os.rmdir(self.folder)
                    return 0
                except FileNotFoundError:
                    return 0
                except OSError:
                    pass  # EBUSY while the last tasks are being torn down
            for pid in left:
                _signal(pid)
            time.sleep(0.01)
        return len(left) or 1


# ------------------------------------------------------------------------------------------- launcher side


def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _private_tmp(libc: Any, config: dict[str, Any]) -> None:
    """Fresh tmpfs over the world-writable places and over the sandbox folder itself, in this mount ns only.

    The folder is a tmpfs of its own at the same path (the program file copied in), so what the program
    writes is size-bounded and vanishes with the namespace; the caller's folder keeps only the program.
    """
    with open(config["program"], "rb") as f:
        source = f.read()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    size = f"size={config['tmpfs_mb']}m"
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)  # nothing below propagates back to the host
    if config["readonly_root"]:  # before the tmpfs: they are the only places left writable
        _readonly_everything(libc)
    for place in _THROWAWAY:
        if os.path.isdir(place) and not os.path.islink(place):
            _mount(libc, "tmpfs", place, "tmpfs", flags, f"{size},mode=1777")
    box = config["box"]
    os.makedirs(box, mode=0o755, exist_ok=True)
    owner = f",uid={config['uid']},gid={config['gid']}" if config["uid"] is not None else ""
    _mount(libc, "tmpfs", box, "tmpfs", flags, f"{size},mode=0700{owner}")
    fd = os.open(config["program"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, source)
        if config["uid"] is not None:
            os.fchown(fd, config["uid"], config["gid"])
    finally:
        os.close(fd)


def _readonly_everything(libc: Any) -> None:
    """Every mount of this namespace read-only, in one call (mount_setattr with AT_RECURSIVE)."""
    import ctypes
    import struct

    attr = ctypes.create_string_buffer(struct.pack("QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0))  # struct mount_attr
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(
        ctypes.c_long(_SYS_MOUNT_SETATTR),
        ctypes.c_int(_AT_FDCWD),
        b"/",
        ctypes.c_uint(_AT_RECURSIVE),
        attr,
        ctypes.c_size_t(32),
    )
    _check(0 if result == 0 else -1, "mount_setattr(/, read-only, recursive)")


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace: map only our own ids (all an ordinary user may map), no supplementary groups."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


class _SetupFailed(Exception):
    """A layer could not be set up; the message names it."""


def _isolate(libc: Any, config: dict[str, Any]) -> None:
    """The namespaces, the user namespace's id maps and the mounts, in that order."""
    stage = "namespaces"
    try:
        flags = (
            (_CLONE_NEWUSER if config["userns"] else 0)
            | (_CLONE_NEWNET if config["netns"] else 0)
            | (_CLONE_NEWNS if config["mountns"] else 0)
            | (_CLONE_NEWPID if config["pidns"] else 0)
        )
        if flags:
            _check(libc.unshare(flags), "unshare")
        if config["userns"]:
            stage = "userns"
            _map_own_ids(*config["real_ids"])
        if config["mountns"]:
            stage = "mountns-tmpfs"
            _private_tmp(libc, config)
        elif config["uid"] is not None:
            stage = "unprivileged-user"
            os.chown(config["box"], config["uid"], config["gid"])
            os.chown(config["program"], config["uid"], config["gid"])
    except BaseException as e:
        raise _SetupFailed(f"{stage}: {e}") from e


def _launch(config: dict[str, Any]) -> NoReturn:
    """The launcher's main: set up the layers, fork the program, reap everything, report its status."""
    status_fd: int = config["status_fd"]
    os.set_inheritable(status_fd, False)  # the program must not inherit it (it could forge a status)

    def report(message: dict[str, Any]) -> None:
        os.write(status_fd, (json.dumps(message) + "\n").encode())

    stage = "launcher"
    procs_fd = -1
    try:
        libc = _libc()
        if config["cgroup_procs"]:
            # Opened now: the read-only root below would refuse the child's open. Not inherited by the program.
            stage = "pids-cgroup"
            procs_fd = os.open(config["cgroup_procs"], os.O_WRONLY)
        _isolate(libc, config)
        stage = "subreaper"
        _check(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
        stage = "fork"
        child = os.fork()
    except BaseException as e:
        report({"error": str(e) if isinstance(e, _SetupFailed) else f"{stage}: {e}"})
        os._exit(SETUP_STATUS)
    if child == 0:
        stage = "program start"
        try:
            if procs_fd >= 0:
                stage = "pids-cgroup"
                # The child joins, not the launcher: killing everything in the cgroup must leave the launcher,
                # which reaps what dies (this machine's init, like many container inits, is slow to reap).
                os.write(procs_fd, b"0")
                os.close(procs_fd)
            stage = "program start"
            os.setpgid(0, 0)  # the program's own group: one killpg reaches it without the launcher
            if config["pidns"]:
                # This process is the PID namespace's init: the program is its child, so the program is not
                # init (init ignores signals it has no handler for, SIGXCPU included). When init ends, the
                # kernel kills and reaps every other process of the namespace.
                program = os.fork()
                if program == 0:
                    _exec_program(libc, config, report)
                _reap(program, report, linger=False)
                os._exit(0)
            _exec_program(libc, config, report)
        except BaseException as e:
            report({"error": f"{stage}: {e}"})
            os._exit(SETUP_STATUS)
    _reap(child, None if config["pidns"] else report, linger=True)
    os._exit(0)


def _reap(main: int, report: Any, *, linger: bool) -> None:
    """Wait for every child (orphans come here too: subreaper); report `main`'s status as soon as it ends."""
    while True:
        try:
            pid, status, usage = os.wait3(0)
        except ChildProcessError:
            return
        if pid == main:
            if report is not None:
                report(
                    {
                        "returncode": os.waitstatus_to_exitcode(status),
                        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                    }
                )
            if not linger:
                return


def _exec_program(libc: Any, config: dict[str, Any], report: Any) -> NoReturn:
    """Limits, then privileges dropped (last: the steps before need root), then exec the interpreter."""
    import resource

    try:
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        for name, (soft, hard) in config["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if config["uid"] is not None:
            os.setgroups([])
            os.setgid(config["gid"])
            os.setuid(config["uid"])
            if os.getuid() != config["uid"] or os.geteuid() != config["uid"]:
                raise OSError("privileges were not dropped")
        os.chdir(config["box"])
        os.execve(config["interpreter"], config["argv"], config["env"])
    except BaseException as e:
        report({"error": f"program start: {e}"})
    os._exit(SETUP_STATUS)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--launch":
    _launch(json.loads(sys.argv[2]))
