"""`b70lab mini`: build, verify, export and train the embedded default model."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    mini_p = sub.add_parser("mini", help="the generated tiny Laguna target + DFlash draft")
    mini_sub = mini_p.add_subparsers(dest="mini_command", required=True)
    build_p = mini_sub.add_parser(
        "build", help="build (or reuse) the mini model and its W4A16 (INT4) build; prints both folders"
    )
    build_p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="cache root (default: $B70LAB_CACHE_DIR, $XDG_CACHE_HOME/b70lab or ~/.cache/b70lab, then mini/); "
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
        help="b70lab cache root the mini is built in (default: $B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab, else ~/.cache/b70lab)",
    )
    export_p.add_argument("--int4", action="store_true", help="export the W4A16 (INT4) build instead")
    export_p.set_defaults(func=_mini_export)
    int4_p = mini_sub.add_parser(
        "int4-target",
        help="write the INT4 target's weights, dequantized, in the trainer's naming (fp32 safetensors): what "
        "`b70lab mini train draft --against-int4 FILE` distils the INT4 lane's draft against",
    )
    int4_p.add_argument("file", type=Path, help="the safetensors file to write")
    int4_p.set_defaults(func=_mini_int4_target)
    train_help = (
        "train the mini's tokenizer and target and distil its DFlash draft into a folder (on CUDA where "
        "present, else CPU; `--help` lists the trainer's options). A retrain need not be byte-identical "
        "to the committed weights, which are the artifact; fixtures/mini/recipe.json records the "
        "settings they were trained with. Point B70LAB_MINI_WEIGHTS at the folder to build from it"
    )
    train_p = mini_sub.add_parser("train", add_help=False, help=train_help, description=train_help)
    train_p.set_defaults(func=_mini_train, passthrough=True)


def _mini_build(args: argparse.Namespace) -> int:
    from .. import mini

    t0 = time.monotonic()
    out = mini.build(args.out, force=args.force)
    print(out)
    print(mini.build_int4(args.out, force=args.force))  # the same weights in W4A16 (mini/int4.py)
    print(f"mini model and its INT4 build ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


def _mini_int4_target(args: argparse.Namespace) -> int:
    from ..mini.int4_reference import write_int4_target

    print(write_int4_target(args.file))
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
