"""`b70lab report`: a run folder as one page."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    report_p = sub.add_parser(
        "report",
        help="a run folder as one self-contained HTML page: verdict, gate matrix, "
        "decode rates, token arrival, draft acceptance, quality",
    )
    report_p.add_argument("run_dir", type=Path, help="a run folder (start-N/evidence.json, promotion.json)")
    report_p.add_argument("--out", type=Path, default=None, help="the page to write (default: RUN_DIR/report.html)")
    report_p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from .. import report

    print(report.write(args.run_dir, args.out))
    return 0
