"""`b70lab probe`: the collective probe and the capability preflight, alone."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
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
