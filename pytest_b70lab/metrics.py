"""vLLM's /metrics text, read with prometheus_client's parser: counters, info labels and histograms, the one
place the gates, the throughput figures and the report read it."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=16)
def families(text: str | None) -> tuple:
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
    return any(f.name == name.removesuffix("_total") and any(s.name.endswith("_total") for s in f.samples)
               for f in families(text))


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
