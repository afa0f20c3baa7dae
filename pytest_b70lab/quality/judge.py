"""Judging one quality figure against its baseline: paired pass/fail per sample, an exact binomial test.

Candidate and baseline answered the same prompts, so the comparison is paired (McNemar's exact test): only
the samples where they disagree carry information. With `lost` samples the baseline passed and the
candidate failed, and `gained` the other way round, a candidate that is no worse loses each disagreement
with probability 1/2; the figure regressed when P(X >= lost | lost + gained, 1/2) < alpha. The bound is
sized by the sample count by construction: at alpha 0.05 it takes at least 5 net lost samples, whatever
the set's size, and one or two flips at an exact tie never fail a run. A figure with answers missing on
either side fails closed: partial evidence is never judged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .samples import QualitySample

Key = tuple[str, str]  # (sample id, variant)


def figure_of(sample: QualitySample, variant: str) -> str:
    if sample.family == "structured":
        return f"structured/{variant}"
    if sample.family == "long_context":
        return f"long_context/{sample.position}"
    return sample.family


def keys_by_figure(samples: Iterable[QualitySample]) -> dict[str, list[Key]]:
    out: dict[str, list[Key]] = {}
    for s in samples:
        for v in s.variants:
            out.setdefault(figure_of(s, v), []).append((s.id, v))
    return dict(sorted(out.items()))


def key_text(key: Key) -> str:
    return f"{key[0]} ({key[1]})" if key[1] else key[0]


def one_sided_p(lost: int, gained: int) -> float:
    """P(X >= lost) for X ~ Binomial(lost + gained, 1/2): exact, small n (math.comb is enough; no scipy)."""
    n = lost + gained
    if lost == 0:
        return 1.0
    outcomes: int = 2**n
    return sum(math.comb(n, k) for k in range(lost, n + 1)) / outcomes


@dataclass
class FigureVerdict:
    figure: str
    passed: bool
    candidate_passed: int
    baseline_passed: int
    of: int
    lost: list[str] = field(default_factory=list)
    gained: list[str] = field(default_factory=list)
    p_value: float | None = None
    alpha: float | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def figure_text(self) -> str:
        return f"{self.candidate_passed}/{self.of} vs baseline {self.baseline_passed}/{self.of}"

    @property
    def observed(self) -> dict[str, Any]:
        return {
            "quality_figure": self.figure,
            "candidate_passed": self.candidate_passed,
            "baseline_passed": self.baseline_passed,
            "samples": self.of,
            "lost": len(self.lost),
            "gained": len(self.gained),
            "p_value": None if self.p_value is None else round(self.p_value, 6),
            "alpha": self.alpha,
        }

    def explain(self) -> str:
        head = f"quality {self.figure}: {self.figure_text}"
        return "\n".join([head, *(f"  {r}" for r in self.reasons)])


def judge(
    figure: str, keys: list[Key], candidate: dict[Key, Any], baseline: dict[Key, bool], alpha: float, where: str = ""
) -> FigureVerdict:
    """`candidate` maps a key to its Score (checks.Score), `baseline` to whether the baseline passed it."""
    missing_c = [k for k in keys if k not in candidate]
    missing_b = [k for k in keys if k not in baseline]
    c_pass = sum(1 for k in keys if k in candidate and candidate[k].passed)
    b_pass = sum(1 for k in keys if baseline.get(k))
    verdict = FigureVerdict(figure, False, c_pass, b_pass, len(keys), alpha=alpha)
    if not keys:
        verdict.reasons.append("the quality prompt set has no sample of this figure")
        return verdict
    if missing_c:
        verdict.reasons.append(
            f"{len(missing_c)} of {len(keys)} samples have no answer in the evidence "
            f"(first: {key_text(missing_c[0])}){where}: partial evidence is not judged"
        )
    if missing_b:
        verdict.reasons.append(
            f"{len(missing_b)} of {len(keys)} samples are not in the baseline (first: "
            f"{key_text(missing_b[0])}): the baseline is stale; re-record it with "
            f"`pytest -m quality --snapshot-update`"
        )
    if missing_c or missing_b:
        return verdict
    verdict.lost = [key_text(k) for k in keys if baseline[k] and not candidate[k].passed]
    verdict.gained = [key_text(k) for k in keys if not baseline[k] and candidate[k].passed]
    verdict.p_value = one_sided_p(len(verdict.lost), len(verdict.gained))
    verdict.passed = verdict.p_value >= alpha
    if not verdict.passed:
        first = next(k for k in keys if baseline[k] and not candidate[k].passed)
        verdict.reasons.append(
            f"{len(verdict.lost)} samples the baseline passed now fail, {len(verdict.gained)} the other way: "
            f"exact binomial p = {verdict.p_value:.4f} < alpha {alpha}{where}"
        )
        verdict.reasons.append(f"first lost: {key_text(first)}: {candidate[first].detail}")
        verdict.reasons.append("lost: " + ", ".join(verdict.lost[:12]) + (" ..." if len(verdict.lost) > 12 else ""))
    return verdict
