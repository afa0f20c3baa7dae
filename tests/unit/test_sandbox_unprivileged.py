"""The sandbox as the lab's engineers run it: as an ordinary user, not root. Real processes, no mocks.

CI runs as root, so the test drops privileges: a driver runs as `nobody` (or as this user, when the tests
are not root) with a copy of the two stdlib-only modules the sandbox needs, readable by that user, and a
Python that user may run. Each attack must end as a failed sample with its reason, with and without the
audit hook (without it, only the OS layers stand), and nothing may be left: no process, no file, no
connection.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import pytest_b70lab
from pytest_b70lab.isolation import sandbox

ROOT = os.geteuid() == 0
PACKAGE = Path(pytest_b70lab.__file__).parent
NAMESPACES = {"userns", "netns", "mountns-tmpfs", "readonly-root", "pidns"}

# Runs as the ordinary user: each attack with and without the hook; prints one JSON document.
DRIVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from pytest_b70lab.isolation import sandbox
port, outside = int(sys.argv[2]), sys.argv[3]
show = "import os\nprint(os.getcwd(), flush=True)\n"
attacks = {
    "connect": show + f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')\n",
    "write": show + f"open({outside!r}, 'w').write('pwned')\n",
    "fork-bomb": show + "while True:\n    os.fork()\n",
    "memory": show + "hoard = []\nwhile True:\n    hoard.append(bytearray(10 ** 7))\n",
    "background": show + "import time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nos._exit(3)\n",
}
results = {}
for hook in (True, False):
    for name, program in attacks.items():
        r = sandbox.run_python(program, audit_hook=hook, memory_mb=256, max_pids=16, timeout_s=20)
        results[f"{name}{'' if hook else '/no-hook'}"] = {
            "passed": r.passed, "reason": r.reason, "layers": list(r.layers),
            "folder": r.stdout_tail.splitlines()[0] if r.stdout_tail else "", "stdout": r.stdout_tail,
        }
print(json.dumps({"uid": __import__("os").getuid(), "layers": list(sandbox.os_layers()),
                  "probe": sandbox.PROBE_FAILURES, "results": results}))
"""


def the_user() -> tuple[int, int]:
    if not ROOT:
        return os.getuid(), os.getgid()
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.3)
    yield server
    server.close()


@pytest.fixture(scope="module")
def outside() -> Iterator[Path]:
    """A folder the ordinary user owns and may write, outside every throwaway place (so that only the
    read-only root keeps the program out of it, not file permissions)."""
    uid, gid = the_user()
    parent = "/var/lib" if ROOT else str(Path.home())
    folder = Path(tempfile.mkdtemp(prefix="b70lab-sandbox-test-", dir=parent))
    os.chown(folder, uid, gid)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def as_ordinary_user(listener: socket.socket, outside: Path) -> Iterator[dict[str, Any]]:
    python = sandbox._interpreter(for_others=ROOT)
    if python is None:
        pytest.skip("no Python interpreter that the unprivileged user may run")
    copy = Path(tempfile.mkdtemp(prefix="b70lab-sandbox-copy-"))
    try:
        (copy / "pytest_b70lab" / "isolation").mkdir(parents=True)
        for name in ("pytest_b70lab/__init__.py", "pytest_b70lab/isolation/__init__.py"):
            (copy / name).write_text("")
        shutil.copy(PACKAGE / "isolation" / "processes.py", copy / "pytest_b70lab" / "isolation")
        shutil.copy(PACKAGE / "isolation" / "sandbox.py", copy / "pytest_b70lab" / "isolation")
        for path in [copy, *copy.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        uid, gid = the_user()
        target = str(outside / f"pwned-{uuid.uuid4().hex}")
        done = subprocess.run(
            [python, "-I", "-c", DRIVER, str(copy), str(listener.getsockname()[1]), target],
            capture_output=True,
            text=True,
            timeout=300,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            **({"user": uid, "group": gid, "extra_groups": []} if ROOT else {}),
        )
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["target"] = target
        yield report
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def survivors(folder: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if any(folder in arg for arg in p.info.get("cmdline") or []) and p.info.get("status") != psutil.STATUS_ZOMBIE
    ]


def test_an_ordinary_user_gets_the_namespaces(as_ordinary_user: dict[str, Any]) -> None:
    report = as_ordinary_user
    assert report["uid"] == the_user()[0] and report["uid"] != 0
    if "userns" not in report["layers"]:
        pytest.skip(f"this machine refuses an ordinary user a user namespace: {report['probe']}")
    missing = NAMESPACES - set(report["layers"])
    assert not missing, f"layers missing as an ordinary user: {missing}; the probe said {report['probe']}"
    for name, result in report["results"].items():
        assert NAMESPACES <= set(result["layers"]), (name, result)


@pytest.mark.parametrize(
    "attack, hooked, unhooked",
    [
        ("connect", "blocked: network connect to ('127.0.0.1'", "Network is unreachable"),
        ("write", "blocked: write outside the sandbox folder", "Read-only file system"),
        ("fork-bomb", "blocked: process creation", "exit status"),
        ("memory", "memory limit", "memory limit"),
        ("background", "blocked: process creation", "exit status 3"),
    ],
)
def test_each_attack_is_a_failed_sample_with_nothing_left(
    as_ordinary_user: dict[str, Any], listener: socket.socket, attack: str, hooked: str, unhooked: str
) -> None:
    report = as_ordinary_user
    if "userns" not in report["layers"]:
        pytest.skip(f"this machine refuses an ordinary user a user namespace: {report['probe']}")
    for key, expected in ((attack, hooked), (f"{attack}/no-hook", unhooked)):
        result = report["results"][key]
        assert not result["passed"], (key, result)
        assert expected in result["reason"], (key, result)
        assert result["folder"].startswith("/tmp/b70lab-sandbox-"), (key, result)
        assert survivors(result["folder"]) == [], f"{key} left processes behind"
        assert not os.path.exists(result["folder"])
        assert "connected" not in result["stdout"]
    assert not os.path.exists(report["target"])
    with pytest.raises(TimeoutError):
        listener.accept()


def test_no_os_layer_refuses_generated_code_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe found no OS layer (a kernel that refuses user namespaces to an ordinary user), the
    refusal names each layer's reason and both ways to allow it; an allowance is honoured."""
    monkeypatch.setattr(sandbox, "os_layers", lambda: ())
    monkeypatch.setattr(sandbox, "PROBE_FAILURES", {"userns": "unshare: Operation not permitted"})
    monkeypatch.delenv(sandbox.ALLOW_UNISOLATED_ENV, raising=False)
    with pytest.raises(sandbox.Unisolated) as refused:
        sandbox.require_isolation()
    message = str(refused.value)
    assert "userns: unshare: Operation not permitted" in message
    assert "--b70-allow-unisolated-code" in message and sandbox.ALLOW_UNISOLATED_ENV in message
    assert sandbox.require_isolation(allow_unisolated=True) == ()
    monkeypatch.setenv(sandbox.ALLOW_UNISOLATED_ENV, "1")
    assert sandbox.require_isolation() == ()
