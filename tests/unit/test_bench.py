"""`b70lab bench`'s pure parts, on a result `vllm bench serve --save-detailed` wrote against the mini."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest

from pytest_b70lab import cli
from pytest_b70lab.bench import decode as bench_decode
from pytest_b70lab.bench import figures as bench_figures
from pytest_b70lab.bench import reproduction as bench_reproduction
from pytest_b70lab.bench import start as bench_start
from pytest_b70lab.bench import steadiness as bench_steadiness
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import throughput
from pytest_b70lab.evidence.run_folder import read_starts

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "fixtures" / "bench" / "vllm-bench-serve-detailed.json"
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"


def test_vllm_bench_serve_is_read_with_the_clients_accounting() -> None:
    result = json.loads(RECORDED.read_text())
    tpots = bench_decode._bench_serve_tpots(result)
    assert len(tpots) == result["completed"] == 6
    # Its latency - ttft is the sum of its inter-token gaps: the span from first to last token, as the client's.
    for tpot, n, itls in zip(tpots, result["output_lens"], result["itls"], strict=False):
        assert tpot == pytest.approx(sum(itls) / (n - 1), rel=1e-9)
    # ... and its own mean TPOT is the mean of exactly these, so 1 / mean is the server histogram's statistic.
    assert statistics.fmean(tpots) * 1000 == pytest.approx(result["mean_tpot_ms"], rel=1e-9)
    assert bench_decode.per_token_rate(tpots) == pytest.approx(1000 / result["mean_tpot_ms"])


def test_start_phases_split_a_start_by_its_log_phases() -> None:
    figure = bench_start.start_phases(
        {
            "loading weights": 22.0,
            "compiling": 24.0,
            "allocating KV cache": 47.0,
            "starting API server": 47.5,
            "ready": 48.0,
        }
    )
    assert figure.value == 48.0
    assert figure.detail == "imports + set-up 22 s, weights 2 s, compile 23 s, KV cache 0 s, API server 0 s"


def test_an_unknown_part_is_a_usage_error(capsys) -> None:
    assert cli.main(["bench", "--parts", "import,warp"]) == 2
    assert (
        "unknown bench part(s) warp (parts: import, replay, audit, start, decode, overhead, reproduction, steadiness)"
        in capsys.readouterr().err
    )


def test_a_sessions_drift_is_recomputed_from_its_arrival_times() -> None:
    """The committed bundle, interleaved: start-1 compiled, start-2 loaded. Its figures, worked out here by hand
    from the arrival times: each prompt's median rate over the passes, the median over prompts; each prompt's
    median over passes of the within-pass ratio, the geometric mean over prompts."""
    drift = bench_reproduction.session_drift(BUNDLE)
    starts = read_starts(BUNDLE)
    rates = [
        {key: throughput.decode_rate(r.chunk_times, r.chunk_tokens) for key, (_m, r) in s.counted().items()}
        for s in starts
    ]
    prompts = sorted({p for _n, p in rates[0]})
    medians = [
        statistics.median(statistics.median(v for (n, p), v in r.items() if p == q) for q in prompts) for r in rates
    ]
    assert drift.median_ratio == pytest.approx(medians[1] / medians[0])
    per_prompt = [statistics.median(rates[1][k] / rates[0][k] for k in rates[0] if k[1] == q) for q in prompts]
    assert drift.paired == pytest.approx(statistics.geometric_mean(per_prompt))
    assert drift.paired_low <= drift.paired <= drift.paired_high
    assert drift.graphs == ("compiled", "loaded") and drift.schedule == "interleaved"


def test_the_summary_over_sessions_gives_median_min_and_max(tmp_path: Path) -> None:
    """Three sessions: the bundle, and copies with start-2's arrival times stretched 1.1x and 1.3x."""
    sessions = [bench_reproduction.session_drift(BUNDLE)]
    for stretch in (1.1, 1.3):
        copy = tmp_path / f"x{stretch}"
        shutil.copytree(BUNDLE, copy)
        record = evidence.read(copy / "start-2" / evidence.FILENAME)
        for r in (*record.requests, *record.repeats):
            r.chunk_times = [t * stretch for t in r.chunk_times]
        evidence.write(evidence.rederive(record), copy / "start-2")
        sessions.append(bench_reproduction.session_drift(copy))
    base = sessions[0]
    assert sessions[2].paired == pytest.approx(base.paired / 1.3)
    medians, paired, decision = bench_reproduction.drift_figures(sessions)
    assert paired.value == pytest.approx(base.paired / 1.1) and paired.met is False
    assert f"min {base.paired / 1.3:.3f}, max {base.paired:.3f}" in paired.detail
    assert medians.value == pytest.approx(base.median_ratio / 1.1)
    assert "graphs (start-1 / start-2) mostly compiled / loaded" in medians.detail
    # Under the bundle's point rule (paired 0.10): 1.073 and 1.073 / 1.1 = 0.975 pass, 1.073 / 1.3 = 0.825 fails.
    assert decision.detail.startswith("passed in 2 of 3 sessions; passes served 3, 3, 3"), decision.detail
    assert "(point rule)" in decision.measure
    alone = bench_reproduction.drift_figures(sessions[:1])[1]
    assert alone.met is (abs(base.paired - 1) <= bench_reproduction.REPRODUCTION_GOAL), alone


def test_a_run_without_two_completed_starts_is_a_bench_error(tmp_path: Path) -> None:
    copy = tmp_path / "one"
    shutil.copytree(BUNDLE, copy)
    shutil.rmtree(copy / "start-2")
    with pytest.raises(bench_figures.BenchError, match="two completed starts are needed"):
        bench_reproduction.session_drift(copy)
    with pytest.raises(bench_figures.BenchError, match="no run folder at"):
        bench_reproduction.session_drift(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(bench_figures.BenchError, match="no candidate evidence under"):
        bench_reproduction.session_drift(tmp_path / "empty")


def test_the_reproduction_part_knows_its_compile_cache_choices(tmp_path: Path) -> None:
    with pytest.raises(bench_figures.BenchError, match="compile cache 'cold': one of warm, empty"):
        bench_reproduction.reproduction_sessions(
            "mini-laguna-cpu", tmp_path, tmp_path / "out", sessions=1, compile_cache="cold"
        )
    assert not (tmp_path / "out").exists(), "nothing runs before the choice is checked"
    # The folder it empties is the one every engine start of that cache root compiles into.
    from pytest_b70lab.engine import environment

    env = environment.engine_environment(tmp_path / "engine-state", 2, materialize=False)
    assert bench_reproduction.compile_cache_dir(tmp_path) == Path(env["VLLM_CACHE_ROOT"]) / "torch_compile_cache"


def test_a_starts_two_passes_are_read_as_gate_7_reads_two_starts() -> None:
    """The steadiness control: the bundle's two starts stand in for one start's two passes."""
    starts = read_starts(BUNDLE)
    rates = [throughput.arrival_rates(s.requests)[0] for s in starts]
    drift = bench_steadiness.pass_drift(rates[0], rates[1], (0.0, 0.01))
    paired = throughput.paired_ratio(rates[0], rates[1])
    assert paired is not None and (drift.paired, drift.paired_low, drift.paired_high) == (
        paired.ratio,
        paired.low,
        paired.high,
    )
    medians = [statistics.median(r.values()) for r in rates]
    assert drift.median_ratio == pytest.approx(medians[1] / medians[0])
    assert bench_steadiness.pass_drift(rates[0], {"another-prompt": 100.0}, (0.0, 0.0)) is None
    slower = bench_steadiness.pass_drift(rates[0], {k: v * 0.8 for k, v in rates[0].items()}, (0.0, 0.0))
    medians, paired = bench_steadiness.steadiness_figures([drift, slower], gap_s=40)
    assert paired.value == pytest.approx((drift.paired + 0.8) / 2) and paired.met is False
    assert f"largest drift {0.2:.3f}" in paired.detail
    assert "steal at most 1.0% of a pass" in medians.detail
    assert medians.measure == "pass-2 / pass-1 of one start, 40 s apart, endpoint median ratio, median of 2 starts"
    with pytest.raises(bench_figures.BenchError, match="no start to summarise"):
        bench_steadiness.steadiness_figures([], gap_s=40)


def test_the_machines_steal_is_read_from_the_machine() -> None:
    steal, total = bench_steadiness.cpu_ticks()
    assert 0 <= steal <= total
    time.sleep(0.05)
    later_steal, later_total = bench_steadiness.cpu_ticks()
    assert later_total > total and later_steal >= steal


def test_the_absolute_figure_is_compared_across_schedules_round_by_round() -> None:
    def drift(schedule: str, medians: tuple[float, float]) -> bench_reproduction.SessionDrift:
        return bench_reproduction.SessionDrift("run", 1.0, 1.0, 0.9, 1.1, ("loaded", "loaded"), schedule, medians)

    sequential = [drift("sequential", (300.0, 310.0)), drift("sequential", (200.0, 220.0))]
    faster = [drift("interleaved", (330.0, 341.0)), drift("interleaved", (220.0, 242.0))]
    row = bench_reproduction.across_schedules(sequential, faster)
    assert row.value == pytest.approx(1.10) and row.raw["rounds"] == pytest.approx([1.10, 1.10])
    assert row.met is False  # every round 10 % apart: the interval is [1.1, 1.1], not holding 1
    mixed = [drift("interleaved", (330.0, 341.0)), drift("interleaved", (180.0, 198.0))]
    row = bench_reproduction.across_schedules(sequential, mixed)
    assert row.met is True and "per round 1.100, 0.900" in row.detail
    with pytest.raises(bench_figures.BenchError, match="no round"):
        bench_reproduction.across_schedules([drift("sequential", ())], faster)
