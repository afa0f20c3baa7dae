"""Decode accounting: (N - 1) / (t_N - t_1), a speculative chunk delivering several tokens at once."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_b70lab.evidence import throughput


def test_one_token_a_chunk() -> None:
    # 100 tokens, one every 10 ms: 99 intervals over 0.99 s
    times = [0.5 + 0.01 * i for i in range(100)]
    assert throughput.decode_rate(times, [1] * 100) == pytest.approx(100.0)


def test_a_chunk_carrying_several_tokens_gives_them_all_its_arrival_time() -> None:
    assert throughput.token_arrival_times([1.0, 2.0], [1, 3]) == [1.0, 2.0, 2.0, 2.0]
    assert throughput.decode_rate([1.0, 2.0], [1, 3]) == pytest.approx(3.0)


@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.integers(1, 12)), min_size=2, max_size=50))
def test_rate_is_tokens_minus_one_over_the_span(chunks) -> None:
    times, t = [], 0.0
    for gap, _ in chunks:
        t += gap
        times.append(t)
    counts = [n for _, n in chunks]
    n = sum(counts)
    span = times[-1] - times[0]
    assert throughput.decode_rate(times, counts) == pytest.approx((n - 1) / span)


@pytest.mark.parametrize(
    ("times", "counts", "message"),
    [
        ([1.0], [1], "at least 2 tokens"),
        ([1.0], [4], "arrived at once"),
        ([1.0, 2.0], [1], "2 chunk times for 1"),
    ],
)
def test_unmeasurable_requests_are_errors(times, counts, message) -> None:
    with pytest.raises(ValueError, match=message):
        throughput.decode_rate(times, counts)


def test_endpoint_is_the_median_over_prompts() -> None:
    assert throughput.endpoint_median([3.0, 1.0, 100.0]) == 3.0
    with pytest.raises(ValueError):
        throughput.endpoint_median([])


def test_the_server_figure_counts_tokens_not_engine_steps() -> None:
    """On a recorded run with accepted drafts: vLLM's inter-token histogram is per engine step, so its inverse
    undercounts by the tokens a step carries (1 + accepted / drafts); the per-token histogram agrees with
    the client's decode median."""
    import json
    from pathlib import Path

    from pytest_b70lab.evidence import metrics

    bundle = Path(__file__).resolve().parents[2] / "fixtures" / "evidence" / "mini-laguna-cpu"
    for start in sorted(bundle.glob("start-*/evidence.json")):
        e = json.loads(start.read_text())
        step_s, per_token_s, rate = throughput.server_decode_figures(e["metrics_before"], e["metrics_after"])
        spec = "vllm:spec_decode_num_"
        drafts, accepted = (
            metrics.counter_total(e["metrics_after"], spec + n) - metrics.counter_total(e["metrics_before"], spec + n)
            for n in ("drafts_total", "accepted_tokens_total")
        )
        tokens_per_step = 1 + accepted / drafts
        assert tokens_per_step > 2, (
            f"{start}: the bundle should carry accepted runs ({tokens_per_step:.2f} tokens a step)"
        )
        assert step_s / per_token_s == pytest.approx(tokens_per_step, rel=0.25), start
        client = e["throughput"]["endpoint_median"]
        assert rate == pytest.approx(client, rel=0.3), f"{start}: server {rate:.1f} tok/s, client median {client:.1f}"


rates = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=4),
    st.floats(min_value=1.0, max_value=1e4, allow_nan=False),
    min_size=1,
    max_size=12,
)


@given(rates, st.floats(min_value=0.2, max_value=5.0))
def test_a_common_shift_is_the_paired_figure_exactly(a: dict[str, float], shift: float) -> None:
    """Every prompt moved by the same factor: the paired figure is that factor, its interval has no width."""
    paired = throughput.paired_ratio(a, {k: v * shift for k, v in a.items()}, resamples=200)
    assert paired is not None and paired.prompts == len(a)
    assert paired.ratio == pytest.approx(shift, rel=1e-9)
    assert paired.low == pytest.approx(shift, rel=1e-9) and paired.high == pytest.approx(shift, rel=1e-9)


@given(rates, rates)
def test_the_paired_figure_is_the_geometric_mean_of_the_ratios(a: dict[str, float], b: dict[str, float]) -> None:
    common = [k for k in a if k in b]
    paired = throughput.paired_ratio(a, b, resamples=200)
    if not common:
        assert paired is None
        return
    assert paired is not None and paired.prompts == len(common)
    assert paired.ratio == pytest.approx(statistics.geometric_mean([b[k] / a[k] for k in common]), rel=1e-9)
    assert paired.low <= paired.ratio * (1 + 1e-9) and paired.ratio <= paired.high * (1 + 1e-9)
    swapped = throughput.paired_ratio(b, a, resamples=200)
    assert swapped is not None and swapped.ratio == pytest.approx(1 / paired.ratio, rel=1e-9)


def test_prompts_without_a_usable_rate_on_both_sides_are_left_out() -> None:
    paired = throughput.paired_ratio({"x": 100.0, "y": 200.0, "z": 50.0}, {"x": 90.0, "y": float("nan"), "w": 10.0})
    assert paired is not None and paired.prompts == 1 and paired.ratio == pytest.approx(0.9)
    with pytest.raises(ValueError, match="confidence"):
        throughput.paired_ratio({"x": 1.0}, {"x": 1.0}, confidence=1.0)
