"""Which contract judges a replayed run folder, and what stops it from being judged.

Evidence carries the contract it was recorded under (canonical text and digest). That embedded copy is not
trusted on its own: its digest must be its text's, every start must carry start-1's, and where the repository
has a contract of the same name, the two must agree, or the verdict says that they differ. A contract named on
the command line either is the recorded one (by path, by name, or as NAME@DIGEST) or the replay is refused:
judging recorded evidence under another contract than it ran under would judge an experiment nobody ran.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..contract import project
from ..contract.schema import Contract, ContractError, load, resolve_path
from ..digests import bytes_sha256
from ..evidence.record import Evidence, EvidenceError
from ..evidence.run_folder import KIND_FOLDERS, PROMPTS_COPY, kind_dir

# NAME@DIGEST: the recorded contract by its digest (a prefix of 12 or more hex digits is enough to name it).
PINNED = re.compile(r"^(?P<name>[^@]+)@(?P<digest>[0-9a-f]{12,64})$")
SHOWN_DIGEST = 12


def recorded_contract(starts: Sequence[Evidence], where: Path) -> Contract:
    """The contract the run was recorded under: start-1's embedded contract, once every other start carries
    the same one. (That each start's digest is its own canonical text's, evidence.read has checked.)"""
    if not starts:
        raise EvidenceError(f"no evidence in {where}: no recorded contract")
    first = starts[0].contract
    try:
        contract = Contract.model_validate(first.canonical, strict=False)
    except ValueError as e:
        raise EvidenceError(
            f"start-{starts[0].start_index} of {where}: the embedded contract is not a valid "
            f"contract ({str(e).splitlines()[0]})"
        ) from e
    for start in starts:
        ref = start.contract
        if ref.digest != first.digest:
            raise EvidenceError(
                f"start-{start.start_index} of {where} was recorded under contract {ref.name} "
                f"{ref.digest[:SHOWN_DIGEST]}, start-1 under {first.name} "
                f"{first.digest[:SHOWN_DIGEST]}: one run is recorded under one contract, so this "
                f"run folder cannot be judged"
            )
        if (ref.name, ref.kind) != (contract.name, contract.kind):
            raise EvidenceError(
                f"start-{start.start_index} of {where} names contract {ref.name} ({ref.kind}), "
                f"its canonical text is {contract.name} ({contract.kind})"
            )
    return contract


def _shown(path: Path) -> str:
    """A repository file as the lab names it (fixtures/contracts/NAME.toml), else its whole path."""
    for base in project.bases():
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)


def _repository_counterpart(recorded: Contract) -> tuple[Contract | None, str | None]:
    """The repository's contract of the same name (a teacher's is derived from its candidate's), and its file;
    (None, why) where the repository has none or it cannot be read."""
    base = recorded.name.removesuffix("-teacher") if recorded.kind == "teacher" else recorded.name
    try:
        path = resolve_path(base)
    except ContractError:
        return None, None
    try:
        found = load(path)
    except ContractError as e:
        return None, f"{path} cannot be read to compare the recorded contract with: {str(e).splitlines()[0]}"
    if recorded.kind == "teacher":
        found = found.teacher()
    return found, _shown(path)


def recorded_before_identity(starts: Sequence[Evidence], where: Path) -> list[str]:
    """The one-line reason a bundle recorded before starts had an identity cannot be promoted (its gates say
    the rest): nothing in it shows that its starts were fresh."""
    old = [f"start-{s.start_index}" for s in starts if s.identity is None]
    if not old:
        return []
    return [
        f"{', '.join(old)} of {where} {'was' if len(old) == 1 else 'were'} recorded before each start had an "
        f"identity (a nonce its ranks echo): nothing shows that {'it was a fresh start' if len(old) == 1 else 'they were fresh starts'}; "
        f"re-record the run"
    ]


def damaged_copies(run_dir: Path, contract: Contract) -> list[str]:
    """Why the verdict cannot promote a run folder whose copy of the prompt set is not the set the contract
    pins (sha256): the replay reads the repository's file where there is one, but the folder is damaged, and
    its verdict must say so."""
    out = []
    for folder in [Path(run_dir), *(kind_dir(run_dir, kind) for kind in KIND_FOLDERS)]:
        copy = folder / PROMPTS_COPY
        if not copy.is_file():
            continue
        seen = bytes_sha256(copy.read_bytes())
        if seen != contract.prompts.sha256:
            out.append(
                f"{copy}, the run's copy of the prompt set it was served, has sha256 {seen[:SHOWN_DIGEST]}, "
                f"but contract {contract.name} pins {contract.prompts.sha256[:SHOWN_DIGEST]} "
                f"(prompts.sha256): the run folder is damaged (edited after the run, or its copy is another set)"
            )
    return out


def judged_contract(starts: Sequence[Evidence], where: Path, named: str | None) -> tuple[Contract, list[str]]:
    """(the contract to judge the replay with, why the verdict cannot promote it). `named` is the session's
    --b70-contract (or ini b70_contract): it must be the recorded contract, else ContractError."""
    recorded = recorded_contract(starts, where)
    short = recorded.digest[:SHOWN_DIGEST]
    pin = f"{recorded.name}@{recorded.digest}"
    if named is not None:
        if (m := PINNED.match(named)) is not None:
            if m["name"] == recorded.name and recorded.digest.startswith(m["digest"]):
                return recorded, []
            raise ContractError(
                f"--b70-contract {named} does not name the contract {where} was recorded under "
                f"({recorded.name}@{short}): a replay is judged under its recorded contract only"
            )
        chosen = load(named)
        if chosen.digest == recorded.digest:
            return recorded, []
        raise ContractError(
            f"--b70-contract {named} is {chosen.name} {chosen.digest[:SHOWN_DIGEST]}, but {where} was recorded under "
            f"{recorded.name} {short}: a replay is judged under the contract it was recorded under, never another. "
            f"Name that one (--b70-contract {pin}), or leave --b70-contract out"
        )
    counterpart, path = _repository_counterpart(recorded)
    if counterpart is None:
        return recorded, [path] if path else []
    if counterpart.digest != recorded.digest:
        return recorded, [
            f"recorded under {recorded.name} {short}, {path} is now {counterpart.digest[:SHOWN_DIGEST]}: "
            f"the contract changed since this evidence was recorded; re-record it, or judge it under "
            f"the recorded contract with --b70-contract {pin}"
        ]
    return recorded, []
