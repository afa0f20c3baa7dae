"""The sweep's plan, table, files and page on recorded evidence: the committed candidate bundle is the base
variant and the committed teacher bundle its target-only variant, each judged by a real replay of the gates
(runner.judge, a pytest subprocess) exactly as a sweep judges what it ran. Expected figures are read from the
evidence here (arrival times, /metrics text by regex), never from the table's own output."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from browser import Tree  # tests/browser.py

from pytest_b70lab import cli
from pytest_b70lab.cli import sweep as sweep_cli
from pytest_b70lab.contract import schema as contract
from pytest_b70lab.contract import variants
from pytest_b70lab.engine import capability
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import throughput
from pytest_b70lab.report import sweep as sweep_page
from pytest_b70lab.sweep import plan, runner, table

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "fixtures" / "evidence"
CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
PER_POS = re.compile(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$', re.M)
DRAFTS = re.compile(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)$", re.M)


def test_starts_interleave_forwards_then_backwards() -> None:
    order = plan.start_order(["a", "b", "c"], 3, own_teachers=["b"])
    assert [p.label() for p in order] == [
        "a start-1",
        "b start-1",
        "c start-1",
        "b teacher start-1",
        "c start-2",
        "b start-2",
        "a start-2",
        "a start-3",
        "b start-3",
        "c start-3",
    ]
    assert {p.round for p in order if p.index == 2} == {2}
    with pytest.raises(ValueError, match="at least one round"):
        plan.start_order(["a"], 0)


def test_an_interleaved_sessions_starts_come_last_in_the_alternating_order() -> None:
    """Sequential variants and own teachers first (the teachers before the session: theirs are one start at a
    time), then the session's starts in the order they are launched: A B, B A."""
    order = plan.start_order(["a", "b", "t"], 2, own_teachers=["b"], session=["a", "b"])
    assert [p.label() for p in order] == [
        "t start-1",
        "b teacher start-1",
        "t start-2",
        "a start-1",
        "b start-1",
        "b start-2",
        "a start-2",
    ]


def test_an_interleaved_sweep_serves_the_variants_whose_contract_interleaves() -> None:
    base = contract.load("mini-laguna-cpu")
    grid = variants.grid(base, ["speculative.num_speculative_tokens=3"], extra=("target-only",))
    assert base.reproduction.schedule == "interleaved"
    one = base.reproduction.alive_together
    assert capability.ram_need(grid[1].contract) == capability.ram_need(base)

    def holding(starts: int) -> capability.Machine:
        """A machine with memory and /dev/shm for this many starts of the base (the preflight's figures), and no
        more: the test must not depend on what else the machine it runs on holds."""
        ram, shm = capability.ram_need(base) // one, capability.shm_need(base) // one
        return capability.Machine(available_memory=starts * ram, shm_free=starts * shm)

    assert runner.session_members(grid, "sequential", 2) == ([], {})
    # The teacher's starts stay one at a time (its contract is sequential): it runs before the session.
    assert runner.session_members(grid, "interleaved", 2, machine=holding(4)) == ([grid[0].name, grid[1].name], {})
    with pytest.raises(runner.SweepError, match="one of sequential, interleaved"):
        runner.session_members(grid, "both", 2)
    with pytest.raises(runner.SweepError, match="no variant's contract has"):
        runner.session_members(grid[2:], "interleaved", 2)
    uneven = variants.grid(base, ["reproduction.passes=3,5"])
    with pytest.raises(runner.SweepError, match="different passes"):
        runner.session_members(uneven, "interleaved", 2)
    # A session the machine cannot hold: the base takes its place first, a variant that does not fit beside it
    # is measured one start at a time, and says why (the preflight's figures).
    members, alone = runner.session_members(grid, "interleaved", 2, machine=holding(3))
    assert members == [grid[0].name] and list(alone) == [grid[1].name], (members, alone)
    assert alone[grid[1].name].startswith("the machine cannot hold it beside the session: memory")
    sequential = runner.measured_alone(grid[1])
    assert sequential.name == grid[1].name and sequential.contract.reproduction.schedule == "sequential"
    assert (
        sequential.contract.reproduction.passes == 1 and sequential.contract.speculative == grid[1].contract.speculative
    )
    members, alone = runner.session_members(grid, "interleaved", 2, machine=holding(1))
    assert members == [] and set(alone) == {grid[0].name, grid[1].name}
    assert runner.session_members(grid, "interleaved", 2, {grid[1].name: "as planned"}) == (
        [grid[0].name],
        {grid[1].name: "as planned"},
    )


def test_two_starts_of_one_session_compare_as_gate_7_compares_them() -> None:
    """The sweep's variant-to-base figure of two starts measured side by side is the figure gate 7 takes of the
    same two starts: one estimator, whichever question is asked of the pairs."""
    from pytest_b70lab.evidence.run_folder import Run, read_starts
    from pytest_b70lab.judge import reproduction

    folder = BUNDLES / "mini-laguna-cpu"
    one, two = read_starts(folder)
    as_variant = two.model_copy(update={"start_index": 1})
    figure = table.interleaved_to_base(Run(folder, (one,), None), Run(folder, (as_variant,), None))
    gate = reproduction.speed_figures([one, two], contract.load("mini-laguna-cpu")).paired[0]
    assert figure is not None and gate is not None
    assert (figure.ratio, figure.low, figure.high) == pytest.approx((gate.ratio, gate.low, gate.high), rel=1e-12)
    assert table.interleaved_to_base(Run(folder, (one,), None), Run(folder, (two,), None)) is None  # no start-1


def test_a_variant_measured_on_another_box_than_its_base_is_not_paired_with_it() -> None:
    """A fleet pairs each variant with its own shard's base; a planted pair across two boxes gets no speed figure."""
    from pytest_b70lab.evidence.run_folder import Run, read_starts

    folder = BUNDLES / "mini-laguna-cpu-int4"
    one, two = read_starts(folder)

    def on(box: str, start):  # type: ignore[no-untyped-def]
        return start.model_copy(update={"host": {**(start.host or {}), "box": {"label": box, "digest": box[-1] * 16}}})

    base_v = variants.Variant("base", contract.load("mini-laguna-cpu-int4"), {})
    rows = {}
    for name, boxes in (("same", ("box-a", "box-a")), ("planted", ("box-a", "box-b"))):
        base_run = Run(folder, (on(boxes[0], one), on(boxes[0], two)), None)
        run = Run(folder, (on(boxes[1], one), on(boxes[1], two)), None)
        rows[name] = table._row(base_v, base_v, run, base_run, "", folder.parent)
    assert rows["same"].paired_to_base is not None and not rows["same"].notes
    assert rows["planted"].paired_to_base is None and rows["planted"].medians_to_base is None
    assert rows["planted"].notes == [
        "speed to the base not compared: the base ran on box box-a [aaaaaaaaaaaaaaaa], "
        "this variant on box box-b [bbbbbbbbbbbbbbbb]"
    ]


def test_the_command_line_names_the_named_variants_as_variants_does() -> None:
    assert sweep_cli.NAMED_VARIANTS == variants.NAMED


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[variants.Variant], dict[str, str]]:
    out = tmp_path_factory.mktemp("sweep")
    base = contract.load("mini-laguna-cpu")
    grid = variants.grid(base, [], extra=("target-only",))
    runner.prepare(out, grid)
    shutil.copytree(BUNDLES / "mini-laguna-cpu", plan.variant_dir(out, base.name), dirs_exist_ok=True)
    shutil.copytree(BUNDLES / "mini-laguna-cpu-teacher", plan.variant_dir(out, "target-only"), dirs_exist_ok=True)
    judged = {v.name: runner.judge(v, out, None, False, out / "no-cache") for v in grid}
    return out, grid, judged


@pytest.fixture(scope="module")
def rows(swept) -> list[table.Row]:
    out, grid, judged = swept
    return table.rows(out, grid[0], grid, judged)


def test_each_variant_is_judged_in_process_under_its_own_contract(swept, rows) -> None:
    out, grid, judged = swept
    assert judged == {v.name: "" for v in grid}
    for v in grid:
        verdict = json.loads((plan.variant_dir(out, v.name) / "promotion.json").read_text())
        assert verdict["contract_digest"] == v.contract.digest == contract.load(plan.contract_file(out, v.name)).digest
        assert (plan.variant_dir(out, v.name) / plan.JUDGE_LOG).read_text().startswith(("PROMOTABLE", "NOT PROMOTABLE"))
    base, target_only = rows
    assert (base.verdict, base.promotable) == ("pass", True) and base.verdict_line.startswith("PROMOTABLE at ")
    # The teacher bundle has one start, the teacher's contract asks for two: incomplete, and every gate on the
    # start that ran passed (its tokens are the committed teacher snapshot's; it compiled the target alone).
    assert (target_only.verdict, target_only.promotable) == ("incomplete", False)
    assert "1 fresh start of 2" in target_only.verdict_line and "failed" not in target_only.verdict_line
    assert target_only.judged_against.startswith("no teacher")


def _per_prompt(folder: Path) -> dict[str, float]:
    """Each prompt's median over the starts of its rate per start: an interleaved start's median over every
    counted pass, as gate 7 takes it (a sequential start has one request a prompt)."""

    def rate(r: evidence.Request) -> float:
        return (len(throughput.token_arrival_times(r.chunk_times, r.chunk_tokens)) - 1) / (
            r.chunk_times[-1] - r.chunk_times[0]
        )

    seen: dict[str, list[float]] = {}
    for path in sorted(folder.glob("start-*/evidence.json")):
        start = evidence.read(path.parent)
        passes: dict[str, list[float]] = {}
        counted = start.counted().values() if start.schedule is not None else [(None, r) for r in start.requests]
        for _m, r in counted:
            passes.setdefault(r.prompt_id, []).append(rate(r))
        for prompt_id, rates in passes.items():
            seen.setdefault(prompt_id, []).append(statistics.median(rates))
    return {p: statistics.median(v) for p, v in seen.items()}


def test_the_paired_ratio_to_the_base_is_the_geometric_mean_of_prompt_ratios(swept, rows) -> None:
    out, grid, _ = swept
    a, b = (_per_prompt(plan.variant_dir(out, v.name)) for v in grid)
    expected = math.exp(statistics.mean(math.log(b[p] / a[p]) for p in a))
    paired = rows[1].paired_to_base
    assert paired["ratio"] == pytest.approx(expected, rel=1e-9) and paired["prompts"] == len(a) == 6
    assert paired["low"] <= paired["ratio"] <= paired["high"] < 1, "target-only decodes without drafts: slower"
    assert rows[0].paired_to_base is None and rows[1].outputs_identical_to_base == "6/6"


def test_a_variant_on_another_host_class_gets_no_ratio_to_the_base_and_a_note_why(swept, tmp_path: Path) -> None:
    out, grid, judged = swept
    moved = Path(shutil.copytree(out, tmp_path / "sweep"))
    for start in sorted(plan.variant_dir(moved, "target-only").glob("start-*")):
        record = evidence.read(start)
        assert record.host is not None
        record.host.update(model="Intel(R) Xeon(R) Platinum 8481C", amx=True)
        evidence.write(record, start)
    base_row, row = table.rows(moved, grid[0], grid, judged)
    assert row.paired_to_base is None and row.medians_to_base is None and row.outputs_identical_to_base == "6/6"
    assert row.notes[-1].startswith("speed to the base not compared: base on Intel(R) Xeon(R) Processor"), row.notes
    assert "this variant on Intel(R) Xeon(R) Platinum 8481C" in row.notes[-1] and base_row.paired_to_base is None


def test_every_start_of_a_row_names_its_box(swept, rows, tmp_path: Path) -> None:
    out, grid, judged = swept
    assert all(s.box is None for row in rows for s in row.starts), "the committed bundles predate the box"
    moved = Path(shutil.copytree(out, tmp_path / "sweep"))
    for start in sorted(plan.variant_dir(moved, "target-only").glob("start-*")):
        record = evidence.read(start)
        assert record.host is not None
        record.host["box"] = {"label": "b70-02", "digest": "0123456789abcdef"}
        evidence.write(record, start)
    base_row, row = table.rows(moved, grid[0], grid, judged)
    assert row.starts and [s.box for s in row.starts] == ["box b70-02 [0123456789abcdef]"] * len(row.starts)
    assert all(s.box is None for s in base_row.starts), "only the edited variant's starts name a box"


def test_kv_capacity_and_acceptance_are_the_engines_own_figures(swept, rows) -> None:
    out, grid, _ = swept
    for v, row in zip(grid, rows, strict=False):
        first = evidence.read(plan.variant_dir(out, v.name) / "start-1")
        labels = CACHE_CONFIG.search(first.metrics_before).group(1)
        blocks, tokens = (
            re.search(rf'\b{key}="(\d+)"', labels).group(1) for key in ("num_gpu_blocks", "kv_cache_size_tokens")
        )
        assert (row.kv_blocks, row.kv_tokens, row.kv_cache_dtype) == (int(blocks), int(tokens), "fp8")
    starts = [
        evidence.read(p.parent) for p in sorted(plan.variant_dir(out, grid[0].name).glob("start-*/evidence.json"))
    ]
    drafts = sum(
        sum(map(float, DRAFTS.findall(s.metrics_after))) - sum(map(float, DRAFTS.findall(s.metrics_before)))
        for s in starts
    )
    accepted: dict[int, float] = {}
    for s in starts:
        before = {int(p): float(v) for p, v in PER_POS.findall(s.metrics_before)}
        for p, v in PER_POS.findall(s.metrics_after):
            accepted[int(p)] = accepted.get(int(p), 0.0) + float(v) - before.get(int(p), 0.0)
    assert rows[0].accepted_per_draft == pytest.approx(sum(accepted.values()) / drafts)
    assert rows[0].acceptance_per_position == pytest.approx({p: n / drafts for p, n in accepted.items()})
    assert len(rows[0].acceptance_per_position) == grid[0].contract.speculative.num_speculative_tokens
    assert rows[1].accepted_per_draft is None and rows[1].notes == [], "no draft: nothing to accept, nothing to say"
    assert [s.graphs for s in rows[0].starts] == ["compiled", "loaded"], "start-1 compiled, start-2 loaded"


def test_a_failed_start_fails_its_variant_whatever_the_rounds(tmp_path: Path) -> None:
    base = contract.load("mini-laguna-cpu")
    grid = variants.grid(base, [])
    runner.prepare(tmp_path, grid)
    folder = plan.variant_dir(tmp_path, base.name)
    shutil.copytree(BUNDLES / "mini-laguna-cpu", folder, dirs_exist_ok=True)
    failed = evidence.read(folder / "start-2")
    failed.status, failed.failure = "failed", evidence.Failure(message="engine not ready after 5 s (deadline)")
    evidence.write(failed, folder / "start-2")
    assert runner.judge(grid[0], tmp_path, None, False, tmp_path / "no-cache") == ""
    (row,) = table.rows(tmp_path, grid[0], grid)
    assert row.verdict == "fail" and "start-2 failed: engine not ready after 5 s" in row.verdict_line
    assert [s.status for s in row.starts] == ["ok", "failed"] and row.starts[1].decode_median is None


def test_a_sweep_folder_is_never_reused(swept) -> None:
    out, grid, _ = swept
    with pytest.raises(runner.SweepError, match="already holds a sweep: give --out a new folder"):
        runner.prepare(out, grid)


def test_junit_has_one_test_per_variant(rows) -> None:
    suite = ET.fromstring(table.junit_xml(rows, "mini-laguna-cpu")).find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [r.variant for r in rows]
    assert cases[0].find("skipped") is None and cases[0].find("failure") is None
    assert "1 fresh start of 2" in cases[1].find("skipped").get("message")
    props = {p.get("name"): p.get("value") for p in cases[1].find("properties")}
    assert float(props["paired_to_base"]) == pytest.approx(rows[1].paired_to_base["ratio"])


def test_the_terminal_table_has_a_line_and_a_verdict_per_variant(rows) -> None:
    text = table.format_table(rows).splitlines()
    assert text[0].split()[:2] == ["variant", "verdict"]
    assert text[1].split()[:3] == ["mini-laguna-cpu", "PASS", "2/2"] and "base" in text[1]
    assert text[2].split()[:3] == ["target-only", "INCOMPLETE", "1/2"]
    assert text[-1] == f"target-only: {rows[1].verdict_line}"


def test_the_page_shows_every_variant_and_loads_nothing(swept, rows, tmp_path: Path) -> None:
    out, grid, _ = swept
    data = {
        "schema": plan.SWEEP_SCHEMA,
        "version": plan.SWEEP_VERSION,
        "base": grid[0].name,
        "base_digest": grid[0].contract.digest,
        "varies": [],
        "fields": [],
        "named": ["target-only"],
        "rounds": 2,
        "order": [],
        "problems": [],
        "variants": [r.as_dict() for r in rows],
    }
    (tmp_path / plan.SWEEP_JSON).write_text(json.dumps(data))
    page = Tree(sweep_page.write(tmp_path / plan.SWEEP_JSON).read_text()).root
    for node in page.walk():
        assert all(node.attrs.get(a) is None for a in ("src", "href")), f"<{node.tag}> fetches at open time"
    assert {n.attrs["id"] for n in page.find("b") if n.attrs.get("id", "").startswith("variant-")} == {
        f"variant-{r.variant}" for r in rows
    }
    assert [n.attrs["data-plot"] for n in page.find("div", cls="plot")] == ["speed", "acceptance"]
    (tmp_path / plan.SWEEP_JSON).write_text("{}")
    with pytest.raises(sweep_page.ReportError, match="is not a sweep table"):
        sweep_page.write(tmp_path / plan.SWEEP_JSON)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--vary", "engine.no_such_field=1"], "has no field engine.no_such_field"),
        (["--vary", "speculative.num_speculative_tokens=0"], "refused by the contract rules"),
        (["--rounds", "0"], "a sweep needs at least one round"),
        (["--prompts", "no-such-prompt"], "no prompt 'no-such-prompt' in the set"),
        (["--named", "fastest"], "no named variant 'fastest'"),
    ],
)
def test_a_sweep_it_cannot_run_is_refused_before_any_start(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sweep", "--contract", "mini-laguna-cpu", "--out", str(tmp_path / "s"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists(), "nothing was written"


# --- resuming an interrupted sweep (the whole path, Ctrl-C and --resume: tests/engine/test_sweep_smoke.py) ---


def test_resume_keeps_what_ended_and_runs_again_what_was_cut_off(tmp_path: Path) -> None:
    """A start that ended (ok, or failed by itself) is kept; one with no evidence, damaged evidence, or
    interrupted by Ctrl-C is run again."""
    base = contract.load("mini-laguna-cpu")
    grid = variants.grid(base, [])
    runner.prepare(tmp_path, grid, {"contract": "mini-laguna-cpu", "rounds": 2})
    assert runner.read_plan(tmp_path)["variants"] == [{"name": base.name, "digest": base.digest}]
    runner.check_resumable(tmp_path, grid, runner.read_plan(tmp_path))
    folder = plan.variant_dir(tmp_path, base.name)
    shutil.copytree(BUNDLES / "mini-laguna-cpu", folder, dirs_exist_ok=True)
    assert runner._kept(folder / "start-1") == "ok"
    assert runner._kept(folder / "start-3") is None, "never ran"
    cut = evidence.read(folder / "start-2")
    cut.status, cut.failure = "failed", evidence.Failure(message="interrupted: KeyboardInterrupt: ")
    evidence.write(cut, folder / "start-2")
    assert runner._kept(folder / "start-2") is None
    cut.failure = evidence.Failure(message="engine not ready after 5 s (deadline)")
    evidence.write(cut, folder / "start-2")
    assert runner._kept(folder / "start-2") == "failed: engine not ready after 5 s (deadline)"
    (folder / "start-2" / evidence.FILENAME).write_text("{ torn")
    assert runner._kept(folder / "start-2") is None
    runner._discard(folder / "start-2", lambda _msg: None)
    assert not (folder / "start-2").exists()


def test_resume_refuses_what_it_cannot_continue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "holds no sweep to resume (no plan.json)" in capsys.readouterr().err
    assert cli.main(["sweep", "--resume", str(tmp_path), "--contract", "mini-laguna-cpu"]) == 2
    assert "leave out --contract" in capsys.readouterr().err
    assert cli.main(["sweep", "--out", str(tmp_path / "s")]) == 2
    assert "needs --contract and --out (or --resume DIR" in capsys.readouterr().err
    base = contract.load("mini-laguna-cpu")
    runner.prepare(tmp_path / "s", variants.grid(base, []), {"contract": "mini-laguna-cpu"})
    with pytest.raises(runner.SweepError, match="continue it with --resume"):
        runner.prepare(tmp_path / "s", variants.grid(base, []))
    other = variants.grid(base, ["speculative.num_speculative_tokens=3"])
    with pytest.raises(runner.SweepError, match="planned"):
        runner.check_resumable(tmp_path / "s", other, runner.read_plan(tmp_path / "s"))
    (tmp_path / "s" / plan.SWEEP_JSON).write_text("{}")
    with pytest.raises(runner.SweepError, match="is a finished sweep"):
        runner.read_plan(tmp_path / "s")
