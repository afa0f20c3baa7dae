"""Gate 7's interleaved figure of each run folder recomputed from its first k passes only, k = 1 .. passes: how
the figure settles as passes are added (a six-pass session's first three passes are a three-pass session).

    .venv/bin/python scripts/interleaved_passes.py data/runs/<run> [...]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from pytest_b70lab.evidence import throughput
from pytest_b70lab.evidence.run_folder import read_starts


def main(runs: list[str]) -> int:
    for run in runs:
        starts = read_starts(Path(run))
        if len(starts) < 2 or any(s.schedule is None for s in starts[:2]):
            print(f"{run}: not two interleaved starts", file=sys.stderr)
            return 2
        counted = [s.counted() for s in starts[:2]]
        rates = [
            {k: throughput.decode_rate(r.chunk_times, r.chunk_tokens) for k, (_m, r) in c.items()} for c in counted
        ]
        figures = []
        for k in range(1, starts[0].schedule.passes + 1):
            pairs: dict[str, list[tuple[float, float]]] = {}
            for key, a in rates[0].items():
                if key[0] <= k and key in rates[1]:
                    pairs.setdefault(key[1], []).append((a, rates[1][key]))
            paired = throughput.interleaved_ratio(pairs)
            medians = [statistics.median(statistics.median(p[i] for p in v) for v in pairs.values()) for i in (0, 1)]
            figures.append(
                f"k={k}: {paired.line() if paired else 'none'}, endpoint ratio {medians[1] / medians[0]:.3f}"
            )
        print(run, "\n  " + "\n  ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
