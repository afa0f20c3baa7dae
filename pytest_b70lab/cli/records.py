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
    seal_p.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="KEY",
        help="sign the seal with this private key (`b70lab keys generate`): SEAL.dsse.json, a DSSE envelope over an "
        "in-toto statement of every sealed file and SEAL.json with SLSA provenance",
    )
    seal_p.set_defaults(func=_seal)
    keys_p = sub.add_parser("keys", help="the Ed25519 keys that sign seals")
    keys_sub = keys_p.add_subparsers(dest="keys_command", required=True)
    generate_p = keys_sub.add_parser(
        "generate",
        help="a key pair: the private key (mode 0600, never inside a git checkout), the public key as "
        "ROOT/keys/KEYID.pub.json; prints the key id to pin in B70LAB_SEAL_KEYIDS",
    )
    generate_p.add_argument(
        "--private",
        type=Path,
        default=Path("~/.config/b70lab/seal-ed25519.pem"),
        help="where the private key goes (default: ~/.config/b70lab/seal-ed25519.pem; never overwritten)",
    )
    generate_p.add_argument("--root", type=Path, default=None, help="the records folder (default: repro/)")
    generate_p.set_defaults(func=_keys_generate)
    records_p = sub.add_parser(
        "records", help="the sealed records under repro/: list them, verify them (files, signatures) or sign one"
    )
    records_p.add_argument("--root", type=Path, default=None, help="the records folder (default: repro/)")
    records_p.set_defaults(func=_records_list)
    records_sub = records_p.add_subparsers(dest="records_command")
    verify_p = records_sub.add_parser(
        "verify",
        help="check every file of a seal (or of every seal) against its SEAL.json, its signature against the key ids "
        "B70LAB_SEAL_KEYIDS pins, and judge it again from its own "
        "files; exit 1 naming each file that differs",
    )
    verify_p.add_argument("name", nargs="?", default=None, help="a seal's name or folder (default: every seal)")
    verify_p.set_defaults(func=_records_verify)
    sign_p = records_sub.add_parser(
        "sign", help="sign a sealed record that verifies with a private key (replaces its SEAL.dsse.json)"
    )
    sign_p.add_argument("name", help="a seal's name or folder")
    sign_p.add_argument("--key", type=Path, required=True, help="the private key (`b70lab keys generate`)")
    sign_p.set_defaults(func=_records_sign)


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
    if args.sign is not None:
        return _signed(folder, args.sign)
    return 0


def _signed(folder: Path, key: Path) -> int:
    from ..records.seal import sign

    check = sign(folder, key.expanduser())
    print(f"signed {folder.name}: {check.summary}")
    for problem in check.problems:
        print(f"  {problem}")
    return 1 if check.problems else 0


def _records_sign(args: argparse.Namespace) -> int:
    from ..records import store

    return _signed(store.resolve(args.name), args.key)


def _keys_generate(args: argparse.Namespace) -> int:
    from ..records import signing, store

    keys_dir = (args.root or store.records_root()) / signing.KEYS
    keyid, public = signing.generate(args.private, keys_dir)
    print(f"key {keyid}\n  private {args.private.expanduser()} (mode 0600: keep it off the repository)")
    print(f"  public  {public} (commit it beside the seals)")
    print(f"pin it where CI runs, outside the repository: {signing.PINS_VARIABLE}={keyid}")
    return 0


def _records_list(args: argparse.Namespace) -> int:
    from ..records import store

    seals = store.listing(args.root)
    if not seals:
        print(f"no sealed records in {args.root or store.records_root()}")
        return 0
    replaced = store.superseded(seals)
    for s in seals:
        d = s.document
        if "error" in d:
            print(f"{s.name}: unreadable: {d['error']}")
            continue
        superseded = f"; supersedes {d['supersedes']}" if d.get("supersedes") else ""
        superseded += f"; superseded by {replaced[s.name]}" if s.name in replaced else ""
        unsealed = "" if s.metadata_sealed else f" ({store.METADATA_NOT_SEALED})"
        print(
            f"{s.name}: contract {d['contract']['name']}, sealed {d['sealed_at']}{superseded}{unsealed}; "
            f"{store.signature(s).summary}\n  {d['headline']}"
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
            unsealed += f"; {store.signature(seal).summary}"
        failed += bool(problems)
        print(f"{folder.name}: " + ("FAILS\n  " + "\n  ".join(problems) if problems else f"holds; {line}{unsealed}"))
    if not folders:
        print("no sealed records to verify")
    return 1 if failed else 0
