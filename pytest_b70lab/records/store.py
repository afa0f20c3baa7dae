"""Reading sealed records. A seal is a run folder (start-N/evidence.json, prompts.jsonl, checkpoint-tables.json,
promotion.json: every reader of run folders reads it as one) plus what makes it self-contained: contract.toml,
record.json (source state, launcher, machine, models), the teacher snapshots that judged it under
__snapshots__/, and SEAL.json over all of them.

The file digests are sha256 (hashlib): no library keeps a manifest of a folder the way a seal needs it (one
digest over name-and-digest lines, every missing, edited or added file named), so the few lines are here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import project
from ..digests import file_sha256, sha256_canonical
from ..errors import LabError
from ..evidence.record import read_json
from . import derivation, signing
from .layout import CONTRACT_FILE, RECORD_FILE, REPRO, SEAL_FILE, SNAPSHOTS  # noqa: F401  (store's vocabulary)

SCHEMA = "b70lab.seal"
# 2: the digest covers the whole of SEAL.json but itself (1: only its list of files). Both read.
VERSION = 2
READS = (1, 2)
METADATA_NOT_SEALED = "metadata not sealed (seal format 1: only the file list is under its digest)"


class SealError(LabError, ValueError):
    """A seal that cannot be read, written or trusted: the message names the file and what is wrong."""


sha256_file = file_sha256


def file_digests(folder: Path) -> dict[str, str]:
    """Every file under `folder` but SEAL.json and its signature envelope, by its relative path (POSIX), with its
    sha256."""
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).as_posix() not in (SEAL_FILE, signing.SIGNATURE_FILE)
    }


def overall_digest(files: dict[str, str]) -> str:
    """One digest over the sealed files: sha256 of `<path> <sha256>` lines, sorted by path."""
    lines = "".join(f"{path} {files[path]}\n" for path in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def content_digest(document: dict[str, Any]) -> str:
    """Format 2's digest: sha256 of SEAL.json's canonical JSON without its own `digest`, so that its name, time,
    contract, headline, supersedes, size and file list are all under it."""
    return sha256_canonical({k: v for k, v in document.items() if k != "digest"})


# The fields of SEAL.json a reader uses, each also digested on its own (under the content digest), so that an
# edit is named by field.
SEALED_FIELDS = ("name", "sealed_at", "run", "contract", "headline", "supersedes", "bytes", "files")


def field_digests(document: dict[str, Any]) -> dict[str, str]:
    return {f: sha256_canonical(document.get(f)) for f in SEALED_FIELDS}


def records_root() -> Path:
    """repro/ in the lab's repository (project.find: the plugin's root folder, the working folder)."""
    return project.find(REPRO)


def resolve(name_or_path: str | Path) -> Path:
    """A seal's folder from its name (repro/NAME) or a path to it; a folder without SEAL.json is an error."""
    given = Path(name_or_path).expanduser()
    candidates = [given] if given.is_absolute() or len(given.parts) > 1 else [records_root() / given, given]
    for folder in candidates:
        if (folder / SEAL_FILE).is_file():
            return folder.resolve()
    raise SealError(
        f"no sealed record {str(name_or_path)!r}: looked for {' and '.join(str(c / SEAL_FILE) for c in candidates)} "
        f"(`b70lab records` lists the seals)"
    )


def is_seal(folder: Path) -> bool:
    return (folder / SEAL_FILE).is_file()


@dataclass(frozen=True)
class Seal:
    folder: Path
    document: dict[str, Any]

    @property
    def name(self) -> str:
        """The folder's name: SEAL.json's must equal it (verify), but the folder is what a reader looks up."""
        return self.folder.name

    @property
    def metadata_sealed(self) -> bool:
        return self.document.get("version") == 2

    def contract_digest(self) -> str:
        """The digest of the sealed contract.toml as it loads (its bytes are under the seal's digest), not
        SEAL.json's claim of it."""
        from ..contract import schema as contract_mod

        return contract_mod.load(self.folder / CONTRACT_FILE).digest

    @property
    def files(self) -> dict[str, str]:
        return dict(self.document.get("files") or {})

    def record(self) -> dict[str, Any]:
        """record.json, read after the seal was verified (verify) or for show."""
        record: dict[str, Any] = _json(self.folder / RECORD_FILE, "the seal's record")
        return record


def _json(path: Path, what: str) -> Any:
    return read_json(path, what, SealError)


def read(folder: Path) -> Seal:
    """SEAL.json of `folder`, its shape checked (not its files: verify)."""
    document = _json(folder / SEAL_FILE, "SEAL.json")
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise SealError(f"{folder / SEAL_FILE} is not a b70lab seal (schema {SCHEMA!r} expected)")
    if document.get("version") not in READS:
        raise SealError(
            f"{folder / SEAL_FILE}: seal version {document.get('version')!r}, this b70lab reads "
            + " and ".join(map(str, READS))
        )
    files = document.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise SealError(f"{folder / SEAL_FILE}: `files` must map each sealed file to its sha256")
    return Seal(folder, document)


def verify(folder: Path, signatures: bool = True) -> list[str]:
    """Every way the folder differs from its SEAL.json, one line each naming the file, then what its signatures
    say against the pinned keys (unless `signatures` is off: a seal about to be signed); [] when it holds."""
    try:
        seal = read(folder)
    except SealError as e:
        return [str(e)]
    sealed, present = seal.files, file_digests(folder)
    problems = [
        f"{folder / p}: missing (sealed with sha256 {sealed[p][:16]}...)" for p in sorted(set(sealed) - set(present))
    ]
    problems += [f"{folder / p}: added after sealing (not in {SEAL_FILE})" for p in sorted(set(present) - set(sealed))]
    problems += [
        f"{folder / p}: edited (sha256 {present[p][:16]}..., sealed {sealed[p][:16]}...)"
        for p in sorted(set(sealed) & set(present))
        if sealed[p] != present[p]
    ]
    problems += _metadata_problems(seal, files_hold=not problems)
    return problems + (signature(seal).problems if signatures and not problems else [])


def signature(seal: Seal) -> signing.SignatureCheck:
    """The seal's signatures against the files it holds, the public keys beside it (ROOT/keys/) and the key ids
    B70LAB_SEAL_KEYIDS pins."""
    try:
        pins = signing.pinned_keyids()
    except signing.SigningError as e:
        return signing.SignatureCheck("key pins unreadable", [str(e)])
    expected = signing.subjects(seal.folder, seal.files, SEAL_FILE)
    return signing.check(seal.folder, expected, seal.folder.parent / signing.KEYS, pins)


def _metadata_problems(seal: Seal, files_hold: bool) -> list[str]:
    """SEAL.json against its digest, and (where its files hold: an edited file is named alone) what it says
    against what its files say: its name against the folder's, its contract digest against contract.toml's and
    record.json's."""
    document, where = seal.document, seal.folder / SEAL_FILE
    claimed = str(document.get("digest"))
    problems = []
    if seal.metadata_sealed and content_digest(document) != claimed:
        recorded = document.get("field_digests") or {}
        edited = [f for f, d in field_digests(document).items() if recorded.get(f) != d]
        what = f"its {', '.join(edited)} edited" if edited else "edited, its field digests with it"
        problems.append(
            f"{where}: its digest {claimed[:16]}... is not the digest of its content "
            f"({content_digest(document)[:16]}...): SEAL.json was {what} after sealing"
        )
    if not seal.metadata_sealed and overall_digest(seal.files) != claimed:
        problems.append(
            f"{where}: its digest {claimed[:16]}... is not the digest of the files it lists "
            f"({overall_digest(seal.files)[:16]}...): SEAL.json itself was edited"
        )
    if not files_hold:
        return problems
    if document.get("name") != seal.folder.name:
        problems.append(f"{where}: name {document.get('name')!r} is not the folder's, {seal.folder.name!r}")
    try:
        loaded = seal.contract_digest()
        recorded = (seal.record().get("contract") or {}).get("digest")
    except LabError as e:
        return [*problems, f"{seal.folder}: the sealed contract or record cannot be read: {e}"]
    said = (document.get("contract") or {}).get("digest")
    if said != loaded:
        problems.append(f"{where}: contract digest {str(said)[:16]}... is not contract.toml's, {loaded[:16]}...")
    if recorded != loaded:
        problems.append(
            f"{seal.folder / RECORD_FILE}: contract digest {str(recorded)[:16]}... is not contract.toml's, "
            f"{loaded[:16]}..."
        )
    return problems + (_record_problems(seal) if not problems else [])  # an edited SEAL.json is named alone


def _record_problems(seal: Seal) -> list[str]:
    """record.json against what the sealed evidence says: every derived part (versions, runtime fixes, host,
    launcher, models, oracle, result) computed again from the seal's own start files and contract, with SEAL.json's
    headline; the patch series, files of the checkout, is taken as record.json states it."""
    from ..contract import schema as contract_mod
    from ..evidence import run_folder

    where = seal.folder / RECORD_FILE
    try:
        recorded = seal.record()
        starts = run_folder.read_starts(seal.folder)
        contract = contract_mod.load(seal.folder / CONTRACT_FILE)
        patches = (recorded.get("source") or {}).get("patches") or []
        derived = json.loads(
            json.dumps(derivation.record(contract, starts, str(seal.document.get("headline")), patches))
        )
    except LabError as e:
        return [f"{where}: cannot be derived again from the sealed evidence: {e}"]
    lines = derivation.differences(
        {k: recorded.get(k) for k in derivation.DERIVED}, {k: derived.get(k) for k in derivation.DERIVED}
    )
    return [f"{where}: {line}" for line in lines[:6]] + (
        [f"{where}: and {len(lines) - 6} more differences"] if len(lines) > 6 else []
    )


def headline_problem(seal: Seal, judged_line: str) -> str | None:
    """SEAL.json's headline against the verdict its files judge to now."""
    said = seal.document.get("headline")
    if said == judged_line:
        return None
    return f"{seal.folder / SEAL_FILE}: headline {said!r} is not what its files judge to: {judged_line!r}"


def verified(folder: Path, signatures: bool = True) -> Seal:
    """The seal of `folder`, or SealError naming every file that differs."""
    problems = verify(folder, signatures)
    if problems:
        raise SealError(f"sealed record {folder} does not verify:\n  " + "\n  ".join(problems))
    return read(folder)


def judged(folder: Path) -> Any:
    """The seal's verdict judged again from its own files, under the contract it holds: a seal is the promotion
    of its day, and the repository's copy of that contract moving on since does not un-promote it (a run
    reproduced against the seal is still held to the sealed contract's digest)."""
    from ..contract import schema as contract_mod
    from ..judge.folder import judge_folder

    sealed = contract_mod.load(folder / CONTRACT_FILE)
    return judge_folder(folder, folder / SNAPSHOTS, named=f"{sealed.name}@{sealed.digest}")


def superseded(seals: list[Seal]) -> dict[str, str]:
    """{name: the seal that supersedes it}: a seal names the one it replaces (`b70lab seal --supersedes`), under its
    digest. A superseded seal is still listed and verified, never chosen to compare with."""
    return {
        str(s.document["supersedes"]): s.name
        for s in seals
        if "error" not in s.document and s.document.get("supersedes")
    }


def current(seals: list[Seal]) -> list[Seal]:
    """The readable seals that no other seal supersedes."""
    replaced = superseded(seals)
    return [s for s in seals if "error" not in s.document and s.name not in replaced]


def listing(root: Path | None = None) -> list[Seal]:
    """Every seal under the records root (a folder with SEAL.json), by name; unreadable ones included with
    what is wrong (verify says it)."""
    found = []
    base = root if root is not None else records_root()
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        if is_seal(folder):
            try:
                found.append(read(folder))
            except SealError as e:
                found.append(Seal(folder, {"name": folder.name, "error": str(e)}))
    return found


def run_or_seal(value: str | Path) -> Path:
    """A run folder as given, or a sealed record by name or folder, verified first: a seal compared with is
    one whose files still hold."""
    given = Path(value).expanduser()
    if given.is_dir() and not is_seal(given):
        return given.resolve()
    if given.is_dir() or not given.exists():
        try:
            return verified(resolve(value)).folder
        except SealError:
            if given.is_dir():
                raise
            raise SealError(
                f"{value}: neither a run folder nor a sealed record (`b70lab records` lists them)"
            ) from None
    return given.resolve()
