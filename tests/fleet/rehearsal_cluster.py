"""A real Ray cluster on loopback (a head and two box nodes), a fleet sweep rehearsed on it from a committed bundle,
one box killed mid-shard, the sweep resumed, then a batch of two gate sessions (one laid from the bundle, one a real
`pytest -m gates` on the box whose contract names a model that is not there): run by test_fleet_rehearsal.py inside a network namespace that
holds only loopback, so no Ray socket can be on any other address. Writes what it saw as JSON to argv[2].

Usage: python rehearsal_cluster.py WORKDIR REPORT.json"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu-int4"
PAUSE_S = 1.0  # a file of the bundle laid every second: a shard of the base and one variant takes about 8 s


def start_cluster(work: Path):  # type: ignore[no-untyped-def]
    """A head and two box nodes, each box with its own cache root."""
    from ray_netns import start_cluster as start

    return start(work, {label: work / f"{label}-cache" for label in ("box-a", "box-b")})


def kill_first_box(cluster, boxes, out: Path, killed: dict) -> None:  # type: ignore[no-untyped-def]
    """Kill the box of shard-01's first attempt three seconds into it, as the ledger names it."""
    from pytest_b70lab.fleet.ledger import Ledger, LedgerError

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            started = [e for e in Ledger(out).events if e.shard == "shard-01" and e.event == "started"]
        except LedgerError:
            started = []
        if started:
            time.sleep(3.0)
            label = started[0].box.split()[1]
            cluster.remove_node(boxes[label], allow_graceful=False)
            killed.update(label=label, at=time.time())
            return
        time.sleep(0.2)


def watch_sockets(sockets: list, killed: dict) -> None:
    """Every inet socket of every Ray process, once a second, until the kill is two seconds past."""
    while not killed or time.time() - killed["at"] < 2:
        for p in psutil.process_iter():
            try:
                if "ray" in " ".join(p.cmdline()):
                    sockets.extend([c.laddr.ip, c.raddr.ip if c.raddr else None] for c in p.net_connections("inet"))
            except psutil.Error:
                pass
        time.sleep(1.0)


def main(work: Path, report_path: Path) -> int:
    import ray

    from pytest_b70lab.contract.variants import Variant
    from pytest_b70lab.evidence import run_folder
    from pytest_b70lab.fleet import sweep as fleet_sweep
    from pytest_b70lab.fleet.ledger import Ledger
    from pytest_b70lab.fleet.shards import split
    from pytest_b70lab.fleet.work import RehearsalWork
    from pytest_b70lab.judge import replay

    contract = replay.recorded_contract(run_folder.read_starts(BUNDLE), BUNDLE)
    grid = [Variant(name, contract, {}) for name in ("base", "again-1", "again-2")]
    cluster, boxes = start_cluster(work)
    out, shard_list, cache = work / "sweep", split([v.name for v in grid], 1), work / "driver-cache"

    def work_of(s):  # type: ignore[no-untyped-def]
        return RehearsalWork(str(BUNDLE), s.variants, PAUSE_S)

    killed: dict = {}
    sockets: list = []
    killer = threading.Thread(target=kill_first_box, args=(cluster, boxes, out, killed))
    killer.start()
    threading.Thread(target=watch_sockets, args=(sockets, killed), daemon=True).start()
    said: list[str] = []
    outcome = fleet_sweep.run(grid, out, cluster.address, work_of, shard_list, {}, said.append, cache_root=cache)
    killer.join()
    rows = fleet_sweep.judge_and_tabulate(outcome, grid, None, cache, said.append)
    report = {
        "killed": killed.get("label"),
        "problems": outcome.problems,
        "ledger": [e.__dict__ for e in Ledger(out).events],
        "rows": [
            {k: r.as_dict()[k] for k in ("shard", "variant", "verdict", "verdict_line", "is_base", "folder")}
            for r in rows
        ],
        "said": said,
        "sockets": sorted({ip for pair in sockets for ip in pair if ip}),
    }
    # The sweep as if interrupted after shard-02: a copy without shard-01's folder, resumed.
    again = work / "resumed"
    shutil.copytree(out, again)
    shutil.rmtree(again / "shards" / "shard-01")
    resumed = fleet_sweep.run(
        grid, again, cluster.address, work_of, shard_list, {}, said.append, resume=True, cache_root=cache
    )
    report["resumed"] = {
        "problems": resumed.problems,
        "ledger": [e.__dict__ for e in Ledger(again).events],
        "shards": sorted(resumed.results),
    }
    report["batch"] = gates_batch(cluster.address, work, contract, said)
    report["tokenless_client"] = _tokenless_client(cluster.address, work)
    ray.shutdown()
    cluster.shutdown()
    report_path.write_text(json.dumps(report, indent=1, default=str))
    return 0


def gates_batch(address: str, work: Path, bundle_contract, said: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """Two gate sessions on the surviving box: the bundle laid as a session's run folder, and a real gates session
    (pytest on the box, in the lab's folder) of a contract whose target is not there, so it stops at once."""
    import tomllib

    from pytest_b70lab.contract import schema
    from pytest_b70lab.fleet import batch
    from pytest_b70lab.fleet.ledger import Ledger
    from pytest_b70lab.fleet.work import GateRehearsalWork

    raw = tomllib.loads((REPO / "fixtures" / "contracts" / "mini-laguna-cpu-int4.toml").read_text())
    raw["name"] = "mini-laguna-cpu-int4-no-model"
    raw["target"] = {"source": "path", "path": "data/no-such-model/target"}
    no_model = schema.Contract.model_validate(raw)
    contracts = [bundle_contract, no_model]
    sessions = batch.plan(contracts)
    out = work / "batch"
    batch.prepare(out, contracts, sessions, {"fleet": address, "lab_dir": str(REPO)})

    def work_of(s):  # type: ignore[no-untyped-def]
        if s.contract == bundle_contract.name:
            return GateRehearsalWork(str(BUNDLE), 0.2)
        return batch.session_work(s, no_model, REPO, ["--b70-no-probe"])

    _, problems = batch.run(out, address, sessions, work_of, said.append)
    rows = batch.judge(out, sessions, REPO / "tests" / "gates" / "__snapshots__", said.append)
    written = batch.write(out, address, rows, problems)
    return {
        "problems": problems,
        "rows": [r.as_dict() for r in rows],
        "ledger": [e.__dict__ for e in Ledger(out).events],
        "written": json.loads(written.read_text()),
        "junit": (out / batch.JUNIT).read_text(),
        "logs": {s.name: (out / batch.SESSIONS_DIR / s.name / "pytest.log").is_file() for s in sessions},
    }


def _tokenless_client(address: str, work: Path) -> dict:
    """A driver that has no token (none in its environment, none under its home) joining the cluster."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    env.update(HOME=str(work / "no-token-home"), RAY_AUTH_MODE="token")
    code = f"import ray; ray.init(address={address!r}); print('joined')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return {"returncode": done.returncode, "output": (done.stdout + done.stderr)[-2000:]}


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
