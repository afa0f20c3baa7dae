"""A contract's fresh starts: resolve its models, run each start, keep every observation on disk (the run
folder's layout: run_folder.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import mini
from ..contract import schema as contract_mod
from ..contract.defaults import PROBE_DEADLINE_S
from ..contract.schema import Contract
from ..evidence import checkpoint, host, run_folder
from ..evidence import record as evidence
from ..quality.samples import QualitySample
from . import disk
from .command import ServeConfig, vllm_serve_command
from .environment import engine_environment, xpu_profile_summary
from .live import (
    LiveStart,
    Progress,
    ResolvedModels,
    recorded_environment,
)


def model_folder(source: contract_mod.ModelSource) -> Path:
    """A path model's folder: relative paths are relative to the repository root, like prompt files."""
    assert source.path is not None, "a path source without a path passes no contract validation"
    folder = Path(source.path).expanduser()
    return contract_mod.repo_path(str(folder)).resolve()


def resolve_models(contract: Contract, cache_root: Path) -> ResolvedModels:
    """Local folders for mini and path sources (the mini is built or reused; a missing mini-export folder
    is exported), hub ids as they are; and each checkpoint's table, read from its own files (cached) or,
    for the mini, from its manifest."""
    builds: dict[bool, tuple[Path, dict[str, Any]]] = {}
    tables: dict[str, Any] = {"problems": {}}

    def the_mini(int4: bool = False) -> tuple[Path, dict[str, Any]]:
        """The mini's build: its trained weights, or the W4A16 build of them."""
        if int4 not in builds:
            built = mini.build_int4(cache_root / "mini") if int4 else mini.build(cache_root / "mini")
            builds[int4] = built, mini.verify(built)
        return builds[int4]

    def one(source: contract_mod.ModelSource, part: str) -> tuple[evidence.ModelRef, str | Path]:
        if source.source == "mini":
            mini_folder, mini_manifest = the_mini()
            if contract.kind == "reference":  # the build's plain checkpoint: no KV scheme, no scales
                folder = mini_folder / "reference"
                tables[part] = checkpoint.read_table(folder, cache_root)
            else:
                folder = mini_folder / part
                tables[part] = checkpoint.table_from_mini_manifest(mini_manifest, part)
            return evidence.ModelRef(
                ref=str(folder),
                manifest_digest=mini_manifest["model_digest"],
                manifest_path=str(mini_folder / mini.MANIFEST),
                digest=tables[part]["digest"],
            ), folder
        if source.source == "path":
            folder = model_folder(source)
            # Missing, or an earlier export of another mini (the mark says so): export the current one. A
            # folder without the mark is somebody's checkpoint and is never touched.
            if source.if_missing and (not folder.is_dir() or (folder.parent / mini.EXPORT_MARK).is_file()):
                mini.export_plain(the_mini(int4=source.if_missing == "mini-int4-export")[0], folder.parent)
            if not folder.is_dir():
                raise contract_mod.ContractError(f"contract {contract.name}: {part}.path {folder} is not a folder")
            try:
                tables[part] = checkpoint.read_table(folder, cache_root)
            except checkpoint.CheckpointError as e:
                raise contract_mod.ContractError(f"contract {contract.name}: {part} checkpoint: {e}") from e
            return evidence.ModelRef(ref=str(folder), digest=tables[part]["digest"]), folder
        assert source.hub_id and source.revision, "a hub source needs both to pass contract validation"
        try:  # a hub model is served by id; its table needs the snapshot in the local Hugging Face cache
            tables[part] = checkpoint.read_table(checkpoint.hub_snapshot(source.hub_id, source.revision), cache_root)
        except checkpoint.CheckpointError as e:
            tables[part], tables["problems"][part] = None, str(e)
        return evidence.ModelRef(
            ref=source.hub_id, revision=source.revision, digest=(tables[part] or {}).get("digest")
        ), source.hub_id

    target_ref, target_model = one(contract.target, "target")
    draft_ref, draft_model = one(contract.draft, "draft") if contract.draft else (None, None)
    return ResolvedModels(target_ref, draft_ref, target_model, draft_model, tables)


def serve_config(contract: Contract, models: ResolvedModels) -> ServeConfig:
    e = contract.engine
    spec = contract.speculative
    return ServeConfig(
        model=models.target_model,
        revision=contract.target.revision,
        dtype=e.dtype,
        kv_cache_dtype=e.kv_cache_dtype,
        block_size=e.block_size,
        tensor_parallel=e.tensor_parallel,
        expert_parallel=e.expert_parallel,
        draft=models.draft_model,
        draft_revision=contract.draft.revision if contract.draft else None,
        speculative_method=spec.method if spec else "dflash",
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        max_model_len=e.max_model_len,
        enforce_eager=e.compile_mode == "eager",
        attention_backend=e.attention_backend,
        seed=e.seed,
        tool_call_parser=contract.chat.tool_call_parser if contract.chat else None,
        chat_template=(
            contract_mod.repo_path(contract.chat.chat_template)
            if contract.chat and contract.chat.chat_template
            else None
        ),
        device=e.device,
    )


def describe(contract: Contract, cache_root: Path, run_dir: Path | None = None) -> str:
    """The resolved contract, its digest, and the exact command and environment a start would use."""
    if contract.target.source == "mini":  # where the build will be, without building it
        folder = mini.folder_for(cache_root / "mini")
        models = ResolvedModels(
            evidence.ModelRef(ref=str(folder / "target")),
            None,
            folder / "target",
            folder / "draft" if contract.draft else None,
            {},
        )
    else:
        models = resolve_models(contract, cache_root)
    config = serve_config(contract, models)
    run_dir = run_dir or Path("data/runs/<timestamp>")
    env = engine_environment(Path("<cache>/engine-state"), config.world_size, **_env_kind(contract), materialize=False)
    cmd = vllm_serve_command(config.model_ref, Path("<private 0700 dir>/engine.sock"), config.args())
    shown_env = recorded_environment(env)
    lines = [
        f"contract {contract.name} ({contract.kind})",
        f"digest   {contract.digest}",
        f"teacher  {contract.teacher().name} digest {contract.teacher().digest}",
        "",
        json.dumps(contract.canonical(), indent=2, sort_keys=True),
        "",
        host.fp8_path_line(contract.engine.device, contract.engine.kv_cache_dtype, contract.expect.fp8_attention),
        host.int4_path_line(contract.engine.device, contract.engine.dtype, contract.expect.int4_path),
        f"fresh starts: {contract.reproduction.fresh_starts}, into {run_dir}/start-N/, "
        + (
            f"alive together, the prompts interleaved over {_passes(contract)} passes"
            if contract.reproduction.schedule == "interleaved"
            else "one after the other"
        ),
        "command:",
        "  " + " ".join(_quote(a) for a in cmd),
        "environment (besides the caller's; caches under the cache root's engine-state/):",
        *(f"  {k}={v}" for k, v in shown_env.items()),
    ]
    if contract.engine.device == "xpu":
        lines.append(xpu_profile_summary(config.world_size))
    return "\n".join(lines)


def _env_kind(contract: Contract) -> dict:
    # A contract that expects the portable INT4 path asks every rank for it (in_engine.portable_int4).
    int4 = {"B70LAB_INT4_PATH": "portable"} if contract.expect.int4_path == "portable" else {}
    return {
        "device": contract.engine.device,
        "offline": contract.target.source != "hub" and (contract.draft is None or contract.draft.source != "hub"),
        **({"extra": int4} if int4 else {}),
    }


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./=:,<>+" for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def run_start(
    contract: Contract,
    models: ResolvedModels,
    start_dir: Path,
    state_dir: Path,
    index: int,
    progress: Progress | None = None,
    launches_log: Path | None = None,
    quality: list[QualitySample] | None = None,
    probe: dict | None = None,
    prompt_ids: list[str] | None = None,
) -> evidence.Evidence:
    """One fresh engine start: audit every rank, scrape metrics, stream every prompt (or the `prompt_ids` of
    a smoke run), then (when asked) the quality samples, tear down, and write the evidence (also when any of
    it fails).

    Quality answers ride on the start after its gate requests and after the closing /metrics scrape: they
    cost no extra engine start, and neither the cold-prompt nor the throughput evidence sees them."""
    live = launch(contract, models, start_dir, state_dir, index, progress, launches_log, probe)
    with live.kept():
        live.open()
        for p in live.prompts(prompt_ids):
            live.record.requests.append(live.serve(p))
        live.close(quality)
    return live.record


def launch(
    contract: Contract,
    models: ResolvedModels,
    start_dir: Path,
    state_dir: Path,
    index: int,
    progress: Progress | None = None,
    launches_log: Path | None = None,
    probe: dict | None = None,
) -> LiveStart:
    """A start of `contract` ready to open: its serve command and environment, its evidence record."""
    config = serve_config(contract, models)
    env = engine_environment(state_dir, config.world_size, **_env_kind(contract))
    return LiveStart.launch(contract, models, config, env, start_dir, index, progress, launches_log, probe)


def start_dirs(run_dir: Path, contract: Contract) -> list[Path]:
    return [run_folder.start_dir(run_dir, contract.kind, i) for i in range(1, contract.reproduction.fresh_starts + 1)]


@dataclass(frozen=True)
class ProbeOptions:
    enabled: bool = True
    deadline_s: float = PROBE_DEADLINE_S
    stall_rank: int | None = None  # tests: make this rank stall before the all_reduce


def probe_environment(contract: Contract, cache_root: Path) -> dict[str, str]:
    """The probe's ranks get the environment an engine start of `contract` gets (the same communicator
    switches, device selection and oneCCL settings), so that the probe exercises what the engine will."""
    return engine_environment(cache_root / "engine-state", contract.engine.tensor_parallel, **_env_kind(contract))


def capability_preflight(contract: Contract, progress: Progress | None = None) -> None:
    """What the engine would refuse on this machine for `contract` (capability.preflight: the FP8 attention
    path, memory, /dev/shm, page sizes, the vLLM build, XPU devices, checkpoints), before anything starts.
    Raises CapabilityError, one line per problem: the session's verdict."""
    from .capability import CapabilityError, preflight

    problems = preflight(contract)
    if problems:
        raise CapabilityError(problems)
    (progress or (lambda _msg: None))(f"{contract.name}: capability preflight: nothing this machine would refuse")


def preflight_probe(
    contract: Contract,
    run_dir: Path,
    cache_root: Path,
    progress: Progress | None = None,
    stall_rank: int | None = None,
    deadline_s: float = PROBE_DEADLINE_S,
) -> dict:
    """The collective probe before a run folder's first engine start (once per run folder: a later kind in
    the same session reuses a passed probe). Raises ProbeError, with every rank's state, when it fails."""
    from .probe import PROBE_FILE, ProbeError, probe_collectives

    folder = run_dir / run_folder.PROBE_DIR
    done = folder / PROBE_FILE
    if done.is_file() and stall_rank is None:
        recorded = evidence.read_json(done, "collective probe result", evidence.EvidenceError)
        if (
            isinstance(recorded, dict)
            and recorded.get("passed")
            and recorded.get("world_size") == contract.engine.tensor_parallel
        ):
            return recorded
    say = progress or (lambda _msg: None)
    world = contract.engine.tensor_parallel
    say(f"{contract.name}: collective probe over {world} ranks")
    result = probe_collectives(
        world, folder, probe_environment(contract, cache_root), deadline_s=deadline_s, stall_rank=stall_rank
    )
    for line in result.lines():
        say(line)
    if not result.passed:
        raise ProbeError(
            "collective probe failed: " + "; ".join(line.strip() for line in result.lines()[1:]) + f" ({done})"
        )
    return result.as_dict()


def write_run_files(folder: Path, contract: Contract, models: ResolvedModels) -> None:
    """What makes a run folder self-contained: replay needs neither the model nor the repository's prompt
    file (the checkpoint tables the audits compare with, and the prompt set as it was)."""
    folder.mkdir(parents=True, exist_ok=True)
    tables = {"contract_digest": contract.digest, **models.tables}
    (folder / run_folder.TABLES_COPY).write_text(json.dumps(tables, indent=1, sort_keys=True) + "\n")
    (folder / run_folder.PROMPTS_COPY).write_bytes(contract_mod.prompts_path(contract).read_bytes())


@dataclass(frozen=True)
class StartRequest:
    """What a kind's fresh starts are asked for: the contract (candidate, teacher or reference), where their run
    folder and caches are, how progress is said, how many starts (None: the contract's), the quality samples to
    ask on start-1, the preflights, and the prompts (None: the whole set)."""

    contract: Contract
    run_dir: Path
    cache_root: Path
    progress: Progress | None = None
    starts: int | None = None
    quality: list[QualitySample] | None = None
    probe: ProbeOptions | None = None
    prompt_ids: list[str] | None = None


def run_starts(request: StartRequest) -> list[evidence.Evidence]:
    """Every fresh start of the request's contract; quality samples (if any) are asked on start-1 only: the later
    starts exist to reproduce the gate evidence. The capability preflight comes first (milliseconds), then the
    models are checked (seconds), then the preflight probe runs (its result goes into each start's evidence),
    then the starts. --b70-no-probe turns off both preflights."""
    contract, run_dir, cache_root, progress, probe = (
        request.contract,
        request.run_dir,
        request.cache_root,
        request.progress,
        request.probe,
    )
    preflights = probe is not None and probe.enabled
    if preflights:
        capability_preflight(contract, progress)
    models = resolve_models(contract, cache_root)
    if not preflights:
        probe_result = {
            "skipped": "the preflight collective probe and the capability preflight were turned off (--b70-no-probe)"
        }
    else:
        assert probe is not None
        probe_result = preflight_probe(contract, run_dir, cache_root, progress, probe.stall_rank, probe.deadline_s)
    # The evidence of a start that fills the disk still has room (disk.py); one reserve per kind, in the
    # kind's folder: xdist workers can collect the candidate and its teacher at once.
    reserve_dir = run_folder.kind_dir(run_dir, contract.kind)
    disk.hold_reserve(reserve_dir)
    try:
        return _launch_starts(
            contract,
            run_dir,
            reserve_dir,
            cache_root,
            models,
            probe_result,
            progress,
            request.starts,
            request.quality,
            request.prompt_ids,
        )
    finally:
        disk.drop_reserve(reserve_dir)


def _launch_starts(
    contract: Contract,
    run_dir: Path,
    kind_dir: Path,
    cache_root: Path,
    models: ResolvedModels,
    probe_result: dict,
    progress: Progress | None,
    starts: int | None,
    quality: list[QualitySample] | None,
    prompt_ids: list[str] | None,
) -> list[evidence.Evidence]:
    try:
        write_run_files(kind_dir, contract, models)
    except OSError as e:
        if not disk.is_full(e):
            raise
        failed = Path(e.filename) if e.filename else kind_dir / run_folder.TABLES_COPY
        raise disk.DiskFullError(f"no start was launched: {disk.full_message(failed, e, run_dir)}") from None
    if contract.reproduction.schedule == "interleaved" and (starts or 2) >= 2:
        from .interleave import run_interleaved

        state, log = cache_root / "engine-state", run_dir / run_folder.LAUNCHES_LOG
        lives = [
            launch(contract, models, d, state, i, progress, log, probe_result)
            for i, d in enumerate(start_dirs(run_dir, contract), 1)
        ]
        return run_interleaved(lives, contract.reproduction.passes, quality, prompt_ids)
    records: list[evidence.Evidence] = []
    for i, d in enumerate(start_dirs(run_dir, contract)[: starts or None], 1):
        records.append(
            run_start(
                contract,
                models,
                d,
                cache_root / "engine-state",
                i,
                progress,
                run_dir / run_folder.LAUNCHES_LOG,
                quality if i == 1 else None,
                probe_result,
                prompt_ids,
            )
        )
        if records[-1].status != "ok":
            break  # nothing can be promoted past a failed start: do not spend another start on it
    return records


def run_starts_once(request: StartRequest) -> list[evidence.Evidence]:
    """Collect under a file lock: the first pytest-xdist worker to get it runs the engine, every other one
    (and any later call) reads the evidence it wrote."""
    from filelock import FileLock

    contract, run_dir, quality, prompt_ids = request.contract, request.run_dir, request.quality, request.prompt_ids
    run_dir.mkdir(parents=True, exist_ok=True)
    mark = run_dir / run_folder.DONE_MARK.format(kind=contract.kind)
    with FileLock(str(run_dir / f".collect-{contract.kind}.lock")):
        if mark.exists():
            done = json.loads(mark.read_text())
            if done.get("contract_digest") != contract.digest:
                raise evidence.EvidenceError(
                    f"{run_dir} holds evidence of contract digest {done.get('contract_digest')}, "
                    f"not {contract.name} ({contract.digest}): use a new --b70-run-dir"
                )
            if done.get("prompts") != prompt_ids:
                raise evidence.EvidenceError(
                    f"{run_dir} holds {contract.kind} evidence of prompts {done.get('prompts') or 'all'}, this "
                    f"session asks for {prompt_ids or 'all'}: use a new --b70-run-dir"
                )
            if quality and not done.get("quality"):
                raise evidence.EvidenceError(
                    f"{run_dir} holds {contract.kind} evidence collected without quality samples: "
                    f"use a new --b70-run-dir to judge quality"
                )
            return [evidence.read(run_dir / rel) for rel in done["starts"]]
        records = run_starts(request)
        mark.write_text(
            json.dumps(
                {
                    "contract": contract.name,
                    "contract_digest": contract.digest,
                    "quality": bool(quality),
                    "prompts": prompt_ids,
                    "starts": [str(d.relative_to(run_dir)) for d in start_dirs(run_dir, contract)[: len(records)]],
                }
            )
            + "\n"
        )
        return records


def tables_or_why(run_dir: Path, contract: Contract, cache_root: Path) -> dict[str, Any] | str:
    """checkpoint_tables, or why they cannot be read: what the catalogue's gates are given (those that read
    the tables then fail with the reason; the others are judged)."""
    try:
        return checkpoint_tables(run_dir, contract, cache_root)
    except evidence.EvidenceError as e:
        return str(e)


# What a table copy must share with its checkpoint's table (not "read": how long reading took, nor "source").
TABLE_IDENTITY = ("files", "digest", "tensors", "kv_scales", "kv_scale_count", "kv_scale_digest", "quantization")


def checkpoint_tables(run_dir: Path, contract: Contract, cache_root: Path) -> dict[str, Any]:
    """The checkpoint tables a run was judged against: the run folder's copy (written before its first
    start, for this contract: run_folder.read_tables), held to each checkpoint that is on this machine
    (`checked` says, per part, whether it was or was taken on trust), else read anew from the checkpoints
    the contract names."""
    if (tables := run_folder.read_tables(run_dir, contract)) is not None:
        return _held_to_checkpoints(tables, run_dir, contract, cache_root)
    try:
        return resolve_models(contract, cache_root).tables
    except (contract_mod.ContractError, mini.MiniModelError) as e:
        return {"target": None, "draft": None, "problems": {"target": str(e), "draft": str(e)}}


def tables_at_hand(contract: Contract, cache_root: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each part's table recomputed from its checkpoint where that is on this machine, building, exporting
    and downloading nothing (a replay stays quick: a folder's files are read through the table cache); for
    each other part, why not."""
    found: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    parts = [("target", contract.target)] + ([("draft", contract.draft)] if contract.draft else [])
    for part, source in parts:
        try:
            if source.source == "mini":
                folder = mini.folder_for(cache_root / "mini")
                if not (folder / mini.MANIFEST).is_file():
                    missing[part] = (
                        f"the mini {folder.name} is not built under {cache_root / 'mini'} (b70lab mini build)"
                    )
                    continue
                manifest = mini.verify(folder)
                found[part] = (
                    checkpoint.read_table(folder / "reference", cache_root)
                    if contract.kind == "reference"
                    else checkpoint.table_from_mini_manifest(manifest, part)
                )
            elif source.source == "path":
                folder = model_folder(source)
                if not folder.is_dir():
                    missing[part] = f"{part}.path {folder} is not on this machine"
                    continue
                found[part] = checkpoint.read_table(folder, cache_root)
            else:
                assert source.hub_id and source.revision
                found[part] = checkpoint.read_table(checkpoint.hub_snapshot(source.hub_id, source.revision), cache_root)
        except (checkpoint.CheckpointError, mini.MiniModelError, contract_mod.ContractError) as e:
            missing[part] = str(e).splitlines()[0]
    return found, missing


def _as_recorded(mine: Any, copy: Any) -> Any:
    """A recomputed tensor table in the form a copy recorded it: a copy written before tables kept shard moments
    and the 4-bit fields of packed words is held to what it has (each entry's keys and moment keys that it
    recorded), never given a pass on a value it has."""
    if not (isinstance(mine, dict) and isinstance(copy, dict)):
        return mine
    out = {}
    for name, entry in mine.items():
        had = copy.get(name)
        if isinstance(had, dict) and isinstance(entry, dict):
            entry = {k: v for k, v in entry.items() if k in had}
            if isinstance(entry.get("moments"), dict) and isinstance(had.get("moments"), dict):
                entry["moments"] = {k: v for k, v in entry["moments"].items() if k in had["moments"]}
        out[name] = entry
    return out


def _held_to_checkpoints(tables: dict[str, Any], run_dir: Path, contract: Contract, cache_root: Path) -> dict[str, Any]:
    """The copy, once each part whose checkpoint is at hand matches it; an EvidenceError naming the first
    difference otherwise (a copy edited to agree with edited evidence, or a checkpoint changed since)."""
    path = run_folder.tables_path(run_dir, contract)
    found, missing = tables_at_hand(contract, cache_root)
    checked: dict[str, str] = {}
    for part in ("target", "draft"):
        copy = tables.get(part)
        if not isinstance(copy, dict):
            continue
        mine = found.get(part)
        source = contract.target if part == "target" else contract.draft
        if (
            mine is not None
            and source is not None
            and source.source == "mini"
            and mine.get("source") != copy.get("source")
        ):
            # another build of the mini (another recipe or library versions): not this run's checkpoint
            missing[part] = f"the mini at hand is {mine.get('source')}, the run's was {copy.get('source')}"
            mine = None
        if mine is None:
            checked[part] = f"taken on trust: {missing.get(part, 'no checkpoint at hand')}"
            continue
        mine = {**mine, "tensors": _as_recorded(mine.get("tensors"), copy.get("tensors"))}
        differs = [key for key in TABLE_IDENTITY if copy.get(key) != mine.get(key)]
        if differs:
            detail = ""
            if "tensors" in differs and isinstance(copy.get("tensors"), dict):
                names = sorted(
                    n
                    for n in set(copy["tensors"]) | set(mine["tensors"])
                    if copy["tensors"].get(n) != mine["tensors"].get(n)
                )
                detail = f" (tensor {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "") + ")"
            raise evidence.EvidenceError(
                f"checkpoint tables {path}: the {part} table is not its checkpoint's ({mine.get('source')}): "
                f"{', '.join(differs)} differ{detail}. The copy was edited, or the checkpoint changed after the "
                f"run; no gate is judged against it"
            )
        checked[part] = f"recomputed from {mine.get('source')}"
    return {**tables, "checked": checked}


def _passes(contract: Contract) -> str:
    low, high = contract.reproduction.pass_range
    return str(low) if low == high else f"{low} to {high} (until the paired interval is decided)"
