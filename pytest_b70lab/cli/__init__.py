"""`b70lab`: the project's command line (the pytest plugin is the main surface; this is for humans)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# variants.NAMED, spelled here so that `b70lab --help` loads no contract machinery (a test holds them equal).
NAMED_VARIANTS = ("target-only", "unquantized-kv")


def _mini_build(args: argparse.Namespace) -> int:
    from .. import mini

    t0 = time.monotonic()
    out = mini.build(args.out, force=args.force)
    print(out)
    print(mini.build_int4(args.out, force=args.force))  # the same weights in W4A16 (mini/int4.py)
    print(f"mini model and its INT4 build ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


def _mini_verify(args: argparse.Namespace) -> int:
    from .. import mini

    manifest = mini.verify(Path(args.folder))
    print(
        json.dumps(
            {
                "folder": str(args.folder),
                "model_digest": manifest["model_digest"],
                "kv_scale_digest": manifest["target"]["kv_scale_digest"],
                "files": len(manifest["files"]),
            },
            indent=2,
        )
    )
    return 0


def _mini_export(args: argparse.Namespace) -> int:
    from .. import mini

    root = args.cache_dir / "mini" if args.cache_dir else None
    folder = mini.build_int4(root) if args.int4 else mini.build(root)
    print(mini.export_plain(folder, args.dir))
    return 0


def _mini_train(args: argparse.Namespace, rest: list[str]) -> int:
    """Everything after `mini train` goes to the trainer's own parser (it runs where only torch and
    transformers are installed, so it keeps its options; `--help` prints them)."""
    from ..mini import train

    return train.main(rest)


def _derive_text(table: dict) -> str:
    """What a contract pins from a checkpoint, as TOML: the [expect] lines, the rest as comments."""
    from collections import Counter

    dtypes = Counter(t["dtype"] for t in table["tensors"].values())
    integer = sum(n for dtype, n in dtypes.items() if dtype.startswith(("int", "uint", "bool")))
    packed = sum(1 for name in table["tensors"] if name.endswith(".weight_packed"))
    quant = table["quantization"] or {}
    read = table["read"]
    rate = f"{read['bytes'] / read['seconds'] / 1e6:.0f} MB/s" if read["bytes"] and read["seconds"] else "-"
    lines = [
        f"# checkpoint {table['source']}",
        f"# folder digest {table['digest']} ({len(table['files'])} files)",
        f"# tensors: {len(table['tensors'])}, of which {integer} integer ({packed} pack-quantized weights); "
        + ", ".join(f"{dtype} {n}" for dtype, n in sorted(dtypes.items())),
        f"# quantization: {quant.get('quant_method', 'none')}"
        + (f", format {quant['format']}" if quant.get("format") else "")
        + (", KV cache scheme" if quant.get("kv_cache_scheme") else ""),
        f"# read: {read['bytes'] / 1e6:.1f} MB in {read['seconds']:.2f} s ({rate}); "
        f"{read['files_read']} files read, {read['files_cached']} from the cache",
    ]
    if not table["kv_scales"]:
        return "\n".join(
            lines + ["# no calibrated KV scales: this checkpoint gives a contract nothing to pin in [expect]"]
        )
    return "\n".join(
        lines
        + [
            "[expect]",
            f"target_kv_scale_count = {table['kv_scale_count']}",
            f'target_kv_scale_digest = "{table["kv_scale_digest"]}"',
        ]
    )


def _contract_derive(args: argparse.Namespace) -> int:
    from .. import mini
    from ..evidence import checkpoint

    folder = checkpoint.locate(args.checkpoint)
    table = checkpoint.read_table(folder, args.cache_dir or mini.default_cache_root(), source=args.checkpoint)
    print(json.dumps(table, indent=1, sort_keys=True) if args.json else _derive_text(table))
    return 0


def _contract_show(args: argparse.Namespace) -> int:
    from .. import mini
    from ..contract import schema as contract
    from ..engine.starts import describe

    c = contract.load(args.name)
    print(describe(c.teacher() if args.teacher else c, args.cache_dir or mini.default_cache_root()))
    return 0


def _contract_vary(args: argparse.Namespace) -> int:
    """Exit 1 when this machine would refuse a variant (the capability preflight, per variant): a sweep
    refuses it before any start."""
    from ..contract import schema as contract
    from ..contract import variants
    from ..engine import capability

    base = contract.load(args.name)
    named = tuple(n.strip() for n in args.named.split(",") if n.strip()) if args.named else ()
    refused = 0
    for v in variants.grid(base, args.vary or [], extra=named):
        changes = ", ".join(f"{k} = {val}" for k, val in v.changes.items()) or "the contract as it is"
        print(
            f"{v.name}  {v.contract.digest[:16]}  {v.contract.kind}  {changes}; judged against {v.judged_against(base)}"
        )
        for problem in capability.preflight(v.contract):
            refused += 1
            print(f"  refused on this machine: {problem}")
    return 1 if refused else 0


def _sweep(args: argparse.Namespace) -> int:
    """Exit 0 when every planned start ran, every variant was judged and the table was written, whatever the
    verdicts; 1 when a start failed, a variant could not be judged or this machine refuses a variant (before
    any start); 2 for a usage problem (a field the contract lacks, a value its rules forbid)."""
    import datetime as dt

    from ..contract import schema as contract
    from ..contract import variants
    from ..engine import capability
    from ..evidence import host
    from ..mini.build import default_cache_root
    from ..report import sweep as sweep_page
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
    fields = [variants.parse_vary(v)[0] for v in args.vary or []]
    sweep = {
        "schema": plan.SWEEP_SCHEMA,
        "version": plan.SWEEP_VERSION,
        "base": base.name,
        "base_digest": base.digest,
        "varies": args.vary or [],
        "fields": fields,
        "named": list(named),
        "rounds": args.rounds,
        "schedule": args.schedule,
        "prompts": prompt_ids,
        "order": [p.label() for p in outcome.order],
        "status": outcome.status,
        "teachers": outcome.teachers,
        "problems": outcome.problems,
        "cpu": host.describe(host.cpu_identity()),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "variants": [{**r.as_dict(), "base_values": {f: variants.field_value(base, f) for f in fields}} for r in rows],
    }
    try:
        (out / plan.SWEEP_JSON).write_text(json.dumps(sweep, indent=1, sort_keys=True) + "\n")
        (out / plan.JUNIT).write_text(table.junit_xml(rows, base.name))
    except OSError as e:
        raise runner.SweepError(f"cannot write the sweep table into {out}: {e.strerror or e}") from e
    page = sweep_page.write(out / plan.SWEEP_JSON)
    print(table.format_table(rows))
    print(f"written: {out / plan.SWEEP_JSON}, {page}, {out / plan.JUNIT}")
    for problem in outcome.problems:
        print(f"b70lab: sweep problem: {problem}", file=sys.stderr)
    return 1 if outcome.problems else 0


def _sweep_arguments(args: argparse.Namespace) -> dict:
    """What the sweep is asked for, as plan.json keeps it; with --resume, read back from there into `args`."""
    from ..errors import LabError
    from ..sweep import runner

    keys = ("contract", "vary", "named", "rounds", "prompts", "no_probe", "schedule")
    if args.resume is not None:
        given = [k for k in ("contract", "vary", "named", "rounds", "prompts", "out", "schedule") if getattr(args, k)]
        if given or args.no_probe:
            raise LabError(
                f"--resume takes the sweep's arguments from {args.resume / 'plan.json'}: leave out "
                + ", ".join("--" + k.replace("_", "-") for k in given or ["no-probe"])
            )
        record = runner.read_plan(args.resume)
        for key in keys:
            setattr(args, key, record.get(key))
        args.schedule = args.schedule or "sequential"  # a plan written before --schedule existed
        args.out = args.resume
    elif args.contract is None or args.out is None:
        raise LabError("b70lab sweep needs --contract and --out (or --resume DIR to continue a sweep)")
    if args.schedule in (None, "contract"):
        from ..contract import schema as contract

        args.schedule = contract.load(args.contract).reproduction.schedule
    return {key: getattr(args, key) for key in keys}


def _contract_list(args: argparse.Namespace) -> int:
    from ..contract import project
    from ..contract import schema as contract

    names = contract.available()
    if not names:
        where = " or ".join(str(base / contract.CONTRACTS) for base in project.bases())
        print(
            f"b70lab: no contracts in {where}: run b70lab from the lab's repository (where fixtures/contracts/ "
            f"is), or name a contract file by its path",
            file=sys.stderr,
        )
        return 1
    for name in names:
        c = contract.load(name)
        print(f"{name}  {c.digest[:16]}  {c.description}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .. import bench, mini

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
    print(bench.table(figures))
    print(f"\nwritten: {out / 'bench.json'}", file=sys.stderr)
    return 0


def _probe_collectives(args: argparse.Namespace) -> int:
    from .. import mini
    from ..contract import schema as contract
    from ..engine.probe import probe_collectives
    from ..engine.starts import probe_environment

    c = contract.load(args.contract)
    world = c.engine.tensor_parallel
    cache = (args.cache_dir or mini.default_cache_root()).resolve()
    out = (args.out or Path("data") / "probe" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    env = probe_environment(c, cache)
    print(f"b70lab: probing {world} ranks of {c.name} ({out})", file=sys.stderr, flush=True)
    result = probe_collectives(
        world, out, env, deadline_s=args.deadline, collective_s=args.collective_deadline, stall_rank=args.stall_rank
    )
    print("\n".join(result.lines()))
    return 0 if result.passed else 1


def _probe_capability(args: argparse.Namespace) -> int:
    """One line per thing the engine would refuse here for the contract; exit 1 when there is any."""
    from ..contract import schema as contract
    from ..engine import capability

    c = contract.load(args.contract)
    machine = capability.Machine.observe(c.engine.device)
    print(f"b70lab: {capability.summary(c, machine)}", file=sys.stderr, flush=True)
    problems = capability.preflight(c, machine=machine)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"capability: nothing this machine would refuse for {c.name}")
    print(_sandbox_capability())
    return 1 if problems else 0


def _sandbox_capability() -> str:
    """Which isolation gate 8's generated code gets here, and why any layer is missing (reported, not a
    problem of the engine's: the quality lane refuses by itself where there is none)."""
    from ..isolation import sandbox

    layers = sandbox.os_layers()
    missing = "; ".join(f"{layer}: {why}" for layer, why in sandbox.PROBE_FAILURES.items())
    if not sandbox.has_os_layer(layers):
        return (
            "sandbox: NO OS isolation for generated code here; gate 8 refuses to run it unless "
            f"--b70-allow-unisolated-code is given ({missing})"
        )
    return f"sandbox: generated code runs in {', '.join(layers)}" + (f"; not available: {missing}" if missing else "")


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


def _report(args: argparse.Namespace) -> int:
    from .. import report

    print(report.write(args.run_dir, args.out))
    return 0


# What `--help` ends with, per command: the invocations a lab engineer reaches for first.
EXAMPLES = {
    "b70lab": [
        "b70lab contract list",
        "b70lab report data/runs/20261203-101503",
        "b70lab evidence diff data/runs/A data/runs/B",
        "b70lab sweep --contract mini-laguna-cpu --vary engine.block_size=64 --rounds 2 --out data/sweeps/page",
    ],
    "mini": [
        "b70lab mini build",
        "b70lab mini verify ~/.cache/b70lab/mini/mini-laguna-<digest>",
        "b70lab mini export DIR",
        "b70lab mini export --int4 data/mini-export-int4",
    ],
    "contract": [
        "b70lab contract list",
        "b70lab contract show mini-laguna-cpu --teacher",
        "b70lab contract derive poolside/Laguna-S-2.1-INT4@<revision>",
        "b70lab contract vary mini-laguna-cpu --vary speculative.num_speculative_tokens=3,7 --named target-only",
    ],
    "sweep": [
        "b70lab sweep --contract mini-laguna-cpu --vary speculative.num_speculative_tokens=3,7 --out data/sweeps/depth",
        "b70lab sweep --contract mini-laguna-cpu --vary engine.block_size=64 --schedule interleaved --out data/sweeps/page",
    ],
    "bench": [
        "b70lab bench",
        "b70lab bench --parts reproduction --sessions 10 --schedule both",
        "b70lab bench --parts steadiness --sessions 10 --gap-s 40",
    ],
    "probe": ["b70lab probe capability --contract laguna-s-2.1-int4-fp8kv-b70", "b70lab probe collectives"],
    "report": ["b70lab report data/runs/20261203-101503", "b70lab report RUN --out /tmp/run.html"],
    "evidence": ["b70lab evidence show data/runs/20261203-101503", "b70lab evidence diff RUN_A RUN_B --json"],
    "schema": ["b70lab schema promotion", "b70lab schema evidence"],
    "seal": ["b70lab seal data/runs/20261204-101503 --name mini-laguna-cpu-20261204"],
    "records": ["b70lab records", "b70lab records verify", "b70lab records verify mini-laguna-cpu-20261204"],
}


def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("pytest-b70lab")
    except md.PackageNotFoundError:
        return "unknown (not installed)"


def _with_examples(parser: argparse.ArgumentParser, name: str) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="b70lab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"b70lab {_version()}")
    _with_examples(parser, "b70lab")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_mini,
        _add_contract,
        _add_sweep,
        _add_bench,
        _add_probe,
        _add_report,
        _add_evidence,
        _add_records,
        _add_schema,
    ):
        add(sub)
    for name, command in sub.choices.items():
        _with_examples(command, name)
    return parser


def _add_mini(sub: argparse._SubParsersAction) -> None:
    mini_p = sub.add_parser("mini", help="the generated tiny Laguna target + DFlash draft")
    mini_sub = mini_p.add_subparsers(dest="mini_command", required=True)
    build_p = mini_sub.add_parser(
        "build", help="build (or reuse) the mini model and its W4A16 (INT4) build; prints both folders"
    )
    build_p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="cache root (default: $B70LAB_CACHE_DIR/mini or ~/.cache/b70lab/mini); "
        "the model goes into a sub-folder named by the recipe digest",
    )
    build_p.add_argument("--force", action="store_true", help="rebuild even if a verified build exists")
    build_p.set_defaults(func=_mini_build)
    verify_p = mini_sub.add_parser("verify", help="check a mini model folder against its manifest")
    verify_p.add_argument("folder", type=Path)
    verify_p.set_defaults(func=_mini_verify)
    export_p = mini_sub.add_parser("export", help="plain copies of the mini's target/ and draft/ (no manifest)")
    export_p.add_argument("dir", type=Path, help="folder to write target/ and draft/ into")
    export_p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="b70lab cache root the mini is built in (default: $B70LAB_CACHE_DIR or ~/.cache/b70lab)",
    )
    export_p.add_argument("--int4", action="store_true", help="export the W4A16 (INT4) build instead")
    export_p.set_defaults(func=_mini_export)
    train_help = (
        "train the mini's tokenizer and target and distil its DFlash draft into a folder (on CUDA where "
        "present, else CPU; `--help` lists the trainer's options). A retrain need not be byte-identical "
        "to the committed weights, which are the artifact; fixtures/mini/recipe.json records the "
        "settings they were trained with. Point B70LAB_MINI_WEIGHTS at the folder to build from it"
    )
    train_p = mini_sub.add_parser("train", add_help=False, help=train_help, description=train_help)
    train_p.set_defaults(func=_mini_train, passthrough=True)


def _add_contract(sub: argparse._SubParsersAction) -> None:
    contract_p = sub.add_parser("contract", help="experiment contracts (fixtures/contracts/)")
    contract_sub = contract_p.add_subparsers(dest="contract_command", required=True)
    show_p = contract_sub.add_parser("show", help="the resolved contract, its digest, launch command and environment")
    show_p.add_argument("name", help="contract name or TOML path")
    show_p.add_argument("--teacher", action="store_true", help="show the derived teacher contract instead")
    show_p.add_argument("--cache-dir", type=Path, default=None)
    show_p.set_defaults(func=_contract_show)
    contract_sub.add_parser(
        "list", help="the contracts of the lab's repository (the working folder's fixtures/contracts/)"
    ).set_defaults(func=_contract_list)
    derive_p = contract_sub.add_parser(
        "derive",
        help="what a contract pins from a checkpoint: KV-scale count and "
        "digest, as TOML for [expect], with its tensor table",
    )
    derive_p.add_argument("checkpoint", help="a checkpoint folder, or HUB_ID@REVISION in the local Hugging Face cache")
    derive_p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="b70lab cache root; tables go to DIR/checkpoint-tables (default: $B70LAB_CACHE_DIR or ~/.cache/b70lab)",
    )
    derive_p.add_argument("--json", action="store_true", help="print the whole tensor table as JSON")
    derive_p.set_defaults(func=_contract_derive)
    vary_p = contract_sub.add_parser(
        "vary",
        help="the variants a sweep would run: one full contract per point of "
        "the --vary grid (validated, digested), then the named ones",
    )
    vary_p.add_argument("name", help="contract name or TOML path")
    vary_p.add_argument(
        "--vary",
        action="append",
        metavar="FIELD=V1,V2",
        help="a dotted field of the contract and its values (repeatable; linked fields follow: "
        "speculative.num_speculative_tokens sets verify_width)",
    )
    vary_p.add_argument("--named", default="", help="comma list of target-only, unquantized-kv")
    vary_p.set_defaults(func=_contract_vary)


def _add_sweep(sub: argparse._SubParsersAction) -> None:
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
        "--cache-dir",
        type=Path,
        default=None,
        help="models and engine caches (default $B70LAB_CACHE_DIR or ~/.cache/b70lab)",
    )
    sweep_p.set_defaults(func=_sweep)


def _add_bench(sub: argparse._SubParsersAction) -> None:
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


def _add_probe(sub: argparse._SubParsersAction) -> None:
    from ..contract.defaults import DEFAULT_CONTRACT, PROBE_DEADLINE_S

    probe_p = sub.add_parser(
        "probe", help="preflight checks without an engine: the fabric's collectives, what this machine can run"
    )
    probe_sub = probe_p.add_subparsers(dest="probe_command", required=True)
    coll_p = probe_sub.add_parser(
        "collectives",
        help="the contract's rank count as plain processes: one all_reduce "
        "with a known answer through the engine's TP communicator; "
        "per rank: entered, completed, right sum, torn down clean",
    )
    coll_p.add_argument(
        "--contract", default=DEFAULT_CONTRACT, help="contract name or TOML path (its rank count and device)"
    )
    coll_p.add_argument(
        "--deadline",
        type=float,
        default=PROBE_DEADLINE_S,
        help=f"seconds for the whole probe (default: {PROBE_DEADLINE_S:.0f})",
    )
    coll_p.add_argument(
        "--collective-deadline",
        type=float,
        default=20.0,
        help="seconds for the all_reduce from the first rank entering it (default: 20)",
    )
    coll_p.add_argument(
        "--stall-rank", type=int, default=None, help="inject the seed's stall: this rank never enters the all_reduce"
    )
    coll_p.add_argument(
        "--out", type=Path, default=None, help="folder for each rank's log and probe.json (default: data/probe/<time>)"
    )
    coll_p.add_argument("--cache-dir", type=Path, default=None)
    coll_p.set_defaults(func=_probe_collectives)
    cap_p = probe_sub.add_parser(
        "capability",
        help="what the engine would refuse on this machine for the contract, "
        "in milliseconds, starting nothing: the FP8 attention path, "
        "memory, /dev/shm, page sizes, the vLLM build, XPU devices, "
        "checkpoints. One line per problem; exit 1 when there is any",
    )
    cap_p.add_argument("--contract", default=DEFAULT_CONTRACT, help="contract name or TOML path")
    cap_p.set_defaults(func=_probe_capability)


def _add_report(sub: argparse._SubParsersAction) -> None:
    report_p = sub.add_parser(
        "report",
        help="a run folder as one self-contained HTML page: verdict, gate matrix, "
        "decode rates, token arrival, draft acceptance, quality",
    )
    report_p.add_argument("run_dir", type=Path, help="a run folder (start-N/evidence.json, promotion.json)")
    report_p.add_argument("--out", type=Path, default=None, help="the page to write (default: RUN_DIR/report.html)")
    report_p.set_defaults(func=_report)


def _add_evidence(sub: argparse._SubParsersAction) -> None:
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


def _add_records(sub: argparse._SubParsersAction) -> None:
    seal_p = sub.add_parser(
        "seal",
        help="seal a promoted run folder as repro/NAME/: contract, launcher, source state, models, the teacher "
        "snapshots that judged it, evidence and promotion.json, every file's sha256 in SEAL.json",
    )
    seal_p.add_argument("run_dir", type=Path, help="a run folder that replays PROMOTABLE and complete")
    seal_p.add_argument("--name", required=True, help="the record's name (its folder under repro/)")
    seal_p.add_argument("--supersedes", default=None, help="the sealed record this one replaces, by name")
    seal_p.add_argument(
        "--snapshots",
        type=Path,
        default=None,
        help="the teacher snapshots that judged the run (default: tests/gates/__snapshots__)",
    )
    seal_p.add_argument("--root", type=Path, default=None, help="the records folder (default: repro/)")
    seal_p.set_defaults(func=_seal)
    records_p = sub.add_parser("records", help="the sealed records under repro/: list them, or verify them")
    records_p.add_argument("--root", type=Path, default=None, help="the records folder (default: repro/)")
    records_p.set_defaults(func=_records_list)
    records_sub = records_p.add_subparsers(dest="records_command")
    verify_p = records_sub.add_parser(
        "verify",
        help="check every file of a seal (or of every seal) against its SEAL.json and judge it again from its own "
        "files; exit 1 naming each file that differs",
    )
    verify_p.add_argument("name", nargs="?", default=None, help="a seal's name or folder (default: every seal)")
    verify_p.set_defaults(func=_records_verify)


def _seal(args: argparse.Namespace) -> int:
    from ..contract import project
    from ..records.seal import seal

    snapshots = args.snapshots or project.find("tests/gates/__snapshots__")
    folder = seal(args.run_dir.resolve(), args.name, snapshots, args.root, args.supersedes)
    from ..records import store

    document = store.read(folder).document
    print(
        f"sealed {folder}: {len(document['files'])} files, {document['bytes'] / 1e6:.2f} MB, digest {document['digest']}"
    )
    print(document["headline"])
    return 0


def _records_list(args: argparse.Namespace) -> int:
    from ..records import store

    seals = store.listing(args.root)
    if not seals:
        print(f"no sealed records in {args.root or store.records_root()}")
        return 0
    for s in seals:
        d = s.document
        if "error" in d:
            print(f"{s.name}: unreadable: {d['error']}")
            continue
        superseded = f"; supersedes {d['supersedes']}" if d.get("supersedes") else ""
        print(f"{s.name}: contract {d['contract']['name']}, sealed {d['sealed_at']}{superseded}\n  {d['headline']}")
    return 0


def _records_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every seal asked for holds; 1 naming each file that differs or a verdict that moved."""
    from ..judge import folder as judge
    from ..records import store

    folders = [store.resolve(args.name)] if args.name else [s.folder for s in store.listing(args.root)]
    failed = 0
    for folder in folders:
        problems = store.verify(folder)
        if not problems:
            decision = store.judged(folder)
            line = judge.headline_line(decision, folder)
            if not decision.promotable:
                problems.append(f"judged again from its own files, the seal is not promotable: {line}")
        failed += bool(problems)
        print(f"{folder.name}: " + ("FAILS\n  " + "\n  ".join(problems) if problems else f"holds; {line}"))
    if not folders:
        print("no sealed records to verify")
    return 1 if failed else 0


SCHEMAS = ("promotion", "evidence")


def _add_schema(sub: argparse._SubParsersAction) -> None:
    schema_p = sub.add_parser(
        "schema", help="the JSON Schema of a document b70lab writes: promotion.json (what CI reads), evidence.json"
    )
    schema_p.add_argument("document", choices=SCHEMAS, help="which document")
    schema_p.set_defaults(func=_schema)


def _schema(args: argparse.Namespace) -> int:
    if args.document == "promotion":
        from ..evidence import promotion

        schema = promotion.json_schema()
    else:
        from ..evidence import record as evidence

        schema = evidence.Evidence.model_json_schema(by_alias=True)
    print(json.dumps(schema, indent=1, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..errors import LabError

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args, rest) if getattr(args, "passthrough", False) else args.func(args)
    except LabError as e:
        print(f"b70lab: {e}", file=sys.stderr)
        return 2
