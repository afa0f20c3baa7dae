"""Gate 7 of recorded gates sessions, one row each, and the counts a tolerance is set from: the paired figure, its
interval and half-width (recomputed from the passes), the passes the session served and gate 7's verdict as
judged, then the same recorded passes judged again by the stopping rule at other tolerances (where the rule would
have stopped, and its verdict there). For `b70lab bench --parts reproduction` folders (SESSIONS/NN/) or any run
folders of interleaved starts.

    .venv/bin/python scripts/gate7_sessions.py data/bench/t800-avx2n/sessions/* --tolerances 0.05 0.10

Written here rather than read from promotion.json alone: the replay at another tolerance needs the passes
themselves (evidence/sampling.py's rule on the first k passes), as gate 7 replays them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_b70lab.errors import LabError
from pytest_b70lab.evidence.record import Evidence
from pytest_b70lab.evidence.run_folder import read_starts
from pytest_b70lab.evidence.sampling import SamplingRule, paired_through, stopping_point

GATE_7 = "fresh-start-reproduction"


def replayed(first: Evidence, later: Evidence, served: int, tolerance: float, min_passes: int, max_passes: int) -> str:
    """Where the rule at `tolerance` stops on the session's recorded passes, and its verdict there; 'undecided at
    N' where the session served fewer passes than the rule would have asked for."""
    rule = SamplingRule(min_passes, min(max_passes, served), tolerance)
    passes, _ = stopping_point(first, later, rule)
    paired = paired_through(first, later, passes)
    if paired is not None and paired.inside(tolerance):
        return f"pass after {passes}"
    if paired is not None and (paired.outside(tolerance) or passes >= max_passes):
        return f"FAIL after {passes}"
    return f"undecided after {passes} (served {served})"


def row(folder: Path, tolerances: list[float]) -> tuple[list[str], float, bool | None]:
    """The session's cells, its figures recomputed from the passes (promotion.json gives the verdicts only), its
    interval's half-width, and whether gate 7 passed (None: no verdict recorded)."""
    first, later = read_starts(folder)[:2]
    served = first.schedule.passes if first.schedule else 0
    paired = paired_through(first, later, served)
    if paired is None:
        raise ValueError("no paired figure: not an interleaved session of two starts")
    verdict_file = folder / "promotion.json"
    gate, promotable = None, "no verdict recorded"
    if verdict_file.is_file():
        verdict = json.loads(verdict_file.read_text())
        gate = next(g["outcome"] for g in verdict["gates"] if g["gate"] == GATE_7)
        promotable = "PROMOTABLE" if verdict["promotable"] else "not: " + ", ".join(verdict.get("failed_gates", []))
    half_width = (paired.high - paired.low) / 2 / paired.ratio
    cells = [
        folder.name,
        f"{paired.ratio:.3f}",
        f"[{paired.low:.3f}, {paired.high:.3f}]",
        f"{half_width:.1%}",
        str(served),
        gate or "-",
        promotable,
    ]
    rule = first.schedule.sampling if first.schedule else None  # the session's own stopping rule, as recorded
    if rule is not None:
        cells += [replayed(first, later, served, t, rule.min_passes, rule.max_passes) for t in tolerances]
    return cells, half_width, None if gate is None else gate == "passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--tolerances", nargs="*", type=float, default=[0.05, 0.10])
    args = parser.parse_args(argv)
    rows, passed, judged, widths = [], 0, 0, []
    for folder in (f for f in args.folders if f.is_dir()):
        if not (folder / "start-2").is_dir():
            print(f"{folder.name}: no start-2 (the session did not finish)", file=sys.stderr)
            continue
        try:
            cells, half_width, ok = row(folder, args.tolerances)
        except (LabError, KeyError, ValueError) as e:
            print(f"{folder}: {e}", file=sys.stderr)
            continue
        rows.append(cells)
        passed += bool(ok)
        judged += ok is not None
        widths.append(half_width)
    header = ["session", "paired", "interval", "half-width", "passes", "gate 7", "verdict"]
    header += [f"at T={t:g}" for t in args.tolerances]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    if rows:
        narrow = sum(w <= 0.025 for w in widths)
        print(f"\n{passed} of {judged} passed gate 7 as judged; half-width at most 2.5 % in {narrow} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
