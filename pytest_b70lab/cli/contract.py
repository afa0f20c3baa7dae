"""`b70lab contract`: list, show, derive and vary experiment contracts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
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
        help="b70lab cache root; tables go to DIR/checkpoint-tables (default: $B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab, else ~/.cache/b70lab)",
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
