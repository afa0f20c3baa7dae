"""The sandbox against the attacks generated code can make: real processes, no mocks.

Each attack must end as a failed sample with the right kind of reason, well within a bound, with nothing
left behind: no process (found by the sandbox folder in its command line), no cgroup, no folder, no file
outside, no connection. Tests named `..._without_the_hook` run as root only and show that the OS layers
hold on their own, should the audit hook be bypassed.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_b70lab.isolation import sandbox
from pytest_b70lab.isolation.sandbox import SandboxResult, run_python

BOUND_S = 30.0
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the OS layers (namespaces, cgroup, user nobody) need root")

# The program's first line of output: its folder, whose path is in every sandboxed process's command line.
SHOW_FOLDER = "import os\nprint(os.getcwd(), flush=True)\n"


def survivors(folder: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info.get("cmdline") or []
        if any(folder in arg for arg in cmdline) and p.info.get("status") != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


def our_cgroups() -> list[str]:
    parent = sandbox._pids_cgroup_parent()
    if parent is None:
        return []
    prefix = f"b70lab-sandbox-{os.getpid()}-"
    return [name for name in os.listdir(parent[0]) if name.startswith(prefix)]


def assert_stopped(result: SandboxResult, started: float, *reason_starts: str) -> None:
    """Failed, for the expected reason, in time, and nothing of the run is left."""
    assert not result.passed, result
    assert result.reason.startswith(reason_starts), result
    assert time.monotonic() - started < BOUND_S and result.seconds < BOUND_S
    folder = result.stdout_tail.splitlines()[0] if result.stdout_tail else ""
    if folder:
        assert "b70lab-sandbox-" in folder
        assert survivors(folder) == []
        assert not os.path.exists(folder)
    assert our_cgroups() == []


def test_a_passing_program_passes() -> None:
    program = (
        "from dataclasses import dataclass\nimport tempfile\n"
        "@dataclass\nclass P:\n    x: int\n"
        "def add(a, b):\n    return P(a).x + b\n"
        "def check(candidate):\n    assert candidate(1, 2) == 3\n"
        "    open('scratch.txt', 'w').write('ok')\n    assert open('scratch.txt').read() == 'ok'\n"
        "    with tempfile.NamedTemporaryFile() as f:\n        f.write(b'x')\n"
        "check(add)\nprint('done')\n"
    )
    result = run_python(program)
    assert result.passed and result.reason == "passed" and result.returncode == 0, result
    assert result.stdout_tail == "done\n"
    assert {"tempdir", "rlimits", "audit-hook"} <= set(result.layers)


def test_a_failing_assertion_fails_and_says_so() -> None:
    result = run_python("def check(candidate):\n    assert candidate(1) == 2\ncheck(lambda x: x)\n")
    assert not result.passed and result.returncode == 1
    assert result.reason.startswith("exit status 1: AssertionError"), result.reason


def test_a_syntax_error_is_a_failed_sample() -> None:
    result = run_python("def f(:\n")
    assert not result.passed and "SyntaxError" in result.reason


def test_the_os_layers_are_active_as_root() -> None:
    if not ROOT:
        pytest.skip("not root: only the tempdir, rlimits and audit-hook layers can be used")
    result = run_python("pass")
    assert result.passed, result
    missing = set(sandbox.OS_LAYERS) - set(result.layers)
    assert not missing, f"OS layers not used: {missing}; probe said {sandbox.PROBE_FAILURES}"


def test_an_infinite_loop_hits_the_cpu_limit() -> None:
    started = time.monotonic()
    result = run_python(SHOW_FOLDER + "while True:\n    pass\n", cpu_s=1, timeout_s=20)
    assert_stopped(result, started, "CPU limit")


def test_a_sleeper_hits_the_wall_clock_timeout() -> None:
    started = time.monotonic()
    result = run_python(SHOW_FOLDER + "import time\ntime.sleep(60)\n", timeout_s=1)
    assert_stopped(result, started, "timed out after 1 s")
    assert result.timed_out and result.returncode is None


def test_a_fork_bomb_is_blocked() -> None:
    started = time.monotonic()
    result = run_python(SHOW_FOLDER + "while True:\n    os.fork()\n")
    assert_stopped(result, started, "blocked: process creation")


@needs_root
def test_a_fork_bomb_is_bounded_and_killed_without_the_hook() -> None:
    started = time.monotonic()
    result = run_python(SHOW_FOLDER + "while True:\n    os.fork()\n", max_pids=16, audit_hook=False)
    assert_stopped(result, started, "exit status", "killed by", "CPU limit")
    assert "audit-hook" not in result.layers


@needs_root
def test_children_that_escape_into_their_own_session_are_killed() -> None:
    started = time.monotonic()
    program = SHOW_FOLDER + "import time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    result = run_python(program, audit_hook=False)
    assert result.passed, result  # the program itself ended well; what it left behind is gone
    assert time.monotonic() - started < BOUND_S
    folder = result.stdout_tail.splitlines()[0]
    assert survivors(folder) == [] and our_cgroups() == []


def write_program(*targets: str) -> str:
    return SHOW_FOLDER + "".join(f"open({t!r}, 'w').write('pwned')\n" for t in targets)


def test_writes_outside_the_folder_are_blocked(tmp_path: Path) -> None:
    for target in (str(tmp_path / "outside.txt"), f"/tmp/b70lab-sandbox-test-{uuid.uuid4().hex}"):
        started = time.monotonic()
        result = run_python(write_program(target))
        assert_stopped(result, started, f"blocked: write outside the sandbox folder {target}")
        assert not os.path.exists(target)


def test_escaping_by_symlink_or_rename_is_blocked(tmp_path: Path) -> None:
    target = tmp_path / "via-link.txt"
    link = SHOW_FOLDER + f"os.symlink({str(tmp_path)!r}, 'out')\nopen('out/via-link.txt', 'w').write('x')\n"
    result = run_python(link)
    assert not result.passed and result.reason.startswith("blocked: write outside the sandbox folder"), result
    moved = SHOW_FOLDER + f"open('x', 'w').write('x')\nos.rename('x', {str(target)!r})\n"
    result = run_python(moved)
    assert not result.passed and result.reason.startswith("blocked: move outside the sandbox folder"), result
    assert not target.exists()


@needs_root
def test_writes_outside_the_folder_fail_without_the_hook(tmp_path: Path) -> None:
    outside = str(tmp_path / "outside.txt")
    in_tmp = f"/tmp/b70lab-sandbox-test-{uuid.uuid4().hex}"
    result = run_python(write_program(outside), audit_hook=False)  # a root-only folder, hidden by the tmpfs
    assert not result.passed and ("Permission" in result.reason or "FileNotFound" in result.reason), result
    result = run_python(write_program(in_tmp), audit_hook=False)  # lands on the throwaway /tmp
    assert not os.path.exists(outside) and not os.path.exists(in_tmp)
    assert survivors(result.stdout_tail.splitlines()[0]) == []


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.3)
    yield server
    server.close()


def connect_program(port: int) -> str:
    return SHOW_FOLDER + (f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')\n")


def assert_no_connection(server: socket.socket) -> None:
    with pytest.raises(TimeoutError):
        server.accept()


def test_a_network_connect_is_blocked(listener: socket.socket) -> None:
    started = time.monotonic()
    result = run_python(connect_program(listener.getsockname()[1]))
    assert_stopped(result, started, "blocked: network connect to ('127.0.0.1'")
    assert "connected" not in result.stdout_tail
    assert_no_connection(listener)


@needs_root
def test_a_network_connect_fails_without_the_hook(listener: socket.socket) -> None:
    result = run_python(connect_program(listener.getsockname()[1]), audit_hook=False)
    assert not result.passed and "Network is unreachable" in result.reason, result
    assert_no_connection(listener)


def test_a_memory_bomb_hits_the_memory_limit() -> None:
    started = time.monotonic()
    result = run_python(SHOW_FOLDER + "hoard = []\nwhile True:\n    hoard.append(bytearray(10 ** 7))\n", memory_mb=256)
    assert_stopped(result, started, "memory limit")


def test_output_is_kept_to_a_tail() -> None:
    result = run_python(
        "import sys\nsys.stdout.write('x' * 10 ** 6 + 'END')\nsys.stderr.write('e' * 10 ** 6)\n", output_limit=100
    )
    assert result.passed, result.reason
    assert len(result.stdout_tail) == 100 and result.stdout_tail.endswith("END")
    assert len(result.stderr_tail) == 100
