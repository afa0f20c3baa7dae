"""Signed seals, offline: an in-toto Statement v1 over every sealed file and SEAL.json, with a SLSA provenance v1
predicate built from record.json, in a DSSE envelope signed with Ed25519 (securesystemslib's DSSE envelope and
signer; no online service: sigstore's keyless flow needs one, and the lab verifies offline).

Trust comes from outside the repository: the public keys under repro/keys/ are only looked up by key id, and a key
id is the digest of the key, recomputed here; which key ids count is what B70LAB_SEAL_KEYIDS pins (an environment
variable that CI sets: a pin in a file of the repository would be changed by the very commit that forges a seal).
Unsigned, a seal catches accidental edits only; a deliberate re-seal shows in git history alone."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..digests import file_sha256
from ..errors import LabError

SIGNATURE_FILE = "SEAL.dsse.json"  # beside SEAL.json, outside the sealed files: signing adds no sealed file
KEYS = "keys"  # repro/keys/: the public keys, each KEYID.pub.json
PINS_VARIABLE = "B70LAB_SEAL_KEYIDS"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:pytest-b70lab:seal:v1"
BUILDER_VARIABLE = "B70LAB_BUILDER_ID"  # the lab's label for the host that sealed; else one from the sealed CPU
SHORT = 16
PIN = re.compile(r"^[0-9a-f]{16,64}$")
KEYID = re.compile(r"^[0-9a-f]{64}$")


class SigningError(LabError, ValueError):
    """A key or an envelope that cannot be made, read or trusted: the message names the file."""


@dataclass(frozen=True)
class SignatureCheck:
    """What a seal's signatures say: a line for a reader, and every reason it cannot be trusted."""

    summary: str
    problems: list[str] = field(default_factory=list)
    signed_by: tuple[str, ...] = ()


def pinned_keyids(environ: dict[str, str] | None = None) -> list[str]:
    """The key ids B70LAB_SEAL_KEYIDS pins (comma separated, each at least 16 hex digits), or [] where unset."""
    raw = (os.environ if environ is None else environ).get(PINS_VARIABLE, "")
    pins = [p.strip().lower() for p in raw.split(",") if p.strip()]
    if bad := [p for p in pins if not PIN.match(p)]:
        raise SigningError(
            f"{PINS_VARIABLE}={raw!r}: {', '.join(bad)} is not a key id (16 to 64 hex digits; "
            f"`b70lab keys generate` prints one)"
        )
    return pins


def _pinned(keyid: str, pins: list[str]) -> bool:
    return any(keyid.startswith(p) for p in pins)


# --- keys ------------------------------------------------------------------------------------------------------


def _inside_git_checkout(path: Path) -> Path | None:
    for folder in [path.parent, *path.parent.parents]:
        if (folder / ".git").exists():
            return folder
    return None


def generate(private: Path, keys_dir: Path) -> tuple[str, Path]:
    """An Ed25519 key pair: the private key (PEM, mode 0600) at `private`, never inside a git checkout and never
    over an existing file; the public key as keys_dir/KEYID.pub.json. Returns (key id, public key file)."""
    from securesystemslib.signer import CryptoSigner

    private = private.expanduser().absolute()
    if (checkout := _inside_git_checkout(private)) is not None:
        raise SigningError(
            f"{private} is inside the git checkout {checkout}: a private key must live where no commit can take it "
            f"(e.g. ~/.config/b70lab/seal-ed25519.pem)"
        )
    signer = CryptoSigner.generate_ed25519()
    keyid = signer.public_key.keyid
    private.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningError(f"{private} exists: a key is never overwritten; choose another path") from None
    with os.fdopen(fd, "wb") as f:
        f.write(signer.private_bytes)
    keys_dir.mkdir(parents=True, exist_ok=True)
    public = keys_dir / f"{keyid}.pub.json"
    public.write_text(json.dumps({"keyid": keyid, **signer.public_key.to_dict()}, indent=1, sort_keys=True) + "\n")
    return keyid, public


def load_signer(private: Path) -> Any:
    """The signer of a private key file written by `generate`; a key readable by others is refused, as ssh does."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        mode = private.stat().st_mode
        data = private.read_bytes()
    except OSError as e:
        raise SigningError(f"the signing key {private} cannot be read: {e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningError(f"{private} is readable by others (mode {stat.S_IMODE(mode):o}): chmod 600 it first")
    try:
        return CryptoSigner(load_pem_private_key(data, password=None))
    except (ValueError, TypeError) as e:
        raise SigningError(f"{private} is not an unencrypted PEM private key: {e}") from None


def public_key(keys_dir: Path, keyid: str) -> Any:
    """The public key KEYID from keys_dir, its id recomputed from its content (a file may claim any id)."""
    from securesystemslib.signer import SSlibKey
    from securesystemslib.signer._key import compute_default_keyid

    if not KEYID.match(keyid):  # it names a file: an envelope's key id is checked before it is used as one
        raise SigningError(f"key id {keyid[:80]!r} is not a key id (64 hex digits)")
    path = keys_dir / f"{keyid}.pub.json"
    if not path.is_file():
        raise SigningError(f"signed by key {keyid[:SHORT]}, whose public key is not in {keys_dir}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        computed = compute_default_keyid(data["keytype"], data["scheme"], data["keyval"])
        key = SSlibKey.from_dict(computed, {k: data[k] for k in ("keytype", "scheme", "keyval")})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SigningError(f"{path} is not a public key of `b70lab keys generate`: {e}") from None
    if computed != keyid:
        raise SigningError(f"{path} holds key {computed[:SHORT]}, not {keyid[:SHORT]}: the file was edited")
    return key


# --- the statement ---------------------------------------------------------------------------------------------


def subjects(folder: Path, sealed_files: dict[str, str], seal_file: str) -> dict[str, str]:
    """What the statement vouches for: every sealed file and SEAL.json itself, by path, with its sha256."""
    return {**sealed_files, seal_file: file_sha256(folder / seal_file)}


def _lab_dependencies(lock: Path | None, commit: str | None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if commit:
        found.append({"name": "lab repository", "digest": {"gitCommit": commit.removesuffix("-dirty")}})
        if commit.endswith("-dirty"):
            found[-1]["annotations"] = {"dirty": True}
    if lock is not None and lock.is_file():
        found.append({"name": "requirements/lock.txt", "digest": {"sha256": file_sha256(lock)}})
    return found


def provenance(
    document: dict[str, Any], record: dict[str, Any], lock: Path | None, commit: str | None
) -> dict[str, Any]:
    """The SLSA provenance v1 predicate of a seal, from SEAL.json and record.json, with the lab repository's
    commit and lock file as the signer's checkout has them."""
    source, models = record.get("source") or {}, record.get("models") or {}
    dependencies = _lab_dependencies(lock, commit)
    for package in ("vllm", "torch"):
        if source.get(package):
            dependencies.append({"name": package, "uri": f"pkg:pypi/{package}@{source[package]}"})
    dependencies += [
        {"name": f"patches/{p['name']}", "digest": {"sha256": p["sha256"]}} for p in source.get("patches") or []
    ]
    for part in ("target", "draft"):
        if isinstance(models.get(part), dict) and models[part].get("digest"):
            dependencies.append(
                {"name": f"model {part} (checkpoint table)", "digest": {"sha256": models[part]["digest"]}}
            )
    cpu = ((record.get("machine") or {}).get("cpu") or {}).get("model") or "unknown cpu"
    builder = os.environ.get(BUILDER_VARIABLE) or "urn:pytest-b70lab:host:" + re.sub(r"[^A-Za-z0-9.-]+", "-", cpu)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "seal": document.get("name"),
                "run": document.get("run"),
                "contract": document.get("contract"),
            },
            "internalParameters": {"b70lab": importlib.metadata.version("pytest-b70lab")},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": builder},
            "metadata": {"invocationId": str(document.get("run")), "finishedOn": document.get("sealed_at")},
        },
    }


def statement(
    folder: Path,
    sealed_files: dict[str, str],
    seal_file: str,
    document: dict[str, Any],
    record: dict[str, Any],
    lock: Path | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": digest}}
            for name, digest in sorted(subjects(folder, sealed_files, seal_file).items())
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": provenance(document, record, lock, commit),
    }


def sign(folder: Path, statement_: dict[str, Any], signer: Any) -> Path:
    """The statement in a DSSE envelope signed by `signer`, written as folder/SEAL.dsse.json (replacing an older
    envelope: a signature is over the seal as it is now)."""
    from securesystemslib.dsse import Envelope

    payload = json.dumps(statement_, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    path = folder / SIGNATURE_FILE
    path.write_text(json.dumps(envelope.to_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


# --- checking --------------------------------------------------------------------------------------------------


def _envelope(path: Path) -> Any:
    from securesystemslib.dsse import Envelope

    try:
        return Envelope.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SigningError(f"{path} is not a DSSE envelope: {e}") from None


def _statement_problems(path: Path, envelope: Any, expected: dict[str, str]) -> list[str]:
    if envelope.payload_type != PAYLOAD_TYPE:
        return [f"{path}: payload type {envelope.payload_type!r}, {PAYLOAD_TYPE!r} expected"]
    try:
        signed = json.loads(envelope.payload)
        said = {s["name"]: s["digest"]["sha256"] for s in signed["subject"]}
    except (ValueError, KeyError, TypeError) as e:
        return [f"{path}: its statement is not an in-toto statement with sha256 subjects: {e}"]
    if signed.get("_type") != STATEMENT_TYPE or signed.get("predicateType") != PREDICATE_TYPE:
        return [f"{path}: statement {signed.get('_type')!r} / {signed.get('predicateType')!r} is not a seal's"]
    differ = sorted(n for n in set(said) | set(expected) if said.get(n) != expected.get(n))
    if differ:
        shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        return [
            f"{path}: the signed statement does not cover the seal as it is: {shown} differ since signing "
            f"(edited or re-sealed after it was signed)"
        ]
    return []


def check(folder: Path, expected_subjects: dict[str, str], keys_dir: Path, pins: list[str]) -> SignatureCheck:
    """The seal's signatures against its files now, the public keys in keys_dir and the pinned key ids."""
    from securesystemslib.exceptions import VerificationError

    path = folder / SIGNATURE_FILE
    pinned = f"{PINS_VARIABLE} pins {', '.join(p[:SHORT] for p in pins)}"
    if not path.is_file():
        if pins:
            return SignatureCheck("unsigned", [f"{folder}: unsigned, but {pinned}: a seal must be signed by one"])
        return SignatureCheck("unsigned (accidental edits are caught; a deliberate re-seal shows in git history only)")
    try:
        envelope = _envelope(path)
    except SigningError as e:
        return SignatureCheck("signature unreadable", [str(e)])
    if problems := _statement_problems(path, envelope, expected_subjects):
        return SignatureCheck("signature does not cover the seal", problems)
    verified, problems = [], []
    for keyid in sorted(envelope.signatures):
        try:
            envelope.verify([public_key(keys_dir, keyid)], 1)
        except SigningError as e:
            problems.append(f"{path}: {e}")
            continue
        except (VerificationError, ValueError) as e:  # a signature that is not the key's over this envelope
            problems.append(
                f"{path}: the signature of key {keyid[:SHORT]} does not verify ({type(e).__name__}): the envelope "
                f"was changed after signing"
            )
            continue
        verified.append(keyid)
    if not envelope.signatures:
        problems.append(f"{path}: an envelope without a signature")
    by = ", ".join(k[:SHORT] for k in verified)
    if pins and not any(_pinned(k, pins) for k in verified):
        if verified:
            problems.append(f"{path}: signed by an unpinned key ({by}), but {pinned}")
        else:
            problems.append(f"{path}: no signature by a pinned key verifies ({pinned})")
    if problems:
        return SignatureCheck(f"signature fails ({by or 'none verifies'})", problems, tuple(verified))
    how = "pinned" if pins else f"no key pinned: set {PINS_VARIABLE} to require it"
    return SignatureCheck(f"signed by {by} ({how})", [], tuple(verified))
