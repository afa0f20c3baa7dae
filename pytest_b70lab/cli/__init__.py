"""`b70lab`: the project's command line (the pytest plugin is the main surface; this is for humans)."""

from __future__ import annotations

import argparse
import sys

from . import batch, bench, contract, evidence, fleet, history, mini, probe, records, report, schema, sweep

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
        "b70lab sweep --contract mini-laguna-cpu-int4 --vary engine.block_size=32,64 --fleet head:6379 --out data/sweeps/f",
    ],
    "fleet": ["b70lab fleet labels b70-01 --head head:6379"],
    "gates": [
        "b70lab gates --fleet head:6379 --contract mini-laguna-cpu-int4 --contract mini-laguna-cpu --out data/batches/n1",
        "b70lab gates --resume data/batches/n1",
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
    "seal": [
        "b70lab seal data/runs/20261204-101503 --name mini-laguna-cpu-20261204",
        "b70lab seal data/runs/20261205-153434 --name mini-laguna-cpu-int4-20261205 --sign ~/.config/b70lab/seal-ed25519.pem",
    ],
    "records": [
        "b70lab records",
        "b70lab records verify",
        "b70lab records sign mini-laguna-cpu-20261204 --key ~/.config/b70lab/seal-ed25519.pem",
    ],
    "keys": ["b70lab keys generate", "b70lab keys generate --private ~/.config/b70lab/lab-ci.pem"],
    "history": [
        "b70lab history",
        "b70lab history mini-laguna-cpu --from data/runs --from repro --html data/history.html",
    ],
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
        mini.add,
        contract.add,
        sweep.add,
        fleet.add,
        batch.add,
        bench.add,
        probe.add,
        report.add,
        evidence.add,
        records.add,
        history.add,
        schema.add,
    ):
        add(sub)
    for name, command in sub.choices.items():
        _with_examples(command, name)
    return parser


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
