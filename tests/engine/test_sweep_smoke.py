"""`b70lab sweep` end to end on the embedded default, as short as a sweep can be: the base and one variant that
differs only in speculation (DFlash depth 3 instead of 11), one round, the two shortest prompts, served side by
side as the contract's interleaved schedule asks (both starts alive, every prompt to each in a rotating order,
the contract's passes), interrupted by Ctrl-C while the session starts and continued with `--resume` (the
session is run again whole). One fresh start of the two the contract asks for, so every verdict must say
incomplete; the files, the order, the schedule, the replays' verdicts and the page opened in headless Chromium
are checked against the evidence the starts wrote, as for an uninterrupted sweep."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from browser import Tree, browse, chromium, points, traces  # tests/browser.py

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.sweep import plan

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
BASE = "mini-laguna-cpu"
DEPTH = 3
SHORTEST = ["code-publish-ladder", "prose-3"]  # 57 and 64 characters: the set's two shortest prompts


def _sweep_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest_b70lab.cli", "sweep", *args]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, b70_cache_root: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The smoke sweep as a lab meets it: Ctrl-C while its session's first start is starting, then `b70lab sweep
    --resume`; every test below checks the resumed sweep as it would an uninterrupted one."""
    out = tmp_path_factory.mktemp("sweep") / "s"
    env = {**os.environ, "B70LAB_CACHE_DIR": str(b70_cache_root)}
    first = subprocess.Popen(
        _sweep_command(
            "--contract",
            BASE,
            "--out",
            str(out),
            "--vary",
            f"speculative.num_speculative_tokens={DEPTH}",
            "--rounds",
            "1",
            "--prompts",
            ",".join(SHORTEST),
            "--no-probe",  # the probe is the gates lane's to test
        ),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A CI job started in the background of a shell without job control inherits SIGINT ignored, and Python
        # keeps an ignored SIGINT ignored: the Ctrl-C below would be lost and the sweep run to its end.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 900
        launches = out / "launches.log"
        started = plan.variant_dir(out, BASE) / "start-1" / "server.log"
        while not (launches.is_file() and len(launches.read_text().splitlines()) >= 2 and started.is_file()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-4000:]
            time.sleep(0.2)
        first.send_signal(signal.SIGINT)
        _, interrupted = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, interrupted[-4000:]
    assert f"continue with: b70lab sweep --resume {out}" in interrupted
    done = subprocess.run(
        _sweep_command("--resume", str(out)), cwd=REPO, env=env, capture_output=True, text=True, timeout=1200
    )
    return out, done


def test_the_smoke_sweep_runs_every_start_and_writes_its_files(sweep) -> None:
    out, done = sweep
    assert done.returncode == 0, done.stderr[-6000:]
    variant = f"{BASE}-num-speculative-tokens-{DEPTH}"
    data = json.loads((out / plan.SWEEP_JSON).read_text())
    assert data["order"] == [f"{BASE} start-1", f"{variant} start-1"] and data["problems"] == []
    assert (out / plan.SWEEP_HTML).is_file() and (out / plan.JUNIT).is_file()
    launched = (out / "launches.log").read_text().splitlines()
    assert len(launched) == 4, "the session's two starts, launched again whole after Ctrl-C"
    assert f"discarding {plan.variant_dir(out, BASE) / 'start-1'}" in done.stderr, done.stderr[-3000:]
    assert f"the interleaved session of 2 starts: {BASE} start-1, {variant} start-1" in done.stderr
    for name in (BASE, variant):
        folder = plan.variant_dir(out, name)
        assert [p.name for p in sorted(folder.glob("start-*"))] == ["start-1"]
        assert (folder / "promotion.json").is_file() and (folder / plan.JUDGE_LOG).is_file()
        recorded = evidence.read(folder / "start-1")
        assert recorded.contract.digest == contract.load(plan.contract_file(out, name)).digest
        assert [r.prompt_id for r in recorded.requests] == SHORTEST
        assert recorded.teardown["clean"] is True, "the start's processes are gone"
        schedule = recorded.schedule
        passes = contract.load(BASE).reproduction.passes
        assert schedule is not None and schedule.passes == passes and schedule.host_rule
        assert len(recorded.counted()) == passes * len(SHORTEST)
        other = f"{variant if name == BASE else BASE} start-1"
        assert all(m.others == [other] and m.other_start is None for m in schedule.measurements)
    assert contract.load(plan.contract_file(out, variant)).speculative.verify_width == DEPTH + 1


def test_every_verdict_says_incomplete_one_fresh_start_of_two(sweep) -> None:
    out, done = sweep
    rows = json.loads((out / plan.SWEEP_JSON).read_text())["variants"]
    assert [r["verdict"] for r in rows] == ["incomplete", "incomplete"]
    for r in rows:
        assert "NOT PROMOTABLE (incomplete)" in r["verdict_line"] and "1 fresh start of 2" in r["verdict_line"]
        assert r["judged_against"] == f"the base's teacher ({BASE}-teacher)" and not r["promotable"]
        assert f"{r['variant']}: {r['verdict_line']}" in done.stdout
    cases = ET.parse(out / plan.JUNIT).getroot().find("testsuite").findall("testcase")
    assert [c.get("name") for c in cases] == [r["variant"] for r in rows]
    assert all(c.find("skipped") is not None and c.find("failure") is None for c in cases)
    base, variant = rows
    assert variant["outputs_identical_to_base"] == "2/2", "speculation changes speed, never tokens"
    assert variant["paired_to_base"]["prompts"] == 2 and base["kv_blocks"] == variant["kv_blocks"] > 0
    assert [len(r["acceptance_per_position"]) for r in rows] == [11, DEPTH]
    passes = contract.load(BASE).reproduction.passes
    assert [r["measured"] for r in rows] == [f"interleaved, {passes} passes"] * 2


def _rate(r: evidence.Request) -> float:
    times = [t for t, n in zip(r.chunk_times, r.chunk_tokens, strict=True) for _ in range(n)]
    return (len(times) - 1) / (times[-1] - times[0])


def test_the_variant_is_compared_with_the_base_pass_by_pass(sweep) -> None:
    """Each prompt's median over passes of the variant / base ratio within the pass, then the geometric mean:
    recomputed here from the two starts' arrival times."""
    out, _ = sweep
    variant = f"{BASE}-num-speculative-tokens-{DEPTH}"
    base_start, variant_start = (evidence.read(plan.variant_dir(out, n) / "start-1") for n in (BASE, variant))
    a, b = base_start.counted(), variant_start.counted()
    logs = [
        statistics.median(math.log(_rate(b[(k, p)][1]) / _rate(a[(k, p)][1])) for k, q in a if q == p) for p in SHORTEST
    ]
    rows = json.loads((out / plan.SWEEP_JSON).read_text())["variants"]
    assert rows[1]["paired_to_base"]["ratio"] == pytest.approx(math.exp(statistics.fmean(logs)), rel=1e-9)


def test_the_sweep_page_draws_every_variant_in_a_browser(sweep, tmp_path: Path) -> None:
    out, _ = sweep
    chromium()
    rows = json.loads((out / plan.SWEEP_JSON).read_text())["variants"]
    page = Tree(browse(out / plan.SWEEP_HTML, tmp_path, "--dump-dom")).root
    (bars,) = traces(page, "speed")
    assert len(bars.find("g", cls="point")) == len(rows), "one bar per variant"
    (curve,) = traces(page, "speed-vs-speculative.num_speculative_tokens")
    assert points(curve) == len(rows)
    assert [points(t) for t in traces(page, "acceptance")] == [len(r["acceptance_per_position"]) for r in rows]
