"""Decode accounting: (N - 1) / (t_N - t_1), a speculative chunk delivering several tokens at once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_b70lab import throughput


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


@pytest.mark.parametrize(("times", "counts", "message"), [
    ([1.0], [1], "at least 2 tokens"),
    ([1.0], [4], "arrived at once"),
    ([1.0, 2.0], [1], "2 chunk times for 1"),
])
def test_unmeasurable_requests_are_errors(times, counts, message) -> None:
    with pytest.raises(ValueError, match=message):
        throughput.decode_rate(times, counts)


def test_endpoint_is_the_median_over_prompts() -> None:
    assert throughput.endpoint_median([3.0, 1.0, 100.0]) == 3.0
    with pytest.raises(ValueError):
        throughput.endpoint_median([])
