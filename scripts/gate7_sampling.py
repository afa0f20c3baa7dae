"""Gate 7's equivalence rule and its stopping rule, measured on recorded noise: how often identical starts fail, how
often a start slowed by a given fraction passes, and how many passes the rule serves, for a tolerance and a range
of passes; and how well each interval covers with the contract's prompts.

The noise is the recorded one: every (pass, prompt) log ratio start-2 / start-1 of the interleaved run folders
given, each folder's ratios centred on their median (so that what is left is measurement noise, not the folder's
own shift). A simulated session draws, per prompt and pass, one value from that pool plus log(true ratio) and
applies evidence/sampling.py's rule to its first k passes, exactly as a session and gate 7 do. Looking after
every pass and stopping when the interval first fits is what inflates the error rates above a single look's:
that is what this measures.

    .venv/bin/python scripts/gate7_sampling.py --tolerance 0.05 --passes 3 --max-passes 12 data/bench/p12/sessions/*
    .venv/bin/python scripts/gate7_sampling.py --passes 3 --max-passes 8 --half-width 0.025 SESSIONS
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from pytest_b70lab.evidence import throughput
from pytest_b70lab.evidence.run_folder import read_starts
from pytest_b70lab.evidence.sampling import SamplingRule


def pass_log_ratios(run: Path) -> tuple[list[float], int, float]:
    """One folder's (pass, prompt) log ratios, centred on their median, its number of prompts, and the median
    itself (the session's own shift: identical starts that still differ)."""
    starts = read_starts(run)
    if len(starts) < 2 or any(s.schedule is None for s in starts[:2]):
        raise SystemExit(f"{run}: not two interleaved starts")
    rates = [throughput.counted_rates(s)[0] for s in starts[:2]]
    logs = [math.log(rates[1][k] / rates[0][k]) for k in rates[0] if k in rates[1]]
    centre = statistics.median(logs)
    return [x - centre for x in logs], len({k[1] for k in rates[0]}), centre


def session(
    rng: np.random.Generator,
    pool: np.ndarray,
    prompts: int,
    shift: float,
    rule: SamplingRule,
    shifts: np.ndarray,
    bonferroni: bool = False,
) -> tuple[bool, int]:
    """(passes gate 7, passes served) of one simulated session under the stopping rule; `shifts`: the sessions'
    own shifts to draw one from (empty: none)."""
    own = float(rng.choice(shifts)) if len(shifts) else 0.0
    # The gate's interval is the 90 % one; `bonferroni` divides its 5 % tails among the looks, for comparison.
    looks = rule.max_passes - rule.min_passes + 1
    confidence = 1 - 2 * (1 - throughput.EQUIVALENCE_CONFIDENCE) / 2 / looks if bonferroni else 0.90
    draws = rng.choice(pool, size=(prompts, rule.max_passes)) + shift + own
    for k in range(rule.min_passes, rule.max_passes + 1):
        logs = np.median(draws[:, :k], axis=1)
        figure = throughput.t_ratio(logs.tolist(), confidence)
        if rule.decide(figure, k) is not None:
            return figure.inside(rule.tolerance), k
    raise AssertionError("the rule stops at max_passes")


def coverage(rng: np.random.Generator, pool: np.ndarray, prompts: int, passes: int, n: int) -> tuple[float, float]:
    """How often the t and the percentile-bootstrap 90 % intervals hold the true ratio 1, at a fixed pass count."""
    t_hits = boot_hits = 0
    for _ in range(n):
        logs = np.median(rng.choice(pool, size=(prompts, passes)), axis=1).tolist()
        t = throughput.t_ratio(logs, 0.90)
        b = throughput.geometric_ratio(logs, 0.90, 2000, int(rng.integers(1 << 30)))
        t_hits += t.low <= 1 <= t.high
        boot_hits += b.low <= 1 <= b.high
    return t_hits / n, boot_hits / n


def half_widths(rng: np.random.Generator, pool: np.ndarray, prompts: int, passes: int, n: int) -> np.ndarray:
    """The gate's 90 % interval's half-width, relative to its figure ((high - low) / 2 / figure), of `n` simulated
    identical sessions at a fixed pass count."""
    found = []
    for _ in range(n):
        figure = throughput.t_ratio(np.median(rng.choice(pool, size=(prompts, passes)), axis=1).tolist(), 0.90)
        found.append((figure.high - figure.low) / 2 / figure.ratio)
    return np.asarray(found)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="interleaved run folders (every pass is noise)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--passes", type=int, default=3, help="the minimum")
    ap.add_argument("--max-passes", type=int, default=12)
    ap.add_argument("--sessions", type=int, default=2000, help="simulated sessions per row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--half-width",
        type=float,
        default=None,
        metavar="W",
        help="also: at each pass count, how often an identical session's interval is at most +/- W",
    )
    a = ap.parse_args(argv)
    pool: list[float] = []
    prompts = set()
    centres = []
    for run in a.runs:
        logs, n, centre = pass_log_ratios(run)
        pool += logs
        prompts.add(n)
        centres.append(centre)
    if len(prompts) != 1:
        print(f"the folders have different prompt counts: {sorted(prompts)}", file=sys.stderr)
        return 2
    (n_prompts,) = prompts
    noise = np.asarray(pool)
    rng = np.random.default_rng(a.seed)
    mad = 1.4826 * float(np.median(np.abs(noise)))
    print(
        f"noise: {len(pool)} (pass, prompt) log ratios from {len(a.runs)} sessions, {n_prompts} prompts; sd "
        f"{noise.std(ddof=1):.3f}, robust sd (1.4826 MAD) {mad:.3f}"
    )
    for passes in sorted({a.passes, (a.passes + a.max_passes) // 2, a.max_passes}):
        t_cov, boot_cov = coverage(rng, noise, n_prompts, passes, min(a.sessions, 1000))
        print(f"coverage of the 90 % interval at {passes} passes: t {t_cov:.3f}, percentile bootstrap {boot_cov:.3f}")
    if a.half_width is not None:
        print(f"\n| passes | median half-width | sessions at most +/- {a.half_width * 100:g} % |\n|---|---|---|")
        for passes in range(a.passes, a.max_passes + 1):
            widths = half_widths(rng, noise, n_prompts, passes, min(a.sessions, 4000))
            print(f"| {passes} | {np.median(widths) * 100:.2f} % | {np.mean(widths <= a.half_width):.2f} |")
    shifts = np.asarray(centres) - float(np.median(centres))
    print(
        f"the sessions' own shifts (each one's median log ratio, centred): {', '.join(f'{x:+.3f}' for x in shifts)};"
        " each row is simulated with noise only, and with one of these shifts drawn per session"
    )
    print(f"\nT = {a.tolerance:g}; rows: true start-2 / start-1 ratio")
    print("| true ratio | rule | passes gate 7: noise only | with the shifts | passes served (median, mean, max) |")
    print("|---|---|---|---|---|")
    rules = [
        (
            f"{a.passes} to {a.max_passes}, stop when decided (gate 7)",
            SamplingRule(a.passes, a.max_passes, a.tolerance),
            False,
        ),
        (
            f"{a.passes} to {a.max_passes}, stop when decided, Bonferroni over the looks",
            SamplingRule(a.passes, a.max_passes, a.tolerance),
            True,
        ),
        (f"fixed {a.max_passes}", SamplingRule(a.max_passes, a.max_passes, a.tolerance), False),
    ]
    none = np.array([])
    for ratio in (1.0, 1 - a.tolerance / 2, 1 - a.tolerance, 1 - 2 * a.tolerance):
        for name, rule, corrected in rules:
            plain = [session(rng, noise, n_prompts, math.log(ratio), rule, none, corrected) for _ in range(a.sessions)]
            shifted = [
                session(rng, noise, n_prompts, math.log(ratio), rule, shifts, corrected) for _ in range(a.sessions)
            ]
            served = [k for _ok, k in plain]
            print(
                f"| {ratio:.3f} | {name} | {sum(ok for ok, _k in plain) / len(plain):.3f} | "
                f"{sum(ok for ok, _k in shifted) / len(shifted):.3f} | {statistics.median(served):g}, "
                f"{statistics.fmean(served):.1f}, {max(served)} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
