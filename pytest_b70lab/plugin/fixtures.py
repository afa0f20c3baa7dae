"""The fixtures gate, quality and engine tests ask for; a failed start blocks the session once (one failure,
one verdict line), not once per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from .state import (
    GATE_PROPERTY,
    KIND_LABELS,
    SANDBOX_PROPERTY,
    STATE,
    SUBJECT_PROPERTY,
    UNISOLATED_PROPERTY,
    LabState,
    lab_errors,
    model_errors,
    quality_samples,
)
from .workers import blocked_reason, claim_block, sigterm_as_interrupt

if TYPE_CHECKING:  # the plugin loads wherever it is installed: a run that never asks for a gate pays no import
    from ..contract import schema as contract_mod
    from ..evidence import record as evidence_mod
    from ..judge import catalogue as catalogue_mod


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def b70_state(pytestconfig: pytest.Config) -> LabState:
    return pytestconfig.stash[STATE]


@pytest.fixture(scope="session")
def b70_contract(b70_state: LabState) -> contract_mod.Contract:
    try:
        return b70_state.contract
    except lab_errors() as e:
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
    from .. import mini

    try:
        return mini.build(b70_cache_root / "mini")
    except mini.MiniModelError as e:
        pytest.fail(str(e), pytrace=False)


def block_session(request: pytest.FixtureRequest, state: LabState, message: str) -> NoReturn:
    """Nothing that needs an engine's evidence can be judged after this. The first test of the session to
    meet it fails with `message`, and its report carries the message to the verdict
    (`pytest_runtest_makereport`): one failure and one verdict line, not one error per gate test. Under xdist
    that is the first worker to claim the session's marker in the run folder; another worker's test that
    meets the same failed start is skipped. Every later test that needs an engine's evidence is skipped, on
    every worker, with the message as its reason (`pytest_runtest_setup`); all other tests of the session
    (unit, kernel, quality-logic tests) run and report as ever."""
    claimed, first = claim_block(state, message)
    state.blocked = first
    if claimed:
        pytest.fail(message, pytrace=False)
    state.blocked_reported = True  # another worker's test reports it
    pytest.skip(blocked_reason(first))


def collect_or_block(request: pytest.FixtureRequest, state: LabState, kind: str) -> list[evidence_mod.Evidence]:
    """A kind's evidence (LabState.evidence), or one failure that names the start, the cause and where to look:
    a start that could not begin (a model that fails its manifest, a missing checkpoint), or one that failed."""
    from ..engine.logs import failure_headline
    from ..judge.folder import blocked_by

    label = KIND_LABELS[kind]
    cause = None
    try:
        with sigterm_as_interrupt():
            records = state.evidence(kind)
    except lab_errors() + model_errors() as e:
        cause = str(e)
    except Exception as e:  # a defect of ours: the cause in one line, the traceback in a file
        import traceback

        state.run_dir.mkdir(parents=True, exist_ok=True)
        where = state.run_dir / "session-error.txt"
        where.write_text("".join(traceback.format_exception(e)))
        cause = f"{type(e).__name__}: {e} (traceback: {where})"
    if cause is not None:  # outside the except clause: the message alone, no chained traceback
        block_session(request, state, f"{label}start-1 could not begin: {cause}")
    # The in-process judge stops on the same message (judge.blocked_by): one wording for both.
    if (blocked := blocked_by(records, state.replay_dir or state.run_dir, failure_headline)) is not None:
        block_session(request, state, f"{label}{blocked}")
    return records


def one_start_of(request: pytest.FixtureRequest, state: LabState, kind: str) -> evidence_mod.Evidence:
    """The one start of the teacher or the reference: replayed as recorded (a folder without it fails the test
    that asks), launched as the candidate's starts are."""
    try:
        state.kind_contract(kind)
        if state.replay_dir is not None:
            return state.evidence(kind)[0]
    except lab_errors() as e:
        pytest.fail(str(e), pytrace=False)
    return collect_or_block(request, state, kind)[0]


@pytest.fixture(scope="session")
def b70_evidence(
    request: pytest.FixtureRequest, b70_state: LabState, b70_contract: contract_mod.Contract
) -> list[evidence_mod.Evidence]:
    """Evidence of every fresh start of the contract: launched once per session (once across xdist
    workers), or read from --b70-evidence."""
    return collect_or_block(request, b70_state, "candidate")


@pytest.fixture
def b70_start_evidence(
    b70_evidence: list[evidence_mod.Evidence], b70_start: int, b70_state: LabState
) -> evidence_mod.Evidence:
    """The evidence of fresh start `b70_start`; a start the contract asks for but the run lacks fails."""
    found = [e for e in b70_evidence if e.start_index == b70_start]
    if not found:
        pytest.fail(
            f"start-{b70_start}: no evidence (the run has starts {[e.start_index for e in b70_evidence]}; "
            f"the contract asks for {b70_state.contract.reproduction.fresh_starts}); looked in "
            f"{b70_state.run_dir}",
            pytrace=False,
        )
    return found[0]


@pytest.fixture(scope="session")
def b70_prompt_ids(b70_state: LabState, b70_contract: contract_mod.Contract) -> list[str]:
    """The ids of the prompt set the session judges, in the contract's order."""
    return [p.id for p in b70_state.prompts(b70_contract, selected=True)]


@pytest.fixture(scope="session")
def b70_checkpoints(
    b70_state: LabState, b70_evidence: list[evidence_mod.Evidence], b70_contract: contract_mod.Contract
) -> dict:
    """The checkpoint tables of the served target and draft (tensor moments, calibrated KV scales): the
    run folder's copy (so after `b70_evidence` has collected), else read from the checkpoints themselves. A
    part that cannot be read is None, with the reason under "problems" (its gates then fail closed)."""
    from ..engine.starts import checkpoint_tables
    from ..evidence.record import EvidenceError

    try:
        return checkpoint_tables(b70_state.run_dir, b70_contract, b70_state.cache_root)
    except EvidenceError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def b70_teacher_evidence(
    request: pytest.FixtureRequest, b70_state: LabState, b70_contract: contract_mod.Contract
) -> evidence_mod.Evidence:
    """One start of the contract's teacher (target only), launched once per session."""
    return one_start_of(request, b70_state, "teacher")


@pytest.fixture(scope="session")
def b70_reference_evidence(
    request: pytest.FixtureRequest, b70_state: LabState, b70_contract: contract_mod.Contract
) -> evidence_mod.Evidence:
    """One start of the contract's unquantized-KV reference (target without its KV scheme, KV dtype auto),
    with the quality samples."""
    return one_start_of(request, b70_state, "reference")


@pytest.fixture(scope="session")
def b70_quality_samples(b70_state: LabState, b70_contract: contract_mod.Contract) -> list:
    return quality_samples(b70_contract)


@pytest.fixture(scope="session")
def b70_quality_keys(b70_quality_samples: list) -> dict:
    """The figures of the contract's quality set, each with its (sample id, variant) keys."""
    from ..quality import judge

    return judge.keys_by_figure(b70_quality_samples)


@pytest.fixture(scope="session")
def b70_quality_scores(
    b70_state: LabState, b70_contract: contract_mod.Contract, b70_quality_samples: list
) -> Callable[[evidence_mod.Evidence], tuple[dict, dict]]:
    """`scores(evidence)` -> (scores, texts) of a start's quality answers, computed once per evidence (coding
    samples run in the sandbox). A start without any quality answer fails: it was collected without them."""
    from ..quality import scoring

    cache = b70_state._scores = b70_state._scores or {}

    def scores(evidence: evidence_mod.Evidence) -> tuple[dict, dict]:
        key = evidence.digest or evidence.body_digest()
        if key not in cache:
            if evidence.status != "ok" and not evidence.quality:
                pytest.fail(
                    f"{evidence.role} start-{evidence.start_index} failed before its quality samples: "
                    f"{evidence.failure.message if evidence.failure else '?'}",
                    pytrace=False,
                )
            if not evidence.quality:
                pytest.fail(
                    f"{evidence.role} start-{evidence.start_index} of {b70_state.run_dir} holds no quality "
                    f"answers (collected by a session that judged no quality?)",
                    pytrace=False,
                )
            answers = scoring.answers_of(evidence.quality)
            cache[key] = (
                scoring.score_all(b70_quality_samples, answers, scoring.limits_of(b70_contract.quality), run=sandboxed),
                scoring.texts_of(answers),
            )
        return cache[key]

    def sandboxed(program: str) -> Any:
        """The sandbox, once it is known to isolate (or the lab allowed it not to); the layers each run used."""
        from ..isolation import sandbox

        allowed = bool(b70_state.config.getoption("--b70-allow-unisolated-code"))
        try:
            layers = sandbox.require_isolation(allow_unisolated=allowed)
        except sandbox.Unisolated as e:
            pytest.fail(str(e), pytrace=False)
        b70_state.unisolated_allowed = not sandbox.has_os_layer(layers)
        result = sandbox.run_python(program)
        b70_state.sandbox_layers = sandbox.common_layers(b70_state.sandbox_layers, result.layers)
        return result

    return scores


@pytest.fixture
def b70_quality_verdict(request: pytest.FixtureRequest) -> Callable[[object], None]:
    """`b70_quality_verdict(verdict)`: the figure's values as JUnit properties, then pass or fail with the
    judge's explanation."""

    def judge(verdict) -> None:
        for key, value in verdict.observed.items():
            request.node.user_properties.append((key, value))
        state = request.config.stash[STATE]
        if state.sandbox_layers is not None:  # this process ran generated code: the layers every run had
            request.node.user_properties.append((SANDBOX_PROPERTY, " ".join(state.sandbox_layers)))
            request.node.user_properties.append((UNISOLATED_PROPERTY, state.unisolated_allowed))
        request.node.user_properties.append(("b70_quality_passed", verdict.passed))
        if not verdict.passed:
            request.node.user_properties.append(("b70_reasons", " | ".join(verdict.reasons)))
            pytest.fail(verdict.explain(), pytrace=False)

    return judge


@pytest.fixture
def b70_gate_inputs(
    request: pytest.FixtureRequest,
    b70_state: LabState,
    b70_contract: contract_mod.Contract,
    b70_evidence: list[evidence_mod.Evidence],
    b70_prompt_ids: list[str],
) -> catalogue_mod.Inputs:
    """What the catalogue's gates read of this session's run (catalogue.Inputs). The teacher snapshots are
    --b70-teacher-snapshots, else the __snapshots__ folder beside the test (syrupy's place for them)."""
    from ..engine.starts import tables_or_why
    from ..judge import catalogue

    if b70_state._tables is None:
        b70_state._tables = tables_or_why(b70_state.run_dir, b70_contract, b70_state.cache_root)
    snapshots = request.config.getoption("--b70-teacher-snapshots") or request.path.parent / "__snapshots__"
    run_dir = b70_state.replay_dir or b70_state.run_dir
    return catalogue.Inputs(b70_contract, b70_evidence, b70_state._tables, run_dir, b70_prompt_ids, Path(snapshots))


@pytest.fixture
def b70_gate_check(
    request: pytest.FixtureRequest, b70_gate_inputs: catalogue_mod.Inputs, b70_verdict: Callable[[object], None]
) -> Callable[..., None]:
    """`b70_gate_check(start=None, rank=None, prompt=None)`: judge the test's own `b70_gate` on that subject
    through the catalogue (catalogue.check), as the in-process judge does; a gate the contract does not need
    skips with the reason."""
    from ..judge import catalogue

    mark = request.node.get_closest_marker("b70_gate")
    added = request.config.stash[STATE].added_catalogue
    name = mark.args[0] if mark is not None and mark.args else None
    gate = catalogue.gate(name, added) if name in catalogue.BY_NAME or name in added else None

    def check(start: evidence_mod.Evidence | None = None, rank: int | None = None, prompt: str | None = None) -> None:
        if gate is None:
            pytest.fail(f"{request.node.nodeid}: b70_gate_check needs a b70_gate(NAME) of the catalogue", pytrace=False)
        if (why := gate.inapplicable(b70_gate_inputs.contract)) is not None:
            pytest.skip(why)
        b70_verdict(catalogue.check(gate.name, b70_gate_inputs, catalogue.Subject(start, rank, prompt), added))

    return check


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
            pytest.fail(
                f"{request.node.nodeid} declares {pair[0]} [{pair[1]}] but its verdict is of {verdict.gate} "
                f"[{verdict.subject}]: the test judges another subject than the one the verdict counts",
                pytrace=False,
            )
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
    from ..engine.command import ServeConfig
    from ..engine.server import EngineServer, EngineStartError, start_engine

    started: list[EngineServer] = []

    def start(config: ServeConfig, name: str, env_extra: dict[str, str] | None = None, deadline_s: float = 900.0):
        try:
            server = start_engine(
                config,
                b70_run_dir / name,
                b70_state.cache_root / "engine-state",
                deadline_s=deadline_s,
                env_extra=env_extra,
                on_progress=lambda ph, t: b70_state.say(f"engine {name}: {ph} ({t:.0f} s)"),
            )
        except EngineStartError as e:
            pytest.fail(f"engine {name} did not start:\n{e}", pytrace=False)
        started.append(server)
        return server

    yield start

    survivors = [
        f"{s.log_dir.name}: pid {p.pid} {p.name} ({p.cmdline[:80]})" for s in started for p in s.stop().survivors()
    ]
    if survivors:
        pytest.fail("engine processes outlived teardown:\n  " + "\n  ".join(survivors), pytrace=False)
