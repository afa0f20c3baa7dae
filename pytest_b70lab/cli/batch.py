"""`b70lab gates --fleet ADDRESS`: a batch of gate sessions over a fleet's boxes, one session per box at a time
(docs/fleet.md). On one machine, a gates session is `pytest -m gates`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    gates_p = sub.add_parser(
        "gates",
        help="a batch of gate sessions over a fleet on Ray: each --contract one session on one box, its run folder "
        "brought back and judged here; DIR/gates-batch.json and gates-batch-junit.xml",
    )
    gates_p.add_argument(
        "--contract",
        action="append",
        default=None,
        metavar="NAME",
        help="a contract (name or TOML path): one gates session each; repeat for a batch (the same one twice: two "
        "sessions)",
    )
    gates_p.add_argument("--fleet", default=None, metavar="ADDRESS", help="the Ray cluster's head (host:port)")
    gates_p.add_argument("--out", type=Path, default=None, help="a new folder for the batch; required")
    gates_p.add_argument(
        "--host-class",
        default=None,
        metavar="KEY",
        help="run only on boxes labelled with this host class (`b70lab fleet labels` prints a box's)",
    )
    gates_p.add_argument(
        "--pytest-args",
        default="",
        metavar="ARGS",
        help="more arguments for each box's `pytest -m gates` (one string, shell-quoted), e.g. '--b70-no-probe'",
    )
    gates_p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the interrupted batch in DIR (DIR/batch.json): finished sessions are kept, the others run "
        "again whole; nothing else is given",
    )
    gates_p.set_defaults(func=_gates)


def _gates(args: argparse.Namespace) -> int:
    """Exit 0 when every session came back PROMOTABLE, 1 when one did not (a gate failed, or it did not come back
    or could not be judged), 130 when interrupted, 2 for a usage problem."""
    from ..contract import project
    from ..contract import schema as contract_mod
    from ..errors import LabError
    from ..fleet import batch

    def say(msg: str) -> None:
        print(f"b70lab: {msg}", file=sys.stderr, flush=True)

    if args.resume is not None:
        given = [k for k in ("contract", "fleet", "out", "host_class") if getattr(args, k)]
        if given or args.pytest_args:
            raise LabError(
                f"--resume takes the batch's arguments from {args.resume / batch.BATCH_JSON}: leave out "
                + ", ".join("--" + k.replace("_", "-") for k in given or ["pytest-args"])
            )
        out = args.resume.resolve()
        record, sessions, contracts = batch.read_plan(out)
        address, host_class, lab_dir = record["fleet"], record.get("host_class"), Path(record["lab_dir"])
        pytest_args = list(record.get("pytest_args") or [])
    else:
        if not args.contract or args.out is None or not args.fleet:
            raise LabError(
                "b70lab gates needs --fleet ADDRESS, --out DIR and at least one --contract (or --resume DIR); on one "
                "machine a gates session is `pytest -m gates --b70-contract NAME`"
            )
        out, address, host_class = args.out.resolve(), args.fleet, args.host_class
        contracts = [contract_mod.load(c) for c in args.contract]
        sessions = batch.plan(contracts)
        lab_dir, pytest_args = project.bases()[0], shlex.split(args.pytest_args)
        from ..fleet import driver

        driver.reachable(address)  # before anything is written: a wrong address leaves no folder behind
        asked = {"fleet": address, "host_class": host_class, "lab_dir": str(lab_dir), "pytest_args": pytest_args}
        batch.prepare(out, contracts, sessions, asked)
    by_name = dict(zip([s.name for s in sessions], contracts, strict=True))
    say(f"gates batch: {len(sessions)} sessions on {address} into {out}")
    try:
        _, problems = batch.run(
            out,
            address,
            sessions,
            lambda s: batch.session_work(s, by_name[s.name], lab_dir, pytest_args),
            say,
            host_class=host_class,
        )
    except KeyboardInterrupt:
        print(
            f"b70lab: gates batch interrupted; finished sessions are under {out / batch.SESSIONS_DIR} and every "
            f"attempt in {out / 'fleet.json'}; continue with: b70lab gates --resume {out}",
            file=sys.stderr,
        )
        return 130
    rows = batch.judge(out, sessions, project.find("tests/gates") / "__snapshots__", say)
    written = batch.write(out, address, rows, problems)
    print(batch.format_rows(rows))
    print(f"written: {written}, {out / batch.JUNIT}, {out / 'fleet.json'}")
    for problem in problems:
        print(f"b70lab: batch problem: {problem}", file=sys.stderr)
    return 0 if rows and all(r.verdict == "pass" for r in rows) and not problems else 1
