"""Decode-throughput accounting, as the lab defines it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .metrics import histogram_mean


def token_arrival_times(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """t_k for every token k: a chunk that carries several tokens (a speculative step) delivers them
    all at its own arrival time."""
    if len(chunk_times) != len(chunk_tokens):
        raise ValueError(f"{len(chunk_times)} chunk times for {len(chunk_tokens)} chunk token counts")
    return [t for t, n in zip(chunk_times, chunk_tokens, strict=False) for _ in range(n)]


def decode_rate(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> float:
    """(N - 1) / (t_N - t_1) tokens per second: N = 100 gives the conventional 99 intervals."""
    times = token_arrival_times(chunk_times, chunk_tokens)
    if len(times) < 2:
        raise ValueError(f"a decode rate needs at least 2 tokens, got {len(times)}")
    span = times[-1] - times[0]
    if span <= 0:
        raise ValueError(f"all {len(times)} tokens arrived at once: no decode interval to measure")
    return (len(times) - 1) / span


def arrival_rates(requests: Iterable[Any]) -> tuple[dict[str, float], dict[str, str]]:
    """Each request's decode rate recomputed from its token arrival times (never a recorded figure), by
    prompt id, and why a request has none (its times give no positive, finite rate): the one place the
    gates, the report and the bench recompute rates."""
    rates, problems = {}, {}
    for r in requests:
        try:
            rate = decode_rate(r.chunk_times, r.chunk_tokens)
        except ValueError as e:
            problems[r.prompt_id] = f"no decode rate from its arrival times: {e}"
            continue
        if math.isfinite(rate) and rate > 0:
            rates[r.prompt_id] = rate
        else:
            problems[r.prompt_id] = f"its arrival times give a decode rate of {rate}"
    return rates, problems


def endpoint_median(rates: Sequence[float]) -> float:
    """The endpoint figure of one start: the median over its prompts."""
    if not rates:
        raise ValueError("no per-prompt decode rates to take a median of")
    return statistics.median(rates)


def arrival_median(requests: Iterable[Any]) -> float | None:
    """A start's endpoint figure recomputed from its requests' arrival times (None: no request has a rate)."""
    rates, _problems = arrival_rates(requests)
    return endpoint_median(list(rates.values())) if rates else None


@dataclass(frozen=True)
class PairedRatio:
    """B / A as the geometric mean over prompts of each prompt's decode-rate ratio. Each prompt is its own
    control: the prompts' rates differ 2-3x (their lengths and contexts), so a shift common to all of them
    moves this figure by the shift, where the median over prompts can stay put (the committed bundle: four of
    six prompts 10-13 % slower at start-2, medians 0.6 % apart). The interval is a percentile bootstrap that
    resamples prompts with replacement: with six prompts it is reported, not judged."""

    ratio: float
    low: float
    high: float
    prompts: int
    confidence: float
    resamples: int

    @property
    def drift(self) -> float:
        """How far from 1 the ratio is, as a fraction (the endpoint medians' drift is measured the same way)."""
        return abs(self.ratio - 1)

    def line(self) -> str:
        return (
            f"{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}] "
            f"({self.confidence * 100:g} %, {self.prompts} prompt{'s' if self.prompts != 1 else ''})"
        )


def paired_ratio(
    rates_a: Mapping[str, float],
    rates_b: Mapping[str, float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> PairedRatio | None:
    """The paired figure over the prompts both sides have a positive, finite rate for; None if there is none."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    import numpy as np  # here: the CLI imports this module before it needs numpy

    usable = [k for k in rates_a if k in rates_b and all(math.isfinite(r) and r > 0 for r in (rates_a[k], rates_b[k]))]
    if not usable:
        return None
    logs = np.log([rates_b[k] / rates_a[k] for k in usable])
    idx = np.random.default_rng(seed).integers(0, len(logs), size=(resamples, len(logs)))
    low, high = np.exp(np.quantile(logs[idx].mean(axis=1), [(1 - confidence) / 2, (1 + confidence) / 2]))
    return PairedRatio(float(np.exp(logs.mean())), float(low), float(high), len(logs), confidence, resamples)


def server_decode_figures(before: str | None, after: str | None) -> tuple[float | None, float | None, float | None]:
    """(mean seconds between engine steps, mean seconds per output token, tokens per second), vLLM's own.

    `inter_token_latency_seconds` is observed once per engine step, not per token: with accepted drafts a
    step carries several tokens, so its inverse is a step rate. The per-token figure is
    `request_time_per_output_token_seconds` (each request's decode time over its output tokens)."""
    step = histogram_mean(before, after, "vllm:inter_token_latency_seconds")
    per_token = histogram_mean(before, after, "vllm:request_time_per_output_token_seconds")
    return step, per_token, (1.0 / per_token if per_token else None)
