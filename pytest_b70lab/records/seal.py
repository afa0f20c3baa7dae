"""Sealing a promoted run folder into repro/NAME/. Everything the seal says of the source state comes from
the evidence, recorded at start time (vLLM and torch versions, each rank's runtime fixes and FP8 path, the
command and environment), except the patch series, which is files of the checkout named by digest. This
machine's paths are replaced by placeholders (a seal is shared and committed), each evidence file re-written
with its digest; the seal is then judged from its own files and teacher snapshots before SEAL.json is written,
so that a seal that would not replay PROMOTABLE is never made."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..contract import project
from ..contract import schema as contract_mod
from ..evidence import record as evidence
from ..evidence import run_folder
from ..evidence.record import Evidence
from ..judge import teacher
from . import derivation, signing, store
from .store import SealError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PATCHES = "patches"
# A seal is committed: bounded so that the repository stays small. The unquantized lane's seal is about 0.8 MB (two
# starts' evidence, 0.35 MB each); the INT4 default's 1.6 MB after 3 passes of 800 tokens (its checkpoint tables
# also hold the moments of the packed weights' 4-bit fields and of their scales, 0.29 MB), and about 2.4 MB after
# the 8 that its gate 7 may serve: each pass adds 0.08 MB of request timings to each start's evidence.
SIZE_LIMIT = 3 * 2**20


def anonymize(text: str, repos: list[Path]) -> str:
    """This machine's paths as placeholders: the virtual environment, the repository (every folder the lab's
    files are looked up in: the working folder, the checkout), the home folder, a start's socket folder."""
    text = text.replace(sys.prefix, "<venv>")
    for repo in sorted({str(r) for r in repos if len(r.parts) > 1}, key=len, reverse=True):
        text = text.replace(repo, "<repo>")
    text = text.replace(str(Path.home()), "<home>")
    return re.sub(re.escape(tempfile.gettempdir()) + r"/b70lab-[A-Za-z0-9_]+", "<socket dir>", text)


def patch_series(folder: Path) -> list[dict[str, str]]:
    """Every mail patch in the checkout's patches/, by name with its sha256."""
    return [{"name": p.name, "sha256": store.sha256_file(p)} for p in sorted(folder.glob("*.patch"))]


def _no_fixes(starts: list[Evidence]) -> list[str]:
    return [
        f"start-{e.start_index} rank {a.get('global_rank')}"
        for e in starts
        for a in e.audits
        if not isinstance(a.get("runtime_fixes"), dict) or not a["runtime_fixes"]
    ]


def _copy_run(run_dir: Path, starts: list[Evidence], into: Path, repo: list[Path]) -> None:
    for e in starts:
        name = f"start-{e.start_index}"
        raw = anonymize((run_dir / name / evidence.FILENAME).read_text(encoding="utf-8"), repo)
        evidence.write(Evidence.model_validate(json.loads(raw)), into / name)
    # The prompt set is pinned by its sha256 (the contract's): copied byte for byte.
    shutil.copyfile(run_dir / run_folder.PROMPTS_COPY, into / run_folder.PROMPTS_COPY)
    for name in (run_folder.TABLES_COPY, run_folder.PROMOTION):
        (into / name).write_text(anonymize((run_dir / name).read_text(encoding="utf-8"), repo), encoding="utf-8")


def _copy_teacher(contract: contract_mod.Contract, snapshots: Path, into: Path, prompt_ids: list[str]) -> None:
    for prompt_id in prompt_ids:
        source = teacher.snapshot_path(snapshots, contract, prompt_id)
        if not source.is_file():
            raise SealError(f"no teacher snapshot {source} for prompt {prompt_id!r}: the oracle cannot be sealed")
        target = into / store.SNAPSHOTS / source.relative_to(snapshots)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _judged(folder: Path, snapshots: Path) -> tuple[bool, str]:
    from ..judge.folder import headline_line, judge_folder

    decision = judge_folder(folder, snapshots)
    return decision.promotable and decision.complete, headline_line(decision, folder)


def seal(run_dir: Path, name: str, snapshots: Path, root: Path | None = None, supersedes: str | None = None) -> Path:
    """repro/NAME/ from the promoted run folder `run_dir`; refuses a run that does not replay PROMOTABLE and
    complete now, a NAME that exists, and evidence without the runtime fixes of every rank."""
    root = root if root is not None else store.records_root()
    if not NAME.match(name):
        raise SealError(f"seal name {name!r}: letters, digits, '.', '_' and '-' only")
    target = root / name
    if target.exists():
        raise SealError(f"{target} exists: a sealed record is never overwritten; choose another --name")
    if supersedes is not None:  # by name, as a reader finds it beside this one
        supersedes = store.verified(store.resolve(supersedes)).name
    starts = run_folder.read_starts(run_dir)
    promotable, headline = _judged(run_dir, snapshots)
    if not promotable:
        raise SealError(f"{run_dir} is not a promotion to seal: {headline}")
    if unrecorded := _no_fixes(starts):
        raise SealError(
            f"{run_dir}: no runtime fixes recorded for {', '.join(unrecorded)} (evidence from before b70lab recorded "
            f"them): run the gates again and seal that run"
        )
    from ..judge.replay import recorded_contract

    contract = recorded_contract(starts, run_dir)
    prompt_ids = [p.id for p in contract_mod.load_prompts(contract, fallback=run_dir / run_folder.PROMPTS_COPY)]
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".sealing-{name}-", dir=root))
    try:
        repo = project.bases()
        _copy_run(run_dir, starts, work, repo)
        _copy_teacher(contract, snapshots, work, prompt_ids)
        (work / store.CONTRACT_FILE).write_text(contract_mod.to_toml(contract), encoding="utf-8")
        if contract_mod.load(work / store.CONTRACT_FILE).digest != contract.digest:
            raise SealError(
                f"the contract written to {store.CONTRACT_FILE} does not load back with digest {contract.digest}"
            )
        patches = patch_series(project.find(PATCHES))
        document = derivation.record(contract, starts, headline, patches)
        text = anonymize(json.dumps(document, indent=1, sort_keys=True) + "\n", repo)
        (work / store.RECORD_FILE).write_text(text, encoding="utf-8")
        promotable, rejudged = _judged(work, work / store.SNAPSHOTS)
        if not promotable:
            raise SealError(f"the seal does not replay PROMOTABLE from its own files: {rejudged}")
        _write_seal_file(work, name, contract, rejudged, supersedes, run_dir)
        work.chmod(0o755)  # mkdtemp's folder is private; a record is shared
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _write_seal_file(
    folder: Path, name: str, contract: contract_mod.Contract, headline: str, supersedes: str | None, run_dir: Path
) -> None:
    files = store.file_digests(folder)
    size = sum((folder / p).stat().st_size for p in files)
    if size > SIZE_LIMIT:
        raise SealError(f"the seal would hold {size / 2**20:.2f} MiB, over {SIZE_LIMIT / 2**20:.0f} MiB")
    document = {
        "schema": store.SCHEMA,
        "version": store.VERSION,
        "name": name,
        "sealed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "run": run_dir.name,
        "contract": {"name": contract.name, "digest": contract.digest},
        "headline": headline,
        "supersedes": supersedes,
        "bytes": size,
        "files": files,
    }
    document["field_digests"] = store.field_digests(document)
    document["digest"] = store.content_digest(document)
    (folder / store.SEAL_FILE).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def sign(folder: Path, key: Path) -> signing.SignatureCheck:
    """Sign the seal of `folder` with the private key file `key`: a DSSE envelope over an in-toto statement of its
    files and SEAL.json (SEAL.dsse.json, replacing an older one). A seal whose files do not hold is never signed.
    Returns what a reader's check says of it now (the public key must be in ROOT/keys/ for it to verify)."""
    sealed = store.verified(folder, signatures=False)
    signer = signing.load_signer(key)
    statement = signing.statement(
        folder,
        sealed.files,
        store.SEAL_FILE,
        sealed.document,
        sealed.record(),
        lock=project.find("requirements/lock.txt"),
        commit=project.commit(),
    )
    signing.sign(folder, statement, signer)
    return store.signature(sealed)
