"""The session's state and what it judges: every option and ini value read once, the contract loaded on
first use, and the prompt and quality sets the gates are parametrized by."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the plugin loads wherever it is installed: a run that never asks for a gate pays no import
    from ..contract import schema as contract_mod
    from ..evidence import record as evidence_mod


GATE_TEST_PROPERTY = "b70_gate_test"
GATE_PROPERTY, SUBJECT_PROPERTY = "b70_gate", "b70_subject"
# The candidate's paired speed-up over its target-only start (--b70-speedup), as JSON: read back from the
# report of the test that measured it, also from an xdist worker.
SPEEDUP_PROPERTY = "b70_speedup"
# A test may state a measured finding (a kernel's rounding, its q12/q1 difference) under this property: it
# is printed in the terminal summary, also when the test ran on an xdist worker.
FINDING_PROPERTY = "b70_finding"
WORKER_RUN_DIR = "b70lab_run_dir"
# The file in the run folder that the first xdist worker to meet a failed start claims (block_session).
WORKER_BLOCK_MARK = "b70lab_block_mark"
# A quality test names the figure it judges (e.g. "long_context/near-max"): the quality verdict needs all.
QUALITY_PROPERTY = "b70_quality_figure"
# The sandbox layers the figure's generated code ran in (space-separated), and whether running it with no OS
# layer was allowed: the quality verdict prints them, promotion.json keeps them.
SANDBOX_PROPERTY, UNISOLATED_PROPERTY = "b70_sandbox_layers", "b70_sandbox_unisolated_allowed"
NO_QUALITY = "not-judgeable"
# Set on the report of the test that found the session cannot go on (a start that could not begin or
# failed): the verdict, also on the xdist controller, then reads as that one cause.
BLOCKED_PROPERTY = "b70_blocked"
# A test that needs one of these is judged from an engine start's evidence: after a failed start it does not run.
ENGINE_EVIDENCE = ("b70_evidence", "b70_teacher_evidence", "b70_reference_evidence")


@dataclass(frozen=True)
class Settings:
    """Every b70lab option and ini value a session reads, read once (an option overrides the ini; a path in the
    ini is relative to the ini file)."""

    contract: str | None  # --b70-contract, else the ini's b70_contract; None: the embedded default
    replay_dir: Path | None  # --b70-evidence
    run_dir: Path | None  # --b70-run-dir
    runs_root: Path  # where each session makes its <timestamp> run folder (and --b70-baseline last looks)
    cache_dir: Path | None  # --b70-cache-dir, else b70_cache_dir
    gates_dir: Path | None  # b70_gates_dir
    prompt_ids: list[str] | None  # --b70-prompts: only these prompts are asked and judged
    probe: bool  # not --b70-no-probe
    probe_deadline_s: float
    probe_stall_rank: int | None
    updating_snapshots: bool  # syrupy's --snapshot-update

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        replay = config.getoption("--b70-evidence")
        prompts = config.getoption("--b70-prompts", None)
        return cls(
            contract=_contract_setting(config),
            replay_dir=replay.resolve() if replay else None,
            run_dir=config.getoption("--b70-run-dir"),
            runs_root=_ini_path(config, "b70_runs_dir") or Path(config.rootpath) / "data" / "runs",
            cache_dir=config.getoption("--b70-cache-dir") or _ini_path(config, "b70_cache_dir"),
            gates_dir=_ini_path(config, "b70_gates_dir"),
            prompt_ids=[v.strip() for v in prompts.split(",") if v.strip()] if prompts else None,
            probe=not config.getoption("--b70-no-probe"),
            probe_deadline_s=config.getoption("--b70-probe-deadline"),
            probe_stall_rank=config.getoption("--b70-probe-stall"),
            updating_snapshots=bool(getattr(config.option, "update_snapshots", False)),
        )


def _ini_path(config: pytest.Config, name: str) -> Path | None:
    value = str(config.getini(name) or "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else (config.inipath.parent if config.inipath else config.rootpath) / path


def _contract_setting(config: pytest.Config) -> str | None:
    """--b70-contract, else the ini's b70_contract (a TOML path there is relative to the ini file)."""
    if config.getoption("--b70-contract") is not None:
        return str(config.getoption("--b70-contract"))
    value = str(config.getini("b70_contract") or "").strip()
    if value.endswith(".toml"):
        return str(_ini_path(config, "b70_contract"))
    return value or None


# The label a kind's failed start is named with in the session's one failure.
KIND_LABELS = {"candidate": "", "teacher": "teacher ", "reference": "reference "}


@dataclass
class LabState:
    """Per-process state: the settings, the contract (loaded on first use) and the collected evidence. Built
    once, in pytest_configure (from_config); the hooks and fixtures call its methods."""

    config: pytest.Config
    settings: Settings
    run_dir: Path
    _contract: contract_mod.Contract | None = None
    _evidence: list[evidence_mod.Evidence] | None = None
    # Set at collection: a selected test judges quality, so the starts ask the quality samples too.
    wants_quality: bool = False
    # quality (scores, texts) by evidence digest (coding runs code once)
    _scores: dict[str, tuple[dict, dict]] | None = None
    # the sandbox layers every run of generated code had in this process (None: none ran), and the allowance
    sandbox_layers: list[str] | None = None
    unisolated_allowed: bool = False
    _tables: dict | str | None = None  # the checkpoint tables the gates read, or why they cannot be read
    blocked: str | None = None  # why no test that needs an engine's evidence can run (see block_session)
    stop_reason: str | None = None  # why the session stopped before it could judge (promotion.json says it)
    blocked_reported: bool = False
    block_mark: Path | None = None  # on an xdist worker: the session's marker of who reported the block
    _extra_gates: dict[str, str] | None = None
    _added_catalogue: dict[str, Any] | None = None
    # Why a replay cannot be promoted whatever its gates say (replay.judged_contract, a bundle recorded before
    # starts had an identity): the verdict's problems.
    contract_problems: list[str] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: pytest.Config) -> LabState:
        """The session's state from its options and ini: the run folder is the controller's on an xdist worker,
        the replayed folder, the one --b70-run-dir names, or a new <timestamp> folder under the runs folder."""
        import time

        settings = Settings.from_config(config)
        worker = getattr(config, "workerinput", None) or {}
        if worker.get(WORKER_RUN_DIR):
            run_dir = Path(worker[WORKER_RUN_DIR])
        elif settings.replay_dir is not None:
            run_dir = settings.replay_dir
        else:
            run_dir = (settings.run_dir or settings.runs_root / time.strftime("%Y%m%d-%H%M%S")).resolve()
        return cls(
            config=config,
            settings=settings,
            run_dir=run_dir,
            block_mark=Path(worker[WORKER_BLOCK_MARK]) if worker.get(WORKER_BLOCK_MARK) else None,
        )

    @property
    def extra_gates(self) -> dict[str, str]:
        """The gates other plugins add ({name: scope}: hookspecs pytest_b70lab_gates and
        pytest_b70lab_catalogue), asked once."""
        if self._extra_gates is None:
            self._extra_gates = self._declared_gates()
        return self._extra_gates

    @property
    def added_catalogue(self) -> dict[str, Any]:
        """The catalogue entries (catalogue.Gate) other plugins add (pytest_b70lab_catalogue), by name."""
        if self._added_catalogue is None:
            self._added_catalogue = {}
            for answer in self.config.hook.pytest_b70lab_catalogue(config=self.config):
                for gate in answer or ():
                    if gate.declared_scope is None:
                        pytest.exit(
                            f"b70lab: a plugin's pytest_b70lab_catalogue: gate {gate.name!r} declares no scope "
                            "(catalogue.Gate(..., declared_scope='rank' | 'prompt' | 'start' | 'run'))",
                            returncode=pytest.ExitCode.USAGE_ERROR,
                        )
                    self._added_catalogue[gate.name] = gate
        return self._added_catalogue

    @property
    def replay_dir(self) -> Path | None:
        """The run folder replayed (--b70-evidence), or None for a live session."""
        return self.settings.replay_dir

    @property
    def contract_name(self) -> str:
        from ..contract.defaults import DEFAULT_CONTRACT

        return self.settings.contract or DEFAULT_CONTRACT

    @property
    def cache_root(self) -> Path:
        from ..mini.build import default_cache_root

        return (self.settings.cache_dir or default_cache_root()).resolve()

    @property
    def contract(self) -> contract_mod.Contract:
        # `from ..contract import`, like lab_errors: pytester's in-process runs drop modules from sys.modules
        # but not from the package's attributes, and `from .. import contract` would then get a stale module
        # whose errors lab_errors does not catch.
        from ..contract.schema import load

        if self._contract is None:
            if self.replay_dir is not None:
                from ..judge.replay import damaged_copies, judged_contract, recorded_before_identity

                starts = self.replay_evidence()
                self._contract, problems = judged_contract(starts, self.replay_dir, self.settings.contract)
                self.contract_problems = (
                    problems
                    + recorded_before_identity(starts, self.replay_dir)
                    + damaged_copies(self.replay_dir, self._contract)
                )
            else:
                self._contract = load(self.contract_name)
        return self._contract

    def tables_checked(self) -> dict[str, str]:
        """Per checkpoint part, whether the run folder's table copy was held to its checkpoint or taken on
        trust (the verdict says which); {} where the tables cannot be read (their gates fail saying why)."""
        try:
            from ..engine.starts import tables_or_why

            tables = (
                self._tables
                if self._tables is not None
                else tables_or_why(self.run_dir, self.contract, self.cache_root)
            )
        except lab_errors():
            return {}
        checked = tables.get("checked") if isinstance(tables, dict) else None
        return dict(checked) if isinstance(checked, dict) else {}

    def _declared_gates(self) -> dict[str, str]:
        """The gates other plugins declare ({name: scope}), each checked against the catalogue."""
        from ..judge import catalogue

        declared: dict[str, str] = {}
        answers = [
            *self.config.hook.pytest_b70lab_gates(config=self.config),
            {n: g.scope for n, g in self.added_catalogue.items()},
        ]
        for answer in answers:
            for name, scope in dict(answer or {}).items():
                if name in catalogue.SCOPES:
                    problem = f"{name!r} is a gate of the catalogue already"
                elif scope not in catalogue.SCOPE_NAMES:
                    problem = f"gate {name!r} has scope {scope!r}; a scope is one of {', '.join(catalogue.SCOPE_NAMES)}"
                elif declared.get(name, scope) != scope:
                    problem = f"gate {name!r} is declared with two scopes, {declared[name]!r} and {scope!r}"
                else:
                    declared[name] = scope
                    continue
                pytest.exit(
                    f"b70lab: a plugin's pytest_b70lab_gates: {problem}", returncode=pytest.ExitCode.USAGE_ERROR
                )
        return declared

    def contract_or_usage_error(self) -> contract_mod.Contract:
        try:
            return self.contract
        except lab_errors() as e:
            self.stop_reason = str(e)
            raise pytest.UsageError(str(e)) from e

    def contract_or_exit(self) -> contract_mod.Contract:
        """During collection a UsageError would become a collection traceback: end the run with the message."""
        try:
            return self.contract
        except lab_errors() as e:
            self.stop_reason = str(e)
            pytest.exit(f"b70lab: {e}", returncode=pytest.ExitCode.USAGE_ERROR)

    def prompts(self, contract: contract_mod.Contract, selected: bool = False) -> list[contract_mod.Prompt]:
        """The contract's prompt set (never the evidence's requests: a prompt missing there must still be
        judged). A replayed run folder carries a copy, checked against the same pinned sha256. `selected`: only
        the prompts --b70-prompts names (the required pairs always come from the whole set)."""
        from ..contract import schema
        from ..evidence.run_folder import PROMPTS_COPY

        copy = self.replay_dir / PROMPTS_COPY if self.replay_dir is not None else None
        prompts = schema.load_prompts(contract, fallback=copy)
        return schema.select_prompts(prompts, self.settings.prompt_ids, "--b70-prompts") if selected else prompts

    def quality_for(self, contract: contract_mod.Contract) -> list[Any] | None:
        """The samples a start must also ask: only when a selected test judges quality."""
        if not self.wants_quality or contract.quality is None:
            return None
        try:
            return quality_set(contract)
        except NoQuality:
            return None  # the quality tests fail with the reason; the gate evidence is collected as always

    def probe_options(self) -> Any:
        from ..engine.starts import ProbeOptions

        s = self.settings
        return ProbeOptions(enabled=s.probe, deadline_s=s.probe_deadline_s, stall_rank=s.probe_stall_rank)

    def kind_contract(self, kind: str) -> contract_mod.Contract:
        """The contract a kind of start runs: the candidate, its teacher (target only) or its unquantized-KV
        reference."""
        if kind == "teacher":
            return self.contract.teacher()
        if kind == "reference":
            return self.contract.unquantized_kv_reference()
        return self.contract

    def evidence(self, kind: str) -> list[evidence_mod.Evidence]:
        """A kind's evidence: read from the replayed run folder, or launched once per session (once across xdist
        workers). The candidate's fresh starts ask the selected prompts and, when a quality test is selected,
        the quality samples; the teacher is one start; the reference is one start asking the quality samples."""
        from ..engine.starts import StartRequest, run_starts_once
        from ..evidence.run_folder import read_starts

        contract = self.kind_contract(kind)
        if self.replay_dir is not None:
            return self.replay_evidence() if kind == "candidate" else read_starts(self.replay_dir, kind=kind)[:1]
        if kind == "candidate":
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.say(f"run folder {self.run_dir}")
        quality = quality_samples(self.contract) if kind == "reference" else self.quality_for(contract)
        return run_starts_once(
            StartRequest(
                contract,
                self.run_dir,
                self.cache_root,
                self.say,
                starts=None if kind == "candidate" else 1,
                quality=quality,
                probe=self.probe_options(),
                prompt_ids=self.settings.prompt_ids if kind == "candidate" else None,
            )
        )

    def replay_evidence(self) -> list[evidence_mod.Evidence]:
        from ..evidence.run_folder import read_starts

        assert self.replay_dir is not None
        if self._evidence is None:
            self._evidence = read_starts(self.replay_dir)
        return self._evidence

    def say(self, message: str) -> None:
        """A progress line on the terminal. An xdist worker's terminal output is discarded by xdist, so a
        worker also appends the line to RUN/progress.log, which the controller relays (workers.ProgressRelay)."""
        worker = getattr(self.config, "workerinput", None)
        if worker is not None and worker.get(WORKER_RUN_DIR):
            from ..evidence.run_folder import PROGRESS_LOG

            line = f"[{worker.get('workerid', '?')}] {message}"
            try:
                with open(self.run_dir / PROGRESS_LOG, "a", encoding="utf-8") as log:
                    log.write(line.replace("\n", " ") + "\n")  # one write of one line: appends do not interleave
            except OSError:
                pass  # progress is a courtesy: a full disk must not fail a gate
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        with capman.global_and_fixture_disabled() if capman else nullcontext():
            reporter.write_line(f"b70lab: {message}")


STATE = pytest.StashKey[LabState]()


def lab_errors() -> tuple[type[Exception], ...]:
    """A bad contract or evidence file: what the fixtures turn into one clear message (imported on demand)."""
    from ..contract.schema import ContractError
    from ..evidence.record import EvidenceError

    return ContractError, EvidenceError


class NoQuality(Exception):
    """The contract cannot judge gate 8 (no [quality] table, or its prompt set is missing or changed)."""


def quality_set(contract: contract_mod.Contract) -> list:
    from ..contract import schema as contract_mod
    from ..quality import samples

    if contract.quality is None:
        raise NoQuality(
            f"contract {contract.name} has no [quality] table: gate 8 (-m quality) needs its quality "
            f"prompt set and tolerances"
        )
    q = contract.quality
    try:
        return samples.load(contract_mod.repo_path(q.file), q.sha256, q.count)
    except samples.QualityPromptError as e:
        raise NoQuality(f"contract {contract.name}, field quality.file: {e}") from e


def quality_samples(contract: contract_mod.Contract) -> list:
    try:
        return quality_set(contract)
    except NoQuality as e:
        pytest.fail(str(e), pytrace=False)


def quality_keys(contract: contract_mod.Contract) -> dict:
    """Figures to parametrize by. Collection never stops here: a contract that cannot judge quality gets one
    placeholder figure that fails with the reason if it is selected (`-m gates` deselects it quietly)."""
    from ..quality import judge

    try:
        return judge.keys_by_figure(quality_set(contract))
    except NoQuality:
        return {NO_QUALITY: []}


def model_errors() -> tuple[type[Exception], ...]:
    """What stops a start before it begins besides a bad contract: the model, the preflight probe, the
    capability preflight."""
    from ..engine.capability import CapabilityError
    from ..engine.probe import ProbeError
    from ..mini import MiniModelError

    return MiniModelError, ProbeError, CapabilityError
