"""Signed seals (issue 48 item 2): a seal signed with a key made in the test verifies; one byte changed anywhere
(a sealed file, SEAL.json re-sealed consistently, the envelope's statement or signature, the public key), an
unpinned key or a missing signature where key ids are pinned, each fails naming why; unsigned, a consistently
re-sealed edit passes only as "unsigned". The seal is a copy of the newest committed seal, sealed again in
today's format."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from pytest_b70lab.cli import main
from pytest_b70lab.records import signing, store
from pytest_b70lab.records.seal import seal, sign

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def signed_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(records root holding a format-2 seal `again` signed by a key of this test, the private key, its id)."""
    base = tmp_path_factory.mktemp("signed")
    newest = max(store.listing(REPO / store.REPRO), key=lambda s: str(s.document.get("sealed_at")))
    copy = base / "copy" / newest.name
    shutil.copytree(newest.folder, copy)
    root = base / "records"
    folder = seal(copy, "again", copy / store.SNAPSHOTS, root=root)
    keyid, _ = signing.generate(base / "keys" / "lab.pem", root / signing.KEYS)
    check = sign(folder, base / "keys" / "lab.pem")
    assert not check.problems and check.signed_by == (keyid,), check
    return root, base / "keys" / "lab.pem", keyid


@pytest.fixture
def signed(signed_once: tuple[Path, Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A fresh copy of the signed seal to edit: (its folder, the key id that signed it)."""
    root, _, keyid = signed_once
    shutil.copytree(root, tmp_path / "records")
    return tmp_path / "records" / "again", keyid


def _reseal_as_a_forger_would(folder: Path) -> None:
    files = store.file_digests(folder)
    document = {**store.read(folder).document, "files": files}
    document["field_digests"] = store.field_digests(document)
    document["digest"] = store.content_digest(document)
    (folder / store.SEAL_FILE).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


def _edit_prompt_file(folder: Path) -> None:
    path = folder / "prompts.jsonl"
    path.write_bytes(path.read_bytes().replace(b"a", b"b", 1))


def test_keys_are_made_private_outside_any_checkout_and_never_overwritten(tmp_path: Path) -> None:
    keyid, public = signing.generate(tmp_path / "home" / "seal.pem", tmp_path / "repro" / "keys")
    assert stat.S_IMODE((tmp_path / "home" / "seal.pem").stat().st_mode) == 0o600
    assert public == tmp_path / "repro" / "keys" / f"{keyid}.pub.json"
    assert signing.public_key(public.parent, keyid).keyid == keyid
    with pytest.raises(signing.SigningError, match="exists: a key is never overwritten"):
        signing.generate(tmp_path / "home" / "seal.pem", tmp_path / "repro" / "keys")
    with pytest.raises(signing.SigningError, match=f"is inside the git checkout {REPO}"):
        signing.generate(REPO / "data" / "never.pem", tmp_path / "keys")
    assert not (REPO / "data" / "never.pem").exists()
    os.chmod(tmp_path / "home" / "seal.pem", 0o644)
    with pytest.raises(signing.SigningError, match="is readable by others \\(mode 644\\): chmod 600 it first"):
        signing.load_signer(tmp_path / "home" / "seal.pem")


def test_a_signed_seal_verifies_naming_its_key_pinned_or_not(
    signed: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, keyid = signed
    monkeypatch.delenv(signing.PINS_VARIABLE, raising=False)
    assert store.verify(folder) == []
    summary = store.signature(store.read(folder)).summary
    assert summary == f"signed by {keyid[:16]} (no key pinned: set {signing.PINS_VARIABLE} to require it)"
    monkeypatch.setenv(signing.PINS_VARIABLE, keyid[:16])
    assert store.verify(folder) == []
    assert main(["records", "verify", str(folder)]) == 0
    assert "again: holds; PROMOTABLE at" in capsys.readouterr().out
    assert store.signature(store.read(folder)).summary == f"signed by {keyid[:16]} (pinned)"


def test_the_statement_covers_every_sealed_file_and_seal_json_with_provenance(signed: tuple[Path, str]) -> None:
    folder, _ = signed
    envelope = json.loads((folder / signing.SIGNATURE_FILE).read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {**store.file_digests(folder), store.SEAL_FILE: store.sha256_file(folder / store.SEAL_FILE)}
    build = statement["predicate"]["buildDefinition"]
    names = {d["name"] for d in build["resolvedDependencies"]}
    patches = {f"patches/{p['name']}" for p in store.read(folder).record()["source"]["patches"]}
    assert patches and patches <= names and {"requirements/lock.txt", "vllm", "torch"} <= names
    assert build["externalParameters"]["contract"] == store.read(folder).document["contract"]
    assert statement["predicate"]["runDetails"]["builder"]["id"].startswith(("urn:pytest-b70lab:host:", "http"))


def _flip_payload(folder: Path) -> None:
    path = folder / signing.SIGNATURE_FILE
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["runDetails"]["builder"]["id"] += "x"
    envelope["payload"] = base64.b64encode(json.dumps(statement, sort_keys=True).encode()).decode()
    path.write_text(json.dumps(envelope))


def _flip_signature(folder: Path) -> None:
    path = folder / signing.SIGNATURE_FILE
    envelope = json.loads(path.read_text())
    raw = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    raw[0] ^= 1
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    path.write_text(json.dumps(envelope))


def _point_keyid_elsewhere(folder: Path) -> None:
    path = folder / signing.SIGNATURE_FILE
    envelope = json.loads(path.read_text())
    envelope["signatures"][0]["keyid"] = "../../keys/" + envelope["signatures"][0]["keyid"]
    path.write_text(json.dumps(envelope))


def _edit_public_key(folder: Path) -> None:
    path = next((folder.parent / signing.KEYS).glob("*.pub.json"))
    data = json.loads(path.read_text())
    data["keyval"]["public"] = ("0" if data["keyval"]["public"][0] != "0" else "1") + data["keyval"]["public"][1:]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_edit_prompt_file, "prompts.jsonl: edited"),
        (
            lambda f: (_edit_prompt_file(f), _reseal_as_a_forger_would(f)),
            "SEAL.json, prompts.jsonl differ since signing",
        ),
        (_flip_payload, "does not verify"),
        (_flip_signature, "does not verify"),
        (_edit_public_key, "the file was edited"),
        (_point_keyid_elsewhere, "is not a key id (64 hex digits)"),
        (lambda f: (f / signing.SIGNATURE_FILE).write_text("{not json"), "is not a DSSE envelope"),
    ],
    ids=["sealed-file", "resealed-consistently", "statement", "signature", "public-key", "key-id", "corrupted"],
)
def test_one_byte_changed_anywhere_fails_naming_why(
    signed: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, edit: object, named: str
) -> None:
    folder, _ = signed
    monkeypatch.delenv(signing.PINS_VARIABLE, raising=False)
    edit(folder)  # type: ignore[operator]
    problems = store.verify(folder)
    assert problems and any(named in p for p in problems), problems
    with pytest.raises(store.SealError, match="does not verify"):
        store.verified(folder)


def test_pins_refuse_an_unsigned_seal_and_an_unpinned_key(
    signed: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, keyid = signed
    other, _ = signing.generate(tmp_path / "other.pem", tmp_path / "other-keys")
    monkeypatch.setenv(signing.PINS_VARIABLE, other)
    assert store.verify(folder) == [
        f"{folder / signing.SIGNATURE_FILE}: signed by an unpinned key ({keyid[:16]}), but "
        f"{signing.PINS_VARIABLE} pins {other[:16]}"
    ]
    # A forger's consistent re-seal, the envelope dropped: unsigned.
    _edit_prompt_file(folder)
    _reseal_as_a_forger_would(folder)
    (folder / signing.SIGNATURE_FILE).unlink()
    assert store.verify(folder) == [
        f"{folder}: unsigned, but {signing.PINS_VARIABLE} pins {other[:16]}: a seal must be signed by one"
    ]
    with pytest.raises(store.SealError, match="unsigned, but"):
        store.run_or_seal(folder)  # what --b70-reproduce and the automatic comparison read through
    monkeypatch.delenv(signing.PINS_VARIABLE)
    assert store.verify(folder) == []
    assert store.signature(store.read(folder)).summary.startswith("unsigned (accidental edits are caught")
    monkeypatch.setenv(signing.PINS_VARIABLE, "not-a-key")
    assert "is not a key id (16 to 64 hex digits" in store.verify(folder)[0]


def test_the_command_line_makes_a_key_and_signs_a_seal(
    signed_once: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, _ = signed_once
    shutil.copytree(root, tmp_path / "records")
    (tmp_path / "records" / "again" / signing.SIGNATURE_FILE).unlink()
    private = tmp_path / "home" / "ci.pem"
    assert main(["keys", "generate", "--private", str(private), "--root", str(tmp_path / "records")]) == 0
    out = capsys.readouterr().out
    keyid = out.split()[1]
    assert f"{signing.PINS_VARIABLE}={keyid}" in out
    assert main(["records", "sign", str(tmp_path / "records" / "again"), "--key", str(private)]) == 0
    assert f"signed again: signed by {keyid[:16]}" in capsys.readouterr().out
    assert main(["records", "--root", str(tmp_path / "records")]) == 0
    assert f"signed by {keyid[:16]}" in capsys.readouterr().out
