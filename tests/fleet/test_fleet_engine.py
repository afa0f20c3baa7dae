"""The fleet with engines (`pytest -m fleet`, outside `make test`: about 10 minutes): a two-variant sweep over a real
Ray cluster of two box nodes sharing this machine's cores, one shard at a time (engine_cluster.py, inside a
loopback-only network namespace). The box of the shard being measured is killed while its engines run, the driver
is interrupted while that shard runs again on the other box, and the sweep is resumed. Checked: the ledger names
every attempt and its box, no engine outlives its box or its driver, rows carry box and host class, each variant is
paired with its own shard's base, and the engines ran as they run without Ray."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray_netns

from pytest_b70lab.evidence import host, run_folder
from pytest_b70lab.sweep import table

pytest.importorskip("ray", reason="the fleet extra (Ray) is not installed: make setup installs it from the lock")
pytestmark = pytest.mark.fleet

HERE = Path(__file__).parent
TIMEOUT_S = 2400


@pytest.fixture(scope="module")
def fleet_sweep(request: pytest.FixtureRequest, b70_cache_root: Path) -> Iterator[tuple[dict, Path]]:
    if (request.config.getoption("-m") or "").strip() != "fleet":
        pytest.skip("not in make test's budget (about 10 minutes of engines): run `pytest -m fleet`")
    if ray_netns.namespace() is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a loopback-only network namespace")
    with ray_netns.work_folder("b70eng-") as work:
        report_path = work / "report.json"
        args = [str(report_path), str(b70_cache_root)]
        try:  # the boxes' folders go also when the cluster script fails
            code = ray_netns.run_script(HERE / "engine_cluster.py", work, args, timeout_s=TIMEOUT_S)
            report = json.loads(report_path.read_text()) if report_path.is_file() else {}
            assert code == 0, (
                f"the engine cluster failed (rc {code}); its error:\n{report.get('error', '(none recorded)')}\n"
                f"its output ends:\n{ray_netns.log_tail(work)}"
            )
            report["left"] = [p.pid for p in ray_netns.left_behind(str(work))]
            yield report, work / "sweep"
        finally:
            _remove_box_folders(work / "sweep", b70_cache_root)


def _remove_box_folders(out: Path, cache_root: Path) -> None:
    import shutil

    from pytest_b70lab.fleet import box
    from pytest_b70lab.fleet import sweep as fleet_sweep

    if (out / "plan.json").is_file():
        shutil.rmtree(cache_root / box.FLEET_DIR / fleet_sweep.sweep_id(out), ignore_errors=True)


def _events(ledger: list[dict]) -> list[tuple[str, int, str, str | None]]:
    return [(e["shard"], e["attempt"], e["event"], e["box"].split()[1] if e["box"] else None) for e in ledger]


def test_the_lost_box_and_the_interrupted_driver_are_in_the_ledger(fleet_sweep: tuple[dict, Path]) -> None:
    report, _ = fleet_sweep
    killed, interrupted = report["killed"], report["interrupted"]
    survivor = {"box-a": "box-b", "box-b": "box-a"}[killed["box"]]
    shard = killed["shard"]
    events = _events(report["ledger"])
    assert (shard, killed["attempt"], "lost", killed["box"]) in events, events
    assert (interrupted["shard"], interrupted["box"]) == (shard, survivor), (interrupted, killed)
    assert interrupted["returncode"] == 130, interrupted
    # The interrupted attempt has no end in the ledger; the resumed sweep ran the shard again, whole, on the
    # surviving box, and kept the other shard.
    last = max(a for s, a, _, _ in events if s == shard)
    assert last == interrupted["attempt"] + 1 and (shard, last, "finished", survivor) in events, events
    other = {s for s, *_ in events} - {shard}
    assert all([e for e in events if e[0] == o and e[2] == "finished"] for o in other), events
    assert report["resumed"]["returncode"] == 0, report["resumed"]
    lost = next(e for e in report["ledger"] if e["event"] == "lost")
    assert "NodeDiedError" in lost["error"] or "WorkerCrashed" in lost["error"], lost


def test_no_engine_outlives_its_box_or_its_driver(fleet_sweep: tuple[dict, Path]) -> None:
    report, _ = fleet_sweep
    assert report["killed"]["engines"] and report["interrupted"]["engines"], report  # there were engines to end
    assert report["killed"]["left_after_60_s"] == [], report["killed"]
    assert report["interrupted"]["left_after_120_s"] == [], report["interrupted"]
    assert report["engines_left"] == [] and report["left"] == [], report


def test_rows_name_box_and_class_and_pair_each_variant_with_its_own_shards_base(
    fleet_sweep: tuple[dict, Path],
) -> None:
    _, out = fleet_sweep
    document = json.loads((out / "sweep.json").read_text())
    rows = document["variants"]
    assert sorted((r["shard"], r["is_base"]) for r in rows) == [
        ("shard-01", False),
        ("shard-01", True),
        ("shard-02", False),
        ("shard-02", True),
    ], rows
    for row in rows:
        # One round of two prompts: incomplete (or failed where the shallower draft accepts fewer tokens than the
        # contract asks), and gate 7 passed on its one start, the sampling rule's record included: a session of
        # several contracts stops each by its own rule.
        assert "(incomplete)" in row["verdict_line"] and "reproduction" not in row["verdict_line"], row
        boxes = {s["box"] for s in row["starts"]}
        assert len(boxes) == 1 and None not in boxes and row["host_class"], row
    for shard in ("shard-01", "shard-02"):
        base, variant = sorted((r for r in rows if r["shard"] == shard), key=lambda r: not r["is_base"])
        assert {s["box"] for s in base["starts"]} == {s["box"] for s in variant["starts"]}, (base, variant)
        folder = out / variant["folder"]
        own = table.interleaved_to_base(
            run_folder.read(folder.parent / base["variant"], verdict=False), run_folder.read(folder, verdict=False)
        )
        assert own is not None and variant["paired_to_base"]["ratio"] == pytest.approx(own.ratio), variant


def test_the_engines_ran_as_without_ray(fleet_sweep: tuple[dict, Path]) -> None:
    _, out = fleet_sweep
    # As an engine this test started itself would run: at this process's niceness and OOM score, without Ray.
    expected = {(os.getpriority(os.PRIO_PROCESS, 0), int(Path("/proc/self/oom_score_adj").read_text()), False)}
    starts = [s for v in sorted((out / "shards").glob("*/sweep/variants/*")) for s in run_folder.read_starts(v)]
    assert len(starts) == 4, [str(p) for p in (out / "shards").glob("*/sweep/variants/*")]
    for start in starts:
        environment = start.engine.environment
        assert not [k for k in environment if k.startswith("RAY_") or k == "OMP_NUM_THREADS"], environment
        assert _processes(start.audits) == expected, (start.audits, expected)
        assert (host.box_of(start.host) or {}).get("label") in ("box-a", "box-b"), start.host


def _processes(audits: list[dict]) -> set[tuple[int, int, bool]]:
    """Each rank's niceness, OOM score and whether Ray was loaded in it, as its audit recorded them."""
    return {(a["process"]["niceness"], a["process"]["oom_score_adj"], a["process"]["ray_loaded"]) for a in audits}
