"""vLLM's /metrics text, read with prometheus_client's parser: counters, info labels and histograms, the one
place the gates, the throughput figures and the report read it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
CACHE_CONFIG = "vllm:cache_config_info"


@functools.lru_cache(maxsize=16)
def families(text: str | None) -> tuple[Metric, ...]:
    """One parse per /metrics text: every per-prompt and per-start gate reads the same two texts of a start."""
    from prometheus_client.parser import text_string_to_metric_families

    return tuple(text_string_to_metric_families(text or ""))


def info_labels(text: str | None, name: str) -> dict[str, str] | None:
    for family in families(text):
        for sample in family.samples:
            if sample.name in (name, name.removesuffix("_info")) or family.name in (name, name.removesuffix("_info")):
                return dict(sample.labels)
    return None


def has_counter(text: str | None, name: str) -> bool:
    """Whether /metrics carries the counter at all (an absent counter is not a zero one)."""
    return any(
        f.name == name.removesuffix("_total") and any(s.name.endswith("_total") for s in f.samples)
        for f in families(text)
    )


def counter_total(text: str | None, name: str, **labels: str) -> float:
    """Sum of a counter's samples (its `_total` series) whose labels include `labels`."""
    total = 0.0
    for family in families(text):
        if family.name != name.removesuffix("_total"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def counter_by_label(text: str | None, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in families(text):
        if family.name != name.removesuffix("_total"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and label in sample.labels:
                out[sample.labels[label]] = out.get(sample.labels[label], 0.0) + sample.value
    return out


def histogram_mean(before: str | None, after: str | None, name: str) -> float | None:
    """Mean of what a vLLM histogram observed between two /metrics texts (sum and count deltas)."""

    def totals(text: str | None) -> tuple[float, float]:
        s = c = 0.0
        for family in families(text):
            if family.name == name:
                for sample in family.samples:
                    if sample.name.endswith("_sum"):
                        s += sample.value
                    elif sample.name.endswith("_count"):
                        c += sample.value
        return s, c

    (s0, c0), (s1, c1) = totals(before), totals(after)
    return (s1 - s0) / (c1 - c0) if c1 - c0 > 0 else None


@dataclass(frozen=True)
class Acceptance:
    """Speculative acceptance over one start: drafts proposed, and tokens accepted at each draft position."""

    drafts: float
    accepted: dict[int, float]

    @property
    def rates(self) -> dict[int, float]:
        return {pos: n / self.drafts for pos, n in self.accepted.items()}


def acceptance(before: str | None, after: str | None) -> Acceptance | str:
    """Accepted tokens per draft position over the run (counter deltas of two /metrics texts), or why it
    cannot be told."""
    for when, text in (("before", before), ("after", after)):
        for name in (DRAFTS, ACCEPTED_PER_POS):
            if not has_counter(text, name):
                return f"/metrics {when} the prompts has no {name}"
    drafts = counter_total(after, DRAFTS) - counter_total(before, DRAFTS)
    if drafts <= 0:
        return "no drafts were proposed during the run"
    first = counter_by_label(before, ACCEPTED_PER_POS, "position")
    last = counter_by_label(after, ACCEPTED_PER_POS, "position")
    positions = sorted((p for p in last if p.isdigit()), key=int)
    return Acceptance(drafts, {int(p): last[p] - first.get(p, 0.0) for p in positions})


@dataclass(frozen=True)
class KvCapacity:
    """The KV cache the engine allocated, as vLLM's cache_config_info reports it (never computed here: the
    point of reporting it is to see what the engine did with the space)."""

    blocks: int
    tokens: int | None
    block_size: int | None
    memory_bytes: int | None
    cache_dtype: str | None


def kv_capacity(text: str | None) -> KvCapacity | str:
    """From one /metrics text: blocks (num_gpu_blocks, the device's blocks whatever the device), tokens
    (kv_cache_size_tokens), or why they cannot be told."""
    labels = info_labels(text, CACHE_CONFIG)
    if labels is None:
        return f"/metrics has no {CACHE_CONFIG}"

    def number(key: str) -> int | None:
        value = labels.get(key)
        return int(value) if value is not None and value.isdigit() else None

    if (blocks := number("num_gpu_blocks")) is None:
        return f"{CACHE_CONFIG} has no block count (num_gpu_blocks={labels.get('num_gpu_blocks')!r})"
    return KvCapacity(
        blocks,
        number("kv_cache_size_tokens"),
        number("block_size"),
        number("kv_cache_memory_bytes"),
        labels.get("cache_dtype"),
    )
