"""`b70lab seal` and `b70lab records`: sealed records under repro/."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
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
        unsealed = "" if s.metadata_sealed else f" ({store.METADATA_NOT_SEALED})"
        print(
            f"{s.name}: contract {d['contract']['name']}, sealed {d['sealed_at']}{superseded}{unsealed}\n"
            f"  {d['headline']}"
        )
    return 0


def _records_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every seal asked for holds; 1 naming each file that differs or a verdict that moved."""
    from ..judge import folder as judge
    from ..records import store

    folders = [store.resolve(args.name)] if args.name else [s.folder for s in store.listing(args.root)]
    failed = 0
    for folder in folders:
        problems = store.verify(folder)
        unsealed = ""
        if not problems:
            seal, decision = store.read(folder), store.judged(folder)
            line = judge.headline_line(decision, folder)
            if not decision.promotable:
                problems.append(f"judged again from its own files, the seal is not promotable: {line}")
            if moved := store.headline_problem(seal, line):
                problems.append(moved)
            unsealed = "" if seal.metadata_sealed else f" ({store.METADATA_NOT_SEALED})"
        failed += bool(problems)
        print(f"{folder.name}: " + ("FAILS\n  " + "\n  ".join(problems) if problems else f"holds; {line}{unsealed}"))
    if not folders:
        print("no sealed records to verify")
    return 1 if failed else 0
