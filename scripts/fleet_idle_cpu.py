"""How much CPU a Ray box node uses while idle (the raylet and its agents), started as docs/fleet.md starts a box,
against the interleaved schedule's host rule (0.05 CPU-s of outside load in a 0.5 s window). Run inside a network
namespace with only loopback, as tests/fleet/ does:

    mkdir -p /tmp/b70idle/ray && RAY_TMPDIR=/tmp/b70idle HOME=/tmp/b70idle/home RAY_AUTH_MODE=token \\
        RAY_AUTH_TOKEN=$(openssl rand -hex 16) unshare -n sh -c 'ip link set lo up && exec .venv/bin/python \\
        scripts/fleet_idle_cpu.py /tmp/b70idle'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil

WINDOW_S, WINDOWS = 0.5, 60


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main(work: Path) -> int:
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024, "include_dashboard": False}
    quiet = {"RAY_worker_niceness": "0", "RAY_worker_oom_score_adjustment": "0", "RAY_memory_monitor_refresh_ms": "0"}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "num_cpus": 0, "node_ip_address": "127.0.0.1", "temp_dir": str(work / "ray")},
    )
    head = {p.pid for p in psutil.Process().children(recursive=True)}
    cluster.add_node(**node, node_ip_address="127.0.0.1", resources={"b70_box": 1}, env_vars=quiet)
    time.sleep(20)  # past the node's own start-up
    box = [p for p in psutil.Process().children(recursive=True) if p.pid not in head]
    windows = []
    t0, c0 = time.monotonic(), cpu_seconds(box)
    for _ in range(WINDOWS):
        before = cpu_seconds(box)
        time.sleep(WINDOW_S)
        windows.append(cpu_seconds(box) - before)
    rate = (cpu_seconds(box) - c0) / (time.monotonic() - t0)
    names = sorted({p.name() for p in box if p.is_running()})
    print(
        json.dumps({"processes": names, "cpu_s_per_s": round(rate, 4), "largest_window_cpu_s": round(max(windows), 4)})
    )
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
