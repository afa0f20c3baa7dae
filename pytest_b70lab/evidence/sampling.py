"""The stopping rule of an interleaved session under the equivalence rule: after the contract's minimum of passes,
one more pass while the paired figure's interval is neither inside [1 - T, 1 + T] nor wholly outside it, up to the
maximum. The session applies it as it measures; gate 7 applies it again to the recorded passes and refuses a
session that stopped elsewhere, so the recorded count is never taken on trust.

Stopping when the interval first fits is sequential testing: it looks once per pass from the minimum on, and each
look is another chance to call a slower start equivalent. The interval stays the 90 % one (no correction for the
looks): on the embedded default's recorded noise, T = 0.10 and 3 to 8 passes, identical starts pass 99.5 % and a
start 10 % slower passes 17 % (5 % with a fixed 8 passes), a start 20 % slower never; dividing the 5 % among the
looks (Bonferroni) would hold the 10 % case to 3 % but fail 12 % of identical sessions, which a CI run cannot
afford (notes/2026-12-05-gate-7-equivalence.md; scripts/gate7_sampling.py measures both)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import throughput


@dataclass(frozen=True)
class SamplingRule:
    min_passes: int
    max_passes: int
    tolerance: float

    @classmethod
    def of(cls, reproduction: Any) -> SamplingRule | None:
        """The contract's rule (its `reproduction` table); None where it asks for a fixed number of passes."""
        if reproduction.max_passes is None:
            return None
        return cls(reproduction.passes, reproduction.max_passes, reproduction.paired)

    def decide(self, paired: throughput.PairedRatio | None, passes: int) -> str | None:
        """Why a session stops after `passes` passes with this paired figure; None: it serves another pass."""
        if passes < self.min_passes:
            return None
        band = f"1 +/- {self.tolerance:g}"
        if paired is not None and paired.inside(self.tolerance):
            return f"after pass {passes} the paired interval {paired.line()} lies inside {band}"
        if paired is not None and paired.outside(self.tolerance):
            return f"after pass {passes} the paired interval {paired.line()} lies wholly outside {band}"
        if passes >= self.max_passes:
            figure = paired.line() if paired is not None else "none"
            return f"the maximum of {self.max_passes} passes was served; the paired interval is {figure}"
        return None


def paired_through(first: Any, later: Any, passes: int) -> throughput.PairedRatio | None:
    """The equivalence rule's paired figure of `later` against `first` from their counted measurements of passes
    1..`passes` (two Evidence records, being filled or recorded)."""
    a, b = ({k: v for k, v in throughput.counted_rates(s)[0].items() if k[0] <= passes} for s in (first, later))
    pairs = throughput.pass_pairs(a, b)
    return throughput.interleaved_ratio(pairs, confidence=throughput.EQUIVALENCE_CONFIDENCE, method="t")


def stopping_point(first: Any, later: Any, rule: SamplingRule) -> tuple[int, str]:
    """Where the rule stops on these two recorded starts, and why: what the session should have done."""
    for passes in range(rule.min_passes, rule.max_passes + 1):
        if (why := rule.decide(paired_through(first, later, passes), passes)) is not None:
            return passes, why
    raise AssertionError("SamplingRule.decide stops at max_passes at the latest")
