"""The fleet on a real Ray cluster, without an engine (in `make test`, about a minute): a head and two box nodes
on loopback with token authentication, a sweep rehearsed from the committed INT4 bundle (fleet/work.py
RehearsalWork), one box killed mid-shard, the sweep resumed. The cluster runs in rehearsal_cluster.py, inside a
network namespace of its own that holds only loopback (Ray 2.60 otherwise connects through the machine's
interface address even when every node is given 127.0.0.1)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray_netns

from pytest_b70lab.judge.folder import headline_line, judge_folder

HERE = Path(__file__).parent
REPO = HERE.parents[1]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu-int4"

pytest.importorskip("ray", reason="the fleet extra (Ray) is not installed: make setup installs it from the lock")


@pytest.fixture(scope="module")
def rehearsal() -> Iterator[dict]:
    if ray_netns.namespace() is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a loopback-only network namespace")
    with ray_netns.work_folder("b70ray-") as work:
        report = work / "report.json"
        code = ray_netns.run_script(HERE / "rehearsal_cluster.py", work, [str(report)], timeout_s=300)
        assert code == 0, f"the rehearsal cluster failed (rc {code}); its output ends:\n{ray_netns.log_tail(work)}"
        result = json.loads(report.read_text())
        result["left"] = [p.pid for p in ray_netns.left_behind(str(work))]
        yield result


def test_lost_box_is_a_ledger_line_and_the_shard_runs_again_whole(rehearsal: dict) -> None:
    events = [
        (e["shard"], e["attempt"], e["event"], e["box"].split()[1] if e["box"] else None) for e in rehearsal["ledger"]
    ]
    killed = rehearsal["killed"]
    survivor = {"box-a": "box-b", "box-b": "box-a"}[killed]
    assert ("shard-01", 1, "started", killed) in events and ("shard-01", 1, "lost", killed) in events, events
    assert ("shard-01", 2, "finished", survivor) in events, events
    assert [e for e in events if e[0] == "shard-02" and e[2] == "finished"], events
    finished = [e for e in rehearsal["ledger"] if e["event"] == "finished"]
    for e in finished:  # the box nodes run their workers as the box runs its own processes (docs/fleet.md)
        assert e["worker"]["niceness"][0] == e["worker"]["niceness"][1], e
        assert e["worker"]["oom_score_adj"] == [0, 0], e
    lost = next(e for e in rehearsal["ledger"] if e["event"] == "lost")
    assert "NodeDiedError" in lost["error"] or "WorkerCrashed" in lost["error"], lost
    assert rehearsal["problems"] == []


def test_the_drivers_verdicts_are_the_bundles(rehearsal: dict) -> None:
    expected = headline_line(judge_folder(BUNDLE, REPO / "tests" / "gates" / "__snapshots__"), BUNDLE)
    rows = rehearsal["rows"]
    assert [(r["shard"], r["variant"]) for r in rows] == [
        ("shard-01", "base"),
        ("shard-01", "again-1"),
        ("shard-02", "base"),
        ("shard-02", "again-2"),
    ]
    for row in rows:
        assert row["verdict"] == ("pass" if expected.startswith("PROMOTABLE") else "fail"), row
        assert row["verdict_line"].split(" - ")[-1] == expected.split(" - ")[-1], (row, expected)
    assert [r["is_base"] for r in rows] == [True, False, True, False]


def test_every_ray_socket_is_on_loopback_and_a_client_without_the_token_is_refused(rehearsal: dict) -> None:
    assert rehearsal["sockets"], "no Ray socket was seen: the watcher saw nothing to check"
    assert all(_loopback(ip) for ip in rehearsal["sockets"]), rehearsal["sockets"]
    client = rehearsal["tokenless_client"]
    assert client["returncode"] != 0 and "joined" not in client["output"], client
    assert "token" in client["output"].lower() or "authentication" in client["output"].lower(), client


def _loopback(text: str) -> bool:
    address = ipaddress.ip_address(text)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, an IPv4 peer of a dual-stack socket
    return (mapped or address).is_loopback


def test_resume_keeps_the_finished_shard(rehearsal: dict) -> None:
    resumed = rehearsal["resumed"]
    first = len(rehearsal["ledger"])
    new = resumed["ledger"][first:]
    assert resumed["problems"] == [] and resumed["shards"] == ["shard-01", "shard-02"], resumed
    assert {e["shard"] for e in new} == {"shard-01"}, new
    assert [e["event"] for e in new] == ["started", "finished"] and new[0]["attempt"] == 3, new
    # the re-run asked for the class of the shard's first box, read back from the interrupted sweep's ledger
    assert new[0]["host_class"] == rehearsal["ledger"][0]["host_class"], new
    assert any("shard-01 attempt 3 submitted" in line and " on class " in line for line in rehearsal["said"]), rehearsal


def test_a_gates_batch_runs_each_session_on_a_box_and_judges_it_here(rehearsal: dict) -> None:
    expected = headline_line(judge_folder(BUNDLE, REPO / "tests" / "gates" / "__snapshots__"), BUNDLE)
    batch = rehearsal["batch"]
    laid, real = batch["rows"]
    assert batch["problems"] == [], batch
    assert (laid["session"], laid["contract"]) == ("session-01", "mini-laguna-cpu-int4"), laid
    assert laid["verdict"] == ("pass" if expected.startswith("PROMOTABLE") else "fail"), (laid, expected)
    assert laid["verdict_line"].split(" - ")[-1] == expected.split(" - ")[-1], (laid, expected)
    # The real session ran pytest on the box, in the lab's folder, and stopped at its missing target: the row
    # says why, as the session's own verdict would.
    assert real["verdict"] == "fail" and "could not begin" in real["verdict_line"], real
    assert "data/no-such-model/target" in real["verdict_line"], real
    assert batch["logs"] == {"session-01": False, "session-02": True}, batch["logs"]
    for row in (laid, real):
        assert row["box"] and row["box"].startswith("box ") and row["host_class"], row
        assert row["attempts"] == 1 and row["lost"] == [], row
    assert sorted(e["event"] for e in batch["ledger"]) == ["finished", "finished", "started", "started"], batch
    failures = 1 + (laid["verdict"] == "fail")
    assert f'failures="{failures}"' in batch["junit"] and 'errors="0"' in batch["junit"], batch["junit"]


def test_nothing_of_ray_is_left(rehearsal: dict) -> None:
    assert rehearsal["left"] == [], f"processes of the rehearsal's Ray cluster still run: {rehearsal['left']}"
