"""`b70lab history`: a decode figure over many runs, per contract and host class, with its change points."""

from __future__ import annotations

import argparse
from pathlib import Path

# Where a lab keeps its runs and seals, relative to the repository: the sources when --from is not given.
DEFAULT_SOURCES = ("data/runs", "repro")


def add(sub: argparse._SubParsersAction) -> None:
    history_p = sub.add_parser(
        "history",
        help="each contract's decode figure over the runs, seals, sweeps and benches found (one series per host "
        "class), with the change points where its level moved",
    )
    history_p.add_argument("contract", nargs="?", default=None, help="only this contract's series (by name)")
    history_p.add_argument(
        "--from",
        dest="sources",
        metavar="DIR",
        type=Path,
        action="append",
        default=None,
        help="a folder to search for run folders (start-N/evidence.json), repeatable "
        f"(default: {' and '.join(DEFAULT_SOURCES)} where they exist)",
    )
    history_p.add_argument("--html", type=Path, default=None, metavar="PAGE", help="also draw the series on this page")
    history_p.set_defaults(func=_history)


def _history(args: argparse.Namespace) -> int:
    from ..contract import project
    from ..records import history

    sources = args.sources
    if sources is None:
        sources = [p for p in (project.find(s) for s in DEFAULT_SOURCES) if p.is_dir()]
        if not sources:
            raise history.HistoryError(
                f"no {' or '.join(DEFAULT_SOURCES)} folder here: name the folders to search with --from"
            )
    series, skipped = history.build(sources, args.contract)
    if not series:
        what = f"of contract {args.contract} " if args.contract else ""
        raise history.HistoryError(
            f"no run folder {what}with a figure under {', '.join(map(str, sources))}"
            + (f" ({len(skipped)} without one: {skipped[0]})" if skipped else "")
        )
    for s in series:
        print(f"{s.contract} on {s.host_class}: {len(s.points)} points")
        for i, p in enumerate(s.points, 1):
            print(
                f"  {i:>3}  {p.when[:19]}  {history.short(p.commit):<16}  {p.figure:8.2f} tok/s "
                f"[{p.low:.2f}, {p.high:.2f}]  {p.kind:<4}  {p.where}"
            )
        for c in s.changes:
            print(f"  change: {s.change_line(c)}")
        if not s.changes:
            print("  no change point")
    for line in skipped:
        print(f"no point: {line}")
    if args.html is not None:
        from ..report import history as page

        print(page.write(series, skipped, args.html))
    return 0
