"""`b70lab sweep`: the lab's optimisation loop, one command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# variants.NAMED, spelled here so that `b70lab --help` loads no contract machinery (a test holds them equal).
NAMED_VARIANTS = ("target-only", "unquantized-kv")


def add(sub: argparse._SubParsersAction) -> None:
    sweep_p = sub.add_parser(
        "sweep",
        help="the optimisation loop: variants of a contract, fresh starts interleaved "
        "across them (A B C, C B A, ...), each variant gated by a replay; "
        "DIR/sweep.json, sweep.html, sweep-junit.xml",
    )
    sweep_p.add_argument("--contract", default=None, help="the base contract (name or TOML path); required")
    sweep_p.add_argument(
        "--vary",
        action="append",
        metavar="FIELD=V1,V2",
        help="a dotted contract field and its values (repeat for a grid)",
    )
    sweep_p.add_argument(
        "--named", default=None, metavar="NAMES", help=f"named variants to add: {', '.join(NAMED_VARIANTS)}"
    )
    sweep_p.add_argument(
        "--rounds",
        type=int,
        default=None,
        metavar="R",
        help="fresh starts per variant (default: the contract's fresh_starts; fewer leave every verdict incomplete)",
    )
    sweep_p.add_argument("--out", type=Path, default=None, help="a new folder for the sweep; required")
    sweep_p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the interrupted sweep in DIR with what it was asked for (DIR/plan.json): every start that "
        "ended is kept, every start cut off is discarded and run again, in the plan's order; nothing else is given",
    )
    sweep_p.add_argument(
        "--prompts",
        default=None,
        metavar="ID,ID",
        help="serve only these prompts (a smoke: every verdict is incomplete)",
    )
    sweep_p.add_argument(
        "--schedule",
        choices=("contract", "sequential", "interleaved"),
        default=None,
        help="contract (the default): the base contract's reproduction schedule; sequential: one start at a time; "
        "interleaved: every round's start of every variant whose contract is interleaved alive together, each "
        "prompt served to them in a rotating order, the contract's passes times (checked before any start: a "
        "variant the machine cannot hold beside the base is measured one start at a time, and its row says so)",
    )
    sweep_p.add_argument("--no-probe", action="store_true", help="skip the collective probe before the first start")
    sweep_p.add_argument(
        "--fleet",
        default=None,
        metavar="ADDRESS",
        help="spread the sweep over the boxes of the Ray cluster at ADDRESS (host:port; needs the fleet extra): the "
        "base and --shard-size variants a shard, each shard with all its rounds on one box, every variant paired "
        "with its own shard's base (docs/fleet.md)",
    )
    sweep_p.add_argument(
        "--shard-size", type=int, default=1, metavar="N", help="variants besides the base in each shard (default 1)"
    )
    sweep_p.add_argument(
        "--host-class",
        default=None,
        metavar="KEY",
        help="with --fleet: run only on boxes labelled with this host class (`b70lab fleet labels` prints a box's)",
    )
    sweep_p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="models and engine caches (default $B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab, else ~/.cache/b70lab)",
    )
    sweep_p.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    """Exit 0 when every planned start ran, every variant was judged and the table was written, whatever the
    verdicts; 1 when a start failed, a variant could not be judged or this machine refuses a variant (before
    any start); 2 for a usage problem (a field the contract lacks, a value its rules forbid)."""
    from ..contract import schema as contract
    from ..contract import variants
    from ..engine import capability
    from ..mini.build import default_cache_root
    from ..report import sweep as sweep_page
    from ..sweep import document as sweep_document
    from ..sweep import plan, runner, table

    asked = _sweep_arguments(args)
    base = contract.load(args.contract)
    args.rounds = base.reproduction.fresh_starts if args.rounds is None else args.rounds
    if args.rounds < 1:
        raise variants.VariantError(f"--rounds {args.rounds}: a sweep needs at least one round")
    named = tuple(n.strip() for n in args.named.split(",") if n.strip()) if args.named else ()
    grid = variants.grid(base, args.vary or [], extra=named)
    prompt_ids = [p.strip() for p in args.prompts.split(",") if p.strip()] if args.prompts else None
    contract.select_prompts(contract.load_prompts(base), prompt_ids, "--prompts")
    refused = [f"{v.name}: {problem}" for v in grid for problem in capability.preflight(v.contract)]
    if refused:
        print(
            "b70lab: this machine would refuse these variants; nothing was started:\n  " + "\n  ".join(refused),
            file=sys.stderr,
        )
        return 1
    out = args.out.resolve()
    if args.fleet:
        return _fleet_sweep(args, base, grid, prompt_ids, out)
    if args.resume is not None:
        planned = runner.read_plan(out)
        runner.check_resumable(out, runner.as_measured(grid, planned.get("alone") or {}), planned)

    def say(msg: str) -> None:
        print(f"b70lab: {msg}", file=sys.stderr, flush=True)

    resuming = "resuming the " if args.resume is not None else ""
    say(f"{resuming}sweep of {base.name}: {len(grid)} variants x {args.rounds} rounds into {out}")
    try:
        outcome = runner.run(
            base,
            grid,
            args.rounds,
            out,
            (args.cache_dir or default_cache_root()).resolve(),
            say,
            prompt_ids,
            probe=not args.no_probe,
            asked=asked,
            resume=args.resume is not None,
            schedule=args.schedule,
        )
    except KeyboardInterrupt:  # the start in flight was torn down (run_start); what ran so far stays on disk
        print(
            f"b70lab: sweep interrupted; no table was written; the starts so far are under {out / plan.VARIANTS}; "
            f"continue with: b70lab sweep --resume {out}",
            file=sys.stderr,
        )
        return 130
    measured = runner.as_measured(grid, outcome.alone)
    rows = table.rows(out, measured[0], measured, outcome.judged, outcome.alone)
    document = sweep_document.build(base, args.vary or [], named, args.rounds, args.schedule, prompt_ids, outcome, rows)
    page = sweep_page.write(sweep_document.write(out, document, rows))
    print(table.format_table(rows))
    print(f"written: {out / plan.SWEEP_JSON}, {page}, {out / plan.JUNIT}")
    for problem in outcome.problems:
        print(f"b70lab: sweep problem: {problem}", file=sys.stderr)
    return 1 if outcome.problems else 0


def _sweep_arguments(args: argparse.Namespace) -> dict:
    """What the sweep is asked for, as plan.json keeps it; with --resume, read back from there into `args`."""
    from ..errors import LabError
    from ..sweep import runner

    keys = (
        "contract",
        "vary",
        "named",
        "rounds",
        "prompts",
        "no_probe",
        "schedule",
        "fleet",
        "shard_size",
        "host_class",
    )
    if args.resume is not None:
        given = [
            k
            for k in ("contract", "vary", "named", "rounds", "prompts", "out", "schedule", "fleet", "host_class")
            if getattr(args, k)
        ]
        if given or args.no_probe:
            raise LabError(
                f"--resume takes the sweep's arguments from {args.resume / 'plan.json'}: leave out "
                + ", ".join("--" + k.replace("_", "-") for k in given or ["no-probe"])
            )
        record = runner.read_plan(args.resume)
        for key in keys:
            setattr(args, key, record.get(key))
        args.schedule = args.schedule or "sequential"  # a plan written before --schedule existed
        args.shard_size = args.shard_size or 1
        args.out = args.resume
    elif args.contract is None or args.out is None:
        raise LabError("b70lab sweep needs --contract and --out (or --resume DIR to continue a sweep)")
    if args.schedule in (None, "contract"):
        from ..contract import schema as contract

        args.schedule = contract.load(args.contract).reproduction.schedule
    return {key: getattr(args, key) for key in keys}


def _fleet_sweep(args: argparse.Namespace, base, grid, prompt_ids, out: Path) -> int:
    """The sweep over a Ray cluster's boxes (fleet/sweep.py): same exit codes as on one machine."""
    from ..fleet import sweep as fleet_sweep
    from ..mini.build import default_cache_root
    from ..report import sweep as sweep_page
    from ..sweep import document as sweep_document
    from ..sweep import plan, runner, table

    def say(msg: str) -> None:
        print(f"b70lab: {msg}", file=sys.stderr, flush=True)

    resume = args.resume is not None
    shard_list = fleet_sweep.plan_shards(out, grid, args.shard_size, resume)
    measured = runner.as_measured(grid, {})
    schedule = args.schedule

    def work_of(s):
        return fleet_sweep.sweep_work(measured, s, args.rounds, schedule, prompt_ids, not args.no_probe)

    cache_root = (args.cache_dir or default_cache_root()).resolve()
    say(f"fleet sweep of {base.name}: {len(grid)} variants in {len(shard_list)} shards on {args.fleet} into {out}")
    try:
        outcome = fleet_sweep.run(
            measured,
            out,
            args.fleet,
            work_of,
            shard_list,
            {k: getattr(args, k) for k in ("contract", "vary", "named", "rounds", "prompts", "no_probe", "schedule")}
            | {"shard_size": args.shard_size, "host_class": args.host_class},
            say,
            resume=resume,
            host_class=args.host_class,
            cache_root=cache_root,
            prompt_ids=prompt_ids,
        )
    except KeyboardInterrupt:
        # The driver has left the cluster (fleet.sweep.run); Ray ends a job's tasks with its driver.
        print(
            f"b70lab: fleet sweep interrupted; no table was written; finished shards are under {out / 'shards'} and "
            f"every attempt in {out / 'fleet.json'}; continue with: b70lab sweep --resume {out}",
            file=sys.stderr,
        )
        return 130
    rows = fleet_sweep.judge_and_tabulate(outcome, measured, prompt_ids, cache_root, say)
    merged = outcome.merged()
    named = tuple(n.strip() for n in args.named.split(",") if n.strip()) if args.named else ()
    document = sweep_document.build(base, args.vary or [], named, args.rounds, schedule, prompt_ids, merged, rows)
    document["fleet"] = {"address": args.fleet, "shards": [s.as_plan() for s in shard_list], "ledger": "fleet.json"}
    page = sweep_page.write(sweep_document.write(out, document, rows))
    print(table.format_table(rows))
    print(f"written: {out / plan.SWEEP_JSON}, {page}, {out / plan.JUNIT}, {out / 'fleet.json'}")
    problems = merged.problems + outcome.problems
    for problem in problems:
        print(f"b70lab: sweep problem: {problem}", file=sys.stderr)
    return 1 if problems else 0
