"""Decode-throughput accounting, as the lab defines it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def token_arrival_times(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """t_k for every token k: a chunk that carries several tokens (a speculative step) delivers them
    all at its own arrival time."""
    if len(chunk_times) != len(chunk_tokens):
        raise ValueError(f"{len(chunk_times)} chunk times for {len(chunk_tokens)} chunk token counts")
    return [t for t, n in zip(chunk_times, chunk_tokens) for _ in range(n)]


def decode_rate(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> float:
    """(N - 1) / (t_N - t_1) tokens per second: N = 100 gives the conventional 99 intervals."""
    times = token_arrival_times(chunk_times, chunk_tokens)
    if len(times) < 2:
        raise ValueError(f"a decode rate needs at least 2 tokens, got {len(times)}")
    span = times[-1] - times[0]
    if span <= 0:
        raise ValueError(f"all {len(times)} tokens arrived at once: no decode interval to measure")
    return (len(times) - 1) / span


def endpoint_median(rates: Sequence[float]) -> float:
    """The endpoint figure of one start: the median over its prompts."""
    if not rates:
        raise ValueError("no per-prompt decode rates to take a median of")
    return statistics.median(rates)
