"""`b70lab bench`'s pure parts, on a result `vllm bench serve --save-detailed` wrote against the mini."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from pytest_b70lab import bench, cli

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "bench" / "vllm-bench-serve-detailed.json"


def test_vllm_bench_serve_is_read_with_the_clients_accounting() -> None:
    result = json.loads(RECORDED.read_text())
    tpots = bench._bench_serve_tpots(result)
    assert len(tpots) == result["completed"] == 6
    # Its latency - ttft is the sum of its inter-token gaps: the span from first to last token, as the client's.
    for tpot, n, itls in zip(tpots, result["output_lens"], result["itls"]):
        assert tpot == pytest.approx(sum(itls) / (n - 1), rel=1e-9)
    # ... and its own mean TPOT is the mean of exactly these, so 1 / mean is the server histogram's statistic.
    assert statistics.fmean(tpots) * 1000 == pytest.approx(result["mean_tpot_ms"], rel=1e-9)
    assert bench.per_token_rate(tpots) == pytest.approx(1000 / result["mean_tpot_ms"])


def test_start_phases_split_a_start_by_its_log_phases() -> None:
    figure = bench.start_phases({"loading weights": 22.0, "compiling": 24.0, "allocating KV cache": 47.0,
                                 "starting API server": 47.5, "ready": 48.0})
    assert figure.value == 48.0
    assert figure.detail == "imports + set-up 22 s, weights 2 s, compile 23 s, KV cache 0 s, API server 0 s"


def test_an_unknown_part_is_a_usage_error(capsys) -> None:
    assert cli.main(["bench", "--parts", "import,warp"]) == 2
    assert "unknown bench part(s) warp (parts: import, replay, audit, start, decode, overhead)" in capsys.readouterr().err
