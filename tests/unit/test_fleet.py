"""The fleet's pure parts (fleet/shards.py, ledger.py, box.py) and what keeps Ray away from an engine
(engine/environment.py without_ray, in_engine/no_ray.py). The fleet on a real Ray cluster: tests/fleet/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from pytest_b70lab.engine import environment
from pytest_b70lab.fleet import box
from pytest_b70lab.fleet.ledger import Ledger, LedgerError
from pytest_b70lab.fleet.shards import ShardError, from_plan, split


def test_every_shard_repeats_the_base_and_each_variant_is_in_one() -> None:
    shards = split(["base", "a", "b", "c"], 2)
    assert [(s.name, s.variants) for s in shards] == [("shard-01", ("base", "a", "b")), ("shard-02", ("base", "c"))]
    assert [s.variants for s in split(["base"], 1)] == [("base",)]
    record = {"shards": [s.as_plan() for s in shards]}
    assert from_plan(record, ["base", "a", "b", "c"]) == shards
    with pytest.raises(ShardError, match="at least one variant"):
        split(["base", "a"], 0)
    with pytest.raises(ShardError, match="do not split the plan's variants"):
        from_plan({"shards": [{"name": "shard-01", "variants": ["a", "base"]}]}, ["base", "a"])
    with pytest.raises(ShardError, match="names no shards"):
        from_plan({}, ["base"])


def test_the_ledger_only_grows(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.add("shard-01", 1, "started", box="box box-a [0123]", node="n1")
    ledger.add("shard-01", 1, "lost", box="box box-a [0123]", error="NodeDiedError: gone")
    ledger.add("shard-01", 2, "finished", box="box box-b [4567]")
    again = Ledger(tmp_path)
    assert again.events == ledger.events and again.attempts("shard-01") == 2 and again.attempts("shard-02") == 0
    assert again.finished("shard-01").box == "box box-b [4567]" and [e.event for e in again.lost("shard-01")] == [
        "lost"
    ]
    document = json.loads(ledger.path.read_text())
    document["events"][1]["error"] = "rewritten"  # someone edits the past
    ledger.path.write_text(json.dumps(document))
    with pytest.raises(LedgerError, match="changed under this driver"):
        ledger.add("shard-02", 1, "started")
    ledger.path.write_text("{not json")
    with pytest.raises(LedgerError, match="fleet.json cannot be read back"):
        Ledger(tmp_path)


def test_a_shards_folder_comes_home_checked_file_by_file(tmp_path: Path) -> None:
    folder = tmp_path / "box"
    (folder / "variants" / "base" / "start-1").mkdir(parents=True)
    (folder / "variants" / "base" / "start-1" / "evidence.json").write_text('{"a": 1}')
    (folder / "plan.json").write_text("{}")
    payload, digests = box.pack(folder)
    box.unpack(payload, digests, tmp_path / "home")
    assert (tmp_path / "home" / "variants" / "base" / "start-1" / "evidence.json").read_text() == '{"a": 1}'
    digests["plan.json"] = "0" * 64
    with pytest.raises(box.BoxError, match="plan.json: different after the transfer"):
        box.unpack(payload, digests, tmp_path / "again")


def test_a_box_measures_one_shard_at_a_time(tmp_path: Path) -> None:
    lock = tmp_path / "box.lock"
    folder, value = box.run(tmp_path, "sweep-x", "shard-01", 1, lambda f: (f / "x").write_text("1"), lock_path=lock)
    assert folder == box.shard_folder(tmp_path, "sweep-x", "shard-01", 1) and (folder / "x").read_text() == "1"
    said: list[str] = []
    with FileLock(str(lock)):  # a survivor of an earlier attempt holds the box: the re-run waits, then gives up
        with pytest.raises(box.BoxError, match="another shard held this box"):
            box.run(tmp_path, "sweep-x", "shard-01", 2, lambda f: None, lock_path=lock, wait_s=0.3, say=said.append)
    assert said and "waiting for it" in said[0]


def test_a_box_removes_its_copies_of_shards_a_week_old(tmp_path: Path) -> None:
    """Each shard's run removes the box's copies that nothing was written into for a week (the driver has its
    own), with their emptied shard and sweep folders; a copy written into since stays, however old its folder."""
    old = box.shard_folder(tmp_path, "sweep-old", "shard-01", 1)
    recent = box.shard_folder(tmp_path, "sweep-new", "shard-01", 1)
    touched = box.shard_folder(tmp_path, "sweep-new", "shard-02", 2)
    for folder in (old, recent, touched):
        (folder / "start-1").mkdir(parents=True)
        (folder / "start-1" / "evidence.json").write_text("{}")
    week_ago = time.time() - box.KEEP_SHARD_FOLDERS_S - 60
    for p in (*old.rglob("*"), old, *touched.rglob("*"), touched):
        os.utime(p, (week_ago, week_ago))
    os.utime(touched / "start-1" / "evidence.json")  # written into just now
    said: list[str] = []
    folder, _ = box.run(
        tmp_path, "sweep-x", "shard-01", 1, lambda f: None, lock_path=tmp_path / "lock", say=said.append
    )
    assert not old.exists() and not (tmp_path / box.FLEET_DIR / "sweep-old").exists()
    assert recent.exists() and touched.exists() and folder.exists()
    assert said == ["shard-01: removed the box's copy of sweep-old/shard-01/attempt-1 (older than 7 days)"]


def test_normalise_leaves_a_process_that_already_runs_as_the_box_does() -> None:
    facts = box.normalise(os.getpid())
    assert facts["niceness"][0] == facts["niceness"][1] and facts["oom_score_adj"][0] == facts["oom_score_adj"][1]


def test_an_engine_started_from_a_ray_worker_gets_none_of_rays_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    ray_worker = {
        "RAY_RAYLET_PID": "12",
        "RAY_AUTH_TOKEN": "secret",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    assert environment.without_ray({**ray_worker, "PATH": "/bin"}) == {"PATH": "/bin"}
    outside = {"OMP_NUM_THREADS": "4", "PATH": "/bin"}  # a lab's own setting, outside Ray, is left alone
    assert environment.without_ray(outside) == outside
    for key, value in ray_worker.items():
        monkeypatch.setenv(key, value)
    env = environment.engine_environment(Path("/nonexistent"), 2, materialize=False)
    assert (
        not {k for k in env if k.startswith("RAY_")}
        and "OMP_NUM_THREADS" not in env
        and "CUDA_VISIBLE_DEVICES" not in env
    )


def test_the_device_masks_are_the_installed_rays() -> None:
    accelerators = pytest.importorskip("ray._private.accelerators")
    masks = {m.get_visible_accelerator_ids_env_var() for m in accelerators.get_all_accelerator_managers()} - {None}
    assert masks <= set(environment.RAY_DEVICE_MASKS), sorted(masks - set(environment.RAY_DEVICE_MASKS))


def test_no_engine_process_loads_ray() -> None:
    """vLLM imports Ray where it is installed; the engine's entry refuses it, and vLLM then runs as without Ray."""
    pytest.importorskip("ray")
    code = (
        "import sys, pytest_b70lab.in_engine.entry\n"
        "from vllm.v1.executor import ray_utils\n"
        "print('ray' in sys.modules, ray_utils.ray_is_available())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-2:] == ["False", "False"], done.stdout + done.stderr[-2000:]


def test_a_fleet_nobody_answers_at_is_said_at_once_and_leaves_no_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import socket

    from pytest_b70lab.cli import main

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "sweep"
    argv = ["sweep", "--contract", "mini-laguna-cpu-int4", "--vary", "engine.block_size=32,64"]
    assert main([*argv, "--fleet", f"127.0.0.1:{port}", "--out", str(out)]) == 2
    assert f"nothing answers at 127.0.0.1:{port}" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--fleet", "head-without-port", "--out", str(out)]) == 2
    assert "give the head's address as HOST:PORT" in capsys.readouterr().err


def test_a_batch_plan_reads_back_and_holds_its_contracts_to_their_digests(tmp_path: Path) -> None:
    from pytest_b70lab.contract import schema
    from pytest_b70lab.fleet import batch

    contracts = [schema.load("mini-laguna-cpu-int4"), schema.load("mini-laguna-cpu")]
    sessions = batch.plan(contracts)
    assert [(s.name, s.contract) for s in sessions] == [
        ("session-01", "mini-laguna-cpu-int4"),
        ("session-02", "mini-laguna-cpu"),
    ]
    out = tmp_path / "batch"
    batch.prepare(out, contracts, sessions, {"fleet": "head:6379", "lab_dir": str(tmp_path)})
    record, again, read = batch.read_plan(out)
    assert again == sessions and [c.digest for c in read] == [c.digest for c in contracts]
    assert record["fleet"] == "head:6379"
    with pytest.raises(batch.BatchError, match="is not empty"):
        batch.prepare(out, contracts, sessions, {})
    toml = out / batch.CONTRACTS_DIR / "session-02.toml"
    toml.write_text(
        toml.read_text()
        .replace("[engine]\n", "[engine]\nmax_model_len = 1024\n", 1)
        .replace("max_model_len = 2048\n", "")
    )
    with pytest.raises(batch.BatchError, match="changed since the batch began"):
        batch.read_plan(out)
    (out / batch.BATCH_JSON).write_text("{}")
    with pytest.raises(batch.BatchError, match="not a gates batch's folder"):
        batch.read_plan(out)


def test_a_batch_judges_each_session_from_its_evidence_and_names_what_did_not_come_back(tmp_path: Path) -> None:
    import shutil

    from pytest_b70lab.evidence import run_folder
    from pytest_b70lab.fleet import batch
    from pytest_b70lab.judge import replay
    from pytest_b70lab.judge.folder import headline_line, judge_folder

    bundle = Path(__file__).parents[2] / "fixtures" / "evidence" / "mini-laguna-cpu-int4"
    snapshots = Path(__file__).parents[1] / "gates" / "__snapshots__"
    recorded = replay.recorded_contract(run_folder.read_starts(bundle), bundle)
    sessions = [
        batch.Session("session-01", recorded.name, recorded.digest),
        batch.Session("session-02", recorded.name, recorded.digest),
        batch.Session("session-03", recorded.name, "0" * 64),
        batch.Session("session-04", recorded.name, recorded.digest),
    ]
    ledger = Ledger(tmp_path)
    for s in ("session-01", "session-03", "session-04"):
        ledger.add(s, 1, "started", box="box box-a [0123]", host_class="amd-x")
        ledger.add(s, 1, "finished", box="box box-a [0123]", host_class="amd-x")
        if s != "session-04":
            shutil.copytree(bundle, tmp_path / batch.SESSIONS_DIR / s / "run")
    # a session whose pytest stopped before it made a run folder (a usage error): its exit code came back
    (tmp_path / batch.SESSIONS_DIR / "session-04").mkdir()
    (tmp_path / batch.SESSIONS_DIR / "session-04" / "session.json").write_text('{"returncode": 4, "command": []}')
    ledger.add("session-02", 1, "lost", box="box box-b [4567]", error="NodeDiedError: the box went away")
    rows = batch.judge(tmp_path, sessions, snapshots, lambda _: None)
    expected = headline_line(judge_folder(bundle, snapshots), bundle)
    assert rows[0].verdict == ("pass" if expected.startswith("PROMOTABLE") else "fail")
    assert rows[0].verdict_line.split(" - ")[-1] == expected.split(" - ")[-1] and rows[0].box == "box box-a [0123]"
    assert rows[1].verdict == "none" and "did not come back" in rows[1].verdict_line
    assert rows[1].lost == ["attempt 1 on box box-b [4567]: NodeDiedError: the box went away"]
    assert rows[2].verdict == "fail" and "not this session's contract" in rows[2].verdict_line
    assert rows[3].verdict == "none" and "left no run folder (pytest exited 4" in rows[3].verdict_line
    written = batch.write(tmp_path, "head:6379", rows, [])
    junit = (tmp_path / batch.JUNIT).read_text()
    assert json.loads(written.read_text())["sessions"][1]["verdict"] == "none"
    assert 'errors="2"' in junit and "session-02/" in junit


def test_a_child_dying_with_its_parent_ends_when_the_parent_is_killed(tmp_path: Path) -> None:
    import signal
    import time

    import psutil

    code = (
        "import subprocess, sys, time\n"
        "from pytest_b70lab.isolation import processes\n"
        "c = subprocess.Popen(processes.dying_with_parent(['sleep', '120'], sys.executable), start_new_session=True)\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 20
        while child.is_running() and child.name() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.05)  # the wrapper sets its death signal, then becomes the command
        assert child.name() == "sleep" and os.getpgid(child.pid) == child.pid
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    gone, _ = psutil.wait_procs([child], timeout=10)
    assert gone, f"the child {child.pid} outlived its killed parent"


def test_a_gates_batch_is_asked_for_with_its_fleet_or_resumed_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from pytest_b70lab.cli import main

    assert main(["gates", "--contract", "mini-laguna-cpu-int4", "--out", str(tmp_path / "b")]) == 2
    assert "needs --fleet ADDRESS" in capsys.readouterr().err
    assert main(["gates", "--resume", str(tmp_path), "--contract", "mini-laguna-cpu-int4"]) == 2
    assert "leave out --contract" in capsys.readouterr().err
    assert main(["gates", "--resume", str(tmp_path)]) == 2
    assert "not a gates batch's folder" in capsys.readouterr().err
    argv = ["gates", "--contract", "mini-laguna-cpu-int4", "--out", str(tmp_path / "b"), "--fleet", "127.0.0.1:1"]
    assert main(argv) == 2 and "nothing answers at 127.0.0.1:1" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
