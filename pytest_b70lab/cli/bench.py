"""`b70lab bench`: run the benches of bench/ and print their table."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    from ..bench import BUNDLE, DEFAULT_PARTS, PARTS  # stdlib-only module: cheap
    from ..contract.defaults import DEFAULT_CONTRACT

    bench_p = sub.add_parser(
        "bench",
        help="what the harness costs and whether its decode figure agrees with the "
        "server and `vllm bench serve` (a table of ratios; never a test)",
    )
    bench_p.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma list of {', '.join(PARTS)} (default: all but reproduction and "
        f"steadiness, which run --sessions sessions each)",
    )
    bench_p.add_argument(
        "--sessions",
        type=int,
        default=10,
        help="gates sessions of the reproduction part, starts of the steadiness part (default 10)",
    )
    bench_p.add_argument(
        "--gap-s",
        type=float,
        default=50.0,
        help="steadiness part: seconds between a start's two passes (default 50, about a restart)",
    )
    bench_p.add_argument(
        "--compile-cache",
        choices=("warm", "empty"),
        default="warm",
        help="reproduction part: keep vLLM's compile cache (both starts load) or empty it before "
        "each session (start-1 compiles, start-2 loads)",
    )
    bench_p.add_argument(
        "--schedule",
        choices=("contract", "sequential", "interleaved", "both"),
        default="contract",
        help="reproduction part: the contract's reproduction schedule, or this one instead (both: a session of "
        "each per round, alternating which goes first; one table row pair per schedule)",
    )
    bench_p.add_argument("--contract", default=DEFAULT_CONTRACT, help="contract for the engine parts")
    bench_p.add_argument(
        "--replay",
        type=Path,
        default=BUNDLE,
        help="run folder the replay part times (default: the recorded evidence bundle)",
    )
    bench_p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: data/bench/harness-<time>); keep it short: vLLM's IPC socket paths live below it",
    )
    bench_p.add_argument("--cache-dir", type=Path, default=None)
    bench_p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from .. import bench, mini
    from ..bench.figures import table as bench_table

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := [p for p in parts if p not in bench.PARTS]:
        print(f"b70lab: unknown bench part(s) {', '.join(unknown)} (parts: {', '.join(bench.PARTS)})", file=sys.stderr)
        return 2
    out = args.out or Path("data") / "bench" / f"harness-{time.strftime('%Y%m%d-%H%M%S')}"
    figures = bench.run(
        parts,
        args.contract,
        (args.cache_dir or mini.default_cache_root()).resolve(),
        out.resolve(),
        args.replay.resolve(),
        say=lambda m: print(m, file=sys.stderr, flush=True),
        sessions=args.sessions,
        compile_cache=args.compile_cache,
        gap_s=args.gap_s,
        schedule=args.schedule,
    )
    print(bench_table(figures))
    print(f"\nwritten: {out / 'bench.json'}", file=sys.stderr)
    return 0
