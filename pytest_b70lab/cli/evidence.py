"""`b70lab evidence`: saved run folders, shown and compared with no engine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    evidence_p = sub.add_parser("evidence", help="saved run folders, read with no engine")
    evidence_sub = evidence_p.add_subparsers(dest="evidence_command", required=True)
    ev_show_p = evidence_sub.add_parser(
        "show", help="what a run folder holds: contract, models, engine, flags, each start, the recorded verdict"
    )
    ev_show_p.add_argument("run_dir", type=Path, help="a run folder (start-N/evidence.json, promotion.json)")
    ev_show_p.set_defaults(func=_evidence_show)
    diff_p = evidence_sub.add_parser(
        "diff",
        help="did B change speed and nothing else? Contract, flags, "
        "environment, models, versions, tokens per prompt, and the "
        "speed ratio B/A with a bootstrap interval. Exit 0 when only "
        "the speed changed, 1 when anything else did",
    )
    diff_p.add_argument("run_a", type=Path, help="the baseline run folder, or a sealed record (its name or folder)")
    diff_p.add_argument("run_b", type=Path, help="the run folder (or sealed record) compared with it")
    diff_p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    diff_p.set_defaults(func=_evidence_diff)


def _evidence_show(args: argparse.Namespace) -> int:
    from ..judge import compare

    print(compare.show(compare.load_run(args.run_dir)))
    return 0


def _evidence_diff(args: argparse.Namespace) -> int:
    """Exit 0 when only the speed changed (or nothing), 1 when anything else did: usable from a script."""
    from ..judge import compare
    from ..records import store

    run_a, run_b = store.run_or_seal(args.run_a), store.run_or_seal(args.run_b)
    c = compare.compare_runs(compare.load_run(run_a), compare.load_run(run_b))
    print(json.dumps(c.to_dict(), indent=1, sort_keys=True) if args.json else compare.format_comparison(c))
    return 0 if c.only_speed_changed else 1
