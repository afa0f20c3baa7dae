"""Does a difference between two fresh starts persist across passes (a property of the start) or not (noise)?

For every interleaved run folder given: each pass's figure start-2 / start-1 (the median over prompts of
the within-pass ratio), and the session's figure over all passes. Then a one-way analysis of variance of the
per-pass log figures with sessions as groups: if starts differ by something of their own, the sessions' means
spread more than the passes within a session predict (F well above 1); if not, F stays near 1.

    .venv/bin/python scripts/start_persistence.py data/bench/<bench>/sessions/* [...]
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from pytest_b70lab.evidence import throughput
from pytest_b70lab.evidence.run_folder import read_starts


def pass_logs(run: Path) -> list[float] | None:
    """Per pass, the median over prompts of log(start-2 rate / start-1 rate) within that pass: a median, so that
    one request stalled for a second (seen about once in 150 requests) moves one prompt, not the pass."""
    starts = read_starts(run)
    if len(starts) < 2 or any(s.schedule is None for s in starts[:2]):
        return None
    rates = [throughput.counted_rates(s)[0] for s in starts[:2]]
    by_pass: dict[int, list[float]] = {}
    for key, a in rates[0].items():
        if key in rates[1]:
            by_pass.setdefault(key[0], []).append(math.log(rates[1][key] / a))
    return [statistics.median(v) for _p, v in sorted(by_pass.items())]


def main(runs: list[str]) -> int:
    groups: list[list[float]] = []
    for run in runs:
        path = Path(run)
        if not path.is_dir():
            continue
        try:
            logs = pass_logs(path)
        except Exception as e:  # a folder that is not a run folder (a log, a failed session): say so, go on
            print(f"{run}: skipped ({e.__class__.__name__}: {str(e)[:120]})", file=sys.stderr)
            continue
        if not logs:
            continue
        groups.append(logs)
        figures = ", ".join(f"{math.exp(v):.3f}" for v in logs)
        print(f"{run}: per pass {figures}; session {math.exp(statistics.fmean(logs)):.3f}")
    if len(groups) < 2 or any(len(g) < 2 for g in groups):
        print("need two or more interleaved sessions of two or more passes", file=sys.stderr)
        return 2
    every = [v for g in groups for v in g]
    grand = statistics.fmean(every)
    within = sum((v - statistics.fmean(g)) ** 2 for g in groups for v in g) / (len(every) - len(groups))
    between = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in groups) / (len(groups) - 1)
    passes = statistics.fmean(len(g) for g in groups)
    start_sd = math.sqrt(max(0.0, (between - within) / passes))
    print(
        f"{len(groups)} sessions, {len(every)} passes: within-session sd of a pass's log figure "
        f"{math.sqrt(within):.4f}, between-session mean square {between:.6f} vs within {within:.6f}: "
        f"F = {between / within:.2f} ({len(groups) - 1}, {len(every) - len(groups)} degrees of freedom); "
        f"a start's own share, as a standard deviation of its figure: {start_sd:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
