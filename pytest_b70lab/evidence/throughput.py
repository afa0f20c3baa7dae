"""Decode-throughput accounting, as the lab defines it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from .metrics import histogram_mean

_T = TypeVar("_T")


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


def arrival_rates(
    requests: Iterable[Any], keys: Sequence[Any] | None = None
) -> tuple[dict[Any, float], dict[Any, str]]:
    """Each request's decode rate recomputed from its token arrival times (never a recorded figure), by
    prompt id (or by `keys`, one per request, where a prompt has several), and why a request has none (its
    times give no positive, finite rate): the one place the gates, the report and the bench recompute rates."""
    rates: dict[Any, float] = {}
    problems: dict[Any, str] = {}
    requests = list(requests)
    for key, r in zip(keys if keys is not None else [r.prompt_id for r in requests], requests, strict=True):
        try:
            rate = decode_rate(r.chunk_times, r.chunk_tokens)
        except ValueError as e:
            problems[key] = f"no decode rate from its arrival times: {e}"
            continue
        if math.isfinite(rate) and rate > 0:
            rates[key] = rate
        else:
            problems[key] = f"its arrival times give a decode rate of {rate}"
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
    six prompts 10-13 % slower at start-2, medians 0.6 % apart). The interval is over prompts: a percentile
    bootstrap (the point rule's, reported and not judged) or Student's t (the equivalence rule's, judged: with six
    prompts the bootstrap's 90 % interval covers 78-82 %, t's 90-92 %; notes/2026-12-05-gate-7-equivalence.md)."""

    ratio: float
    low: float
    high: float
    prompts: int
    confidence: float
    resamples: int  # 0: Student's t, no resampling

    @property
    def drift(self) -> float:
        """How far from 1 the ratio is, as a fraction (the endpoint medians' drift is measured the same way)."""
        return abs(self.ratio - 1)

    @property
    def method(self) -> str:
        return "t" if self.resamples == 0 else "bootstrap"

    def line(self) -> str:
        return (
            f"{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}] "
            f"({self.confidence * 100:g} %{', t' if self.method == 't' else ''}, "
            f"{self.prompts} prompt{'s' if self.prompts != 1 else ''})"
        )

    def inside(self, tolerance: float) -> bool:
        """The equivalence rule: the whole interval lies within [1 - T, 1 + T] (two one-sided tests, each at
        (1 - confidence) / 2)."""
        return 1 - tolerance <= self.low and self.high <= 1 + tolerance

    def outside(self, tolerance: float) -> bool:
        """The whole interval lies beyond one end of [1 - T, 1 + T]: more passes will not make it equivalent."""
        return self.high < 1 - tolerance or self.low > 1 + tolerance


def paired_ratio(
    rates_a: Mapping[str, float],
    rates_b: Mapping[str, float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    method: str = "bootstrap",
) -> PairedRatio | None:
    """The paired figure over the prompts both sides have a positive, finite rate for; None if there is none."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    usable = [k for k in rates_a if k in rates_b and all(math.isfinite(r) and r > 0 for r in (rates_a[k], rates_b[k]))]
    if not usable:
        return None
    logs = [math.log(rates_b[k] / rates_a[k]) for k in usable]
    return _over_prompts(logs, confidence, resamples, seed, method)


def geometric_ratio(logs: Sequence[float], confidence: float, resamples: int, seed: int) -> PairedRatio:
    """exp of the mean of per-prompt log ratios, with a percentile bootstrap over the prompts."""
    import numpy as np  # here: the CLI imports this module before it needs numpy

    values = np.asarray(logs, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    low, high = np.exp(np.quantile(values[idx].mean(axis=1), [(1 - confidence) / 2, (1 + confidence) / 2]))
    return PairedRatio(float(np.exp(values.mean())), float(low), float(high), len(values), confidence, resamples)


# The equivalence rule's interval: two one-sided tests at 5 % each are one 90 % two-sided interval.
EQUIVALENCE_CONFIDENCE: Final = 0.90


def t_ratio(logs: Sequence[float], confidence: float) -> PairedRatio:
    """exp of the mean of per-prompt log ratios, with Student's t interval over the prompts (one prompt: no
    spread to estimate, so an interval as wide as it can be, which no tolerance holds)."""
    from scipy import stats  # here, as numpy: only a judged figure needs it

    values = [float(x) for x in logs]
    mean = statistics.fmean(values)
    if len(values) < 2:
        return PairedRatio(math.exp(mean), 0.0, math.inf, len(values), confidence, 0)
    half = float(stats.t.ppf((1 + confidence) / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return PairedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(values), confidence, 0)


def interleaved_ratio(
    pairs: Mapping[str, Sequence[tuple[float, float]]],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    method: str = "bootstrap",
) -> PairedRatio | None:
    """B / A from interleaved pairs (per prompt, one (rate A, rate B) per pass, measured side by side in time).

    Each pass's B/A ratio of a prompt is taken within the pass, so that drift between passes cancels; each
    prompt's figure is the median of its passes' log ratios, so that one hiccup (a request at a third of its
    speed, which a probe of this schedule saw once in every few dozen) moves it by at most one rank; the figure
    is the geometric mean over prompts, its interval a bootstrap over prompts, as for paired_ratio (or, `method`
    "t", Student's t over the prompts' figures). With one pass it is paired_ratio's figure."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    logs = [
        statistics.median(math.log(b / a) for a, b in passes)
        for passes in pairs.values()
        if passes and all(math.isfinite(r) and r > 0 for pair in passes for r in pair)
    ]
    return _over_prompts(logs, confidence, resamples, seed, method) if logs else None


def _over_prompts(logs: Sequence[float], confidence: float, resamples: int, seed: int, method: str) -> PairedRatio:
    """The per-prompt log ratios' figure with the interval `method` names: "t" or "bootstrap"."""
    return t_ratio(logs, confidence) if method == "t" else geometric_ratio(logs, confidence, resamples, seed)


def endpoint_ratio(
    rates_a: Mapping[str, float],
    rates_b: Mapping[str, float],
    *,
    confidence: float = EQUIVALENCE_CONFIDENCE,
    resamples: int = 10_000,
    seed: int = 0,
) -> PairedRatio | None:
    """B's endpoint median over A's, over the prompts both have, with a percentile bootstrap that resamples the
    prompts together on both sides (a median has no t interval); None without a common prompt."""
    import numpy as np

    both = [k for k in rates_a if k in rates_b]
    if not both:
        return None
    a = np.asarray([rates_a[k] for k in both], dtype=float)
    b = np.asarray([rates_b[k] for k in both], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(both), size=(resamples, len(both)))
    ratios = np.median(b[idx], axis=1) / np.median(a[idx], axis=1)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    ratio = float(np.median(b) / np.median(a))
    return PairedRatio(ratio, float(low), float(high), len(both), confidence, resamples)


def pass_pairs(
    rates_a: Mapping[tuple[int, str], float], rates_b: Mapping[tuple[int, str], float]
) -> dict[str, list[tuple[float, float]]]:
    """Per prompt, the (A, B) rates of each (pass, prompt) both starts have, in pass order: interleaved_ratio's
    input."""
    both = [k for k in rates_a if k in rates_b]
    return by_prompt([(rates_a[k], rates_b[k]) for k in both], both)


def prompt_medians(rates: Mapping[tuple[int, str], float]) -> dict[str, float]:
    """Each prompt's median over the passes of (pass, prompt)-keyed rates."""
    return pass_medians(by_prompt(rates.values(), rates.keys()))


def pass_medians(rates: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each prompt's median decode rate over the passes of one start (its endpoint figure's input)."""
    return {k: statistics.median(v) for k, v in rates.items() if v}


def by_prompt(values: Iterable[_T], keys: Iterable[tuple[int, str]]) -> dict[str, list[_T]]:
    """Values keyed by (pass, prompt id), gathered per prompt id in pass order."""
    out: dict[str, list[_T]] = {}
    for (_pass_index, prompt_id), v in zip(keys, values, strict=True):
        out.setdefault(prompt_id, []).append(v)
    return out


def counted_rates(start: Any) -> tuple[dict[tuple[int, str], float], dict[tuple[int, str], str]]:
    """An interleaved start's rates per (pass, prompt) from the measurement that counts for each
    (Evidence.counted), and why one has none: what gate 7, the sweep table and the scripts all read."""
    kept = start.counted()
    return arrival_rates([r for _m, r in kept.values()], keys=list(kept))


def prompt_rates(start: Any) -> dict[str, float]:
    """A start's decode rate per prompt as gate 7 takes it: interleaved, each prompt's median over its counted
    passes; sequential, its one request's. Prompts without a rate are left out."""
    if start.schedule is None:
        return arrival_rates(start.requests)[0]
    rates, _why = counted_rates(start)
    return prompt_medians(rates)


def pass_endpoint(rates: Mapping[tuple[int, str], float]) -> float | None:
    """An interleaved start's endpoint figure: the median over prompts of each prompt's median over passes."""
    per_prompt = prompt_medians(rates)
    return endpoint_median(list(per_prompt.values())) if per_prompt else None


def server_decode_figures(before: str | None, after: str | None) -> tuple[float | None, float | None, float | None]:
    """(mean seconds between engine steps, mean seconds per output token, tokens per second), vLLM's own.

    `inter_token_latency_seconds` is observed once per engine step, not per token: with accepted drafts a
    step carries several tokens, so its inverse is a step rate. The per-token figure is
    `request_time_per_output_token_seconds` (each request's decode time over its output tokens)."""
    step = histogram_mean(before, after, "vllm:inter_token_latency_seconds")
    per_token = histogram_mean(before, after, "vllm:request_time_per_output_token_seconds")
    return step, per_token, (1.0 / per_token if per_token else None)
