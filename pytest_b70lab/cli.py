"""`b70lab`: the project's command line (the pytest plugin is the main surface; this is for humans)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _mini_build(args: argparse.Namespace) -> int:
    from . import mini

    t0 = time.monotonic()
    out = mini.build(args.out, force=args.force)
    print(out)
    print(f"mini model ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


def _mini_verify(args: argparse.Namespace) -> int:
    from . import mini

    manifest = mini.verify(Path(args.folder))
    print(json.dumps({"folder": str(args.folder), "model_digest": manifest["model_digest"],
                      "kv_scale_digest": manifest["target"]["kv_scale_digest"],
                      "files": len(manifest["files"])}, indent=2))
    return 0


def _contract_show(args: argparse.Namespace) -> int:
    from . import contract, mini, session

    c = contract.load(args.name)
    print(session.describe(c.teacher() if args.teacher else c, args.cache_dir or mini.default_cache_root()))
    return 0


def _contract_list(args: argparse.Namespace) -> int:
    from . import contract

    for name in contract.available():
        c = contract.load(name)
        print(f"{name}  {c.digest[:16]}  {c.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="b70lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    mini_p = sub.add_parser("mini", help="the generated tiny Laguna target + DFlash draft")
    mini_sub = mini_p.add_subparsers(dest="mini_command", required=True)
    build_p = mini_sub.add_parser("build", help="build (or reuse) the mini model; prints its folder")
    build_p.add_argument("--out", type=Path, default=None,
                         help="cache root (default: $B70LAB_CACHE_DIR/mini or ~/.cache/b70lab/mini); "
                              "the model goes into a sub-folder named by the recipe digest")
    build_p.add_argument("--force", action="store_true", help="rebuild even if a verified build exists")
    build_p.set_defaults(func=_mini_build)
    verify_p = mini_sub.add_parser("verify", help="check a mini model folder against its manifest")
    verify_p.add_argument("folder", type=Path)
    verify_p.set_defaults(func=_mini_verify)

    contract_p = sub.add_parser("contract", help="experiment contracts (fixtures/contracts/)")
    contract_sub = contract_p.add_subparsers(dest="contract_command", required=True)
    show_p = contract_sub.add_parser("show", help="the resolved contract, its digest, launch command and environment")
    show_p.add_argument("name", help="contract name or TOML path")
    show_p.add_argument("--teacher", action="store_true", help="show the derived teacher contract instead")
    show_p.add_argument("--cache-dir", type=Path, default=None)
    show_p.set_defaults(func=_contract_show)
    contract_sub.add_parser("list", help="the shipped contracts").set_defaults(func=_contract_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .contract import ContractError
    from .mini import MiniModelError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (MiniModelError, ContractError) as e:
        print(f"b70lab: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
