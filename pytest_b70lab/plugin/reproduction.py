"""--b70-reproduce SEAL: the session launches the sealed contract, refused before any start where this machine
is not the sealed one (unless --b70-accept-drift), and ends with REPRODUCED or NOT REPRODUCED beside the
verdict. Without the option, a live session of a contract that a committed seal holds, on the seal's host
class, doubles as its reproduction, said but never failing the session (make test's gates session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..errors import LabError
from .state import LabState, Settings

SEAL_FOLDER = pytest.StashKey[Path]()
DRIFT = pytest.StashKey[list[str]]()
HOST_NOTE = pytest.StashKey[str]()  # the report header's line: whether the seal's speed will be compared here


def use_sealed_contract(config: pytest.Config) -> None:
    """The seal, verified, and its contract as the session's (a --b70-contract naming another is an error)."""
    from ..contract.schema import load
    from ..records import store

    value = config.getoption("--b70-reproduce")
    try:
        folder = store.verified(store.resolve(value)).folder
        sealed = folder / store.CONTRACT_FILE
        given = Settings.from_config(config).contract
        if given is not None and load(given).digest != load(sealed).digest:
            raise pytest.UsageError(
                f"--b70-reproduce {value} launches the sealed contract ({sealed}); --b70-contract {given} is another"
            )
    except LabError as e:
        raise pytest.UsageError(f"--b70-reproduce {value}: {e}") from None
    config.option.b70_contract = str(sealed)
    config.stash[SEAL_FOLDER] = folder


def refuse_drift(config: pytest.Config, state: LabState) -> None:
    """Before any start: every way this machine differs from the sealed one, refused unless accepted."""
    from ..engine.starts import resolve_models
    from ..records import reproduce, store

    folder = config.stash[SEAL_FOLDER]
    try:
        models = resolve_models(state.contract, state.cache_root)
        here = {
            "target": models.target.model_dump(mode="json"),
            "draft": models.draft.model_dump(mode="json") if models.draft else None,
        }
        seal = store.read(folder)
        drift = reproduce.machine_drift(seal, state.contract, here)
        sealed_on, this_host = reproduce.sealed_host_class(seal), reproduce.this_host_class(state.contract)
    except LabError as e:
        raise pytest.UsageError(f"--b70-reproduce {folder.name}: {e}") from None
    if drift and not config.getoption("--b70-accept-drift"):
        raise pytest.UsageError(
            f"--b70-reproduce {store.REPRO}/{folder.name}: this machine is not the sealed one, nothing was started:\n  "
            + "\n  ".join(drift)
            + "\ngive --b70-accept-drift to reproduce anyway (the verdict then prints each difference)"
        )
    config.stash[DRIFT] = drift
    why = sealed_on.not_compared(this_host, "sealed", "this host")
    config.stash[HOST_NOTE] = (
        f"b70lab: reproducing {store.REPRO}/{folder.name}: tokens, teacher and fixes judged; speed {why}"
        if why
        else f"b70lab: reproducing {store.REPRO}/{folder.name} on its host class: speed compared too"
    )


def reproduction_lines(config: pytest.Config, state: LabState) -> tuple[list[str], bool]:
    """What the session says of reproduction, and whether it fails the session (only --b70-reproduce's NOT
    REPRODUCED does). Also RUN/reproduction.json."""
    from ..records import reproduce, store

    folder = config.stash.get(SEAL_FOLDER, None)
    if folder is None:
        return _doubling_as_reproduction(state), False
    try:
        result = reproduce.judge(folder, state.run_dir, state.contract, config.stash.get(DRIFT, []))
    except LabError as e:
        result = reproduce.Reproduction(f"{store.REPRO}/{folder.name}", False, [f"this run cannot be compared: {e}"])
    (state.run_dir / reproduce.REPORT_FILE).write_text(json.dumps(result.to_dict(), indent=1, sort_keys=True) + "\n")
    return [result.line()], not result.reproduced


def _doubling_as_reproduction(state: LabState) -> list[str]:
    """A live session of a sealed contract compares itself with the newest such seal that no other supersedes: tokens, the sealed
    teacher and the runtime fixes on any host, the speed only on the seal's host class (elsewhere the line says
    why it is not compared). Never fails the session."""
    from ..records import reproduce, store

    if state.replay_dir is not None or not any(state.run_dir.glob("start-*/evidence.json")):
        return []
    try:
        contract = state.contract
        seals = [s for s in store.current(store.listing()) if s.contract_digest() == contract.digest]
        if not seals:
            return []
        seal = max(seals, key=lambda s: str(s.document.get("sealed_at")))
        if problems := store.verify(seal.folder):
            return [f"{store.REPRO}/{seal.name} does not verify, not compared: {problems[0]}"]
        result = reproduce.judge(seal.folder, state.run_dir, contract)
    except LabError as e:
        return [f"no comparison with the committed seal: {e}"]
    return [f"this session doubles as a reproduction (said, never failing the session): {result.line()}"]
