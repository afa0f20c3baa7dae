"""What the fleet tests share: a script run inside a network namespace of its own that holds only loopback (Ray 2.60
connects through the machine's interface address even when every node is given 127.0.0.1), with Ray's files and
token under a short work folder, ended whole whatever ends the test; and the cluster such a script starts."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def namespace() -> list[str] | None:
    """unshare of a network namespace (as root; a user namespace too where not root, as the sandbox does); None
    where the tools are missing."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    return ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]


def mentions(p: psutil.Process, text: str) -> bool:
    """Whether `p`'s command line or environment names `text` (a cluster's work folder: every Ray process has it
    in RAY_TMPDIR or HOME, every engine a box starts in its cache paths)."""
    try:
        return text in " ".join(p.cmdline()) or text in " ".join(f"{k}={v}" for k, v in p.environ().items())
    except psutil.Error:
        return False


def left_behind(text: str) -> list[psutil.Process]:
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and mentions(p, text)]


@contextmanager
def work_folder(prefix: str) -> Iterator[Path]:
    """A short folder under /tmp (Ray's socket paths must fit 107 bytes), removed with anything still naming it."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    (work / "ray").mkdir()
    try:
        yield work
    finally:
        for p in left_behind(str(work)):
            try:
                p.kill()
            except psutil.Error:
                pass
        shutil.rmtree(work, ignore_errors=True)


def run_script(script: Path, work: Path, args: list[str], timeout_s: float, env: dict[str, str] | None = None) -> int:
    """`script` run by this Python inside a loopback-only namespace, its output in WORK/cluster.log; its exit
    code. The namespace's processes are one process group, ended with SIGTERM (then SIGKILL) when the time is up
    or the test itself is stopped (Ctrl-C, pytest-timeout): none outlives the test."""
    prefix = namespace()
    assert prefix is not None
    # Every file of Ray's under the work folder: its temp dir (RAY_TMPDIR/ray; Ray 2.60's Cluster writes the address
    # file there whatever temp_dir a node is given) and its home (~/.ray, where a token would be written).
    full = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "HOME": str(work / "home"),
        "RAY_TMPDIR": str(work),
        **(env or {}),
    }
    full.pop("RAY_ADDRESS", None)
    line = f"ip link set lo up && exec {sys.executable} {script} {work} {' '.join(args)}"
    with open(work / "cluster.log", "w") as log:
        child = subprocess.Popen(
            [*prefix, "sh", "-c", line],
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
        try:
            return child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -1
        finally:
            _end_group(child)


def _end_group(child: subprocess.Popen) -> None:  # type: ignore[type-arg]
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        if child.poll() is not None:
            try:
                os.killpg(child.pid, 0)
            except ProcessLookupError:
                return  # the leader is gone and nothing of its group is left
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass


def log_tail(work: Path, chars: int = 4000) -> str:
    try:
        return (work / "cluster.log").read_text(errors="replace")[-chars:]
    except OSError:
        return "(no cluster.log)"


def start_cluster(work: Path, cache_roots: dict[str, Path]):  # type: ignore[no-untyped-def]
    """A head (no box resource) and a box node per entry of `cache_roots` (its label -> its B70LAB_CACHE_DIR), every
    node on 127.0.0.1 and started with what `b70lab fleet labels` asks of a box (worker niceness and OOM score 0,
    no memory monitor, a small object store). Called inside the namespace, by the cluster scripts."""
    from ray.cluster_utils import Cluster

    from pytest_b70lab.cli.fleet import BOX_NODE_ENVIRONMENT
    from pytest_b70lab.fleet import box

    node = {
        "num_cpus": 1,
        "object_store_memory": 80 * 1024 * 1024,
        "include_dashboard": False,
        "node_ip_address": "127.0.0.1",
    }
    cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 0, "temp_dir": str(work / "ray")})
    boxes = {}
    for label, cache in cache_roots.items():
        env = {**BOX_NODE_ENVIRONMENT, "B70LAB_CACHE_DIR": str(cache)}
        labels = {box.BOX_LABEL: label, box.CLASS_LABEL: box.class_key()}
        boxes[label] = cluster.add_node(**node, resources={box.RESOURCE: 1}, labels=labels, env_vars=env)
    return cluster, boxes
