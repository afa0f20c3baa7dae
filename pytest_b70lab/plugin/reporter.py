"""Test reports to gate and quality outcomes (xdist workers send theirs back with their user properties),
then the verdict: the terminal summary, RUN/promotion.json and the exit status."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..evidence.run_folder import PROMOTION
from .state import (
    BLOCKED_PROPERTY,
    FINDING_PROPERTY,
    GATE_PROPERTY,
    GATE_TEST_PROPERTY,
    QUALITY_PROPERTY,
    SANDBOX_PROPERTY,
    SPEEDUP_PROPERTY,
    SUBJECT_PROPERTY,
    UNISOLATED_PROPERTY,
    LabState,
    NoQuality,
    lab_errors,
    quality_set,
)

if TYPE_CHECKING:
    from ..judge.verdict import Decision, GateOutcome, Outcome, QualityDecision, QualityOutcome

# --- verdict: summary, promotion.json, exit status -----------------------------------------------------


def reasons(report: pytest.TestReport) -> str:
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


def report_page(run_dir: Path, page: str) -> str:
    """--b70-report: the run folder as one page (report.write), after promotion.json; a page that cannot be
    written is said, never a changed verdict."""
    from .. import report

    out = Path(page).expanduser().resolve() if page else None
    try:
        written = report.write(run_dir, out)
    except report.ReportError as e:
        return f"no report page: {e}"
    return f"the run as one page: {written}"


def baseline_comparison(config: pytest.Config, state: LabState) -> list[str]:
    """This run against --b70-baseline, as lines for the terminal; also RUN/baseline-comparison.json. Never
    changes the verdict: a comparison that cannot be made says why."""
    import json

    from ..judge import compare
    from ..records import store

    wanted = str(config.getoption("--b70-baseline"))
    root = state.settings.runs_root
    if wanted == "last":
        found = compare.last_promoted_run(root, exclude=state.run_dir)
        if found is None:
            return [f"no promoted run in {root} to compare with (--b70-baseline last)"]
        baseline = found
    else:
        baseline = Path(wanted).expanduser()
    try:
        if wanted != "last":
            baseline = store.run_or_seal(baseline)
        comparison = compare.compare_runs(compare.load_run(baseline), compare.load_run(state.run_dir))
    except (compare.CompareError, store.SealError) as e:
        return [f"cannot compare with the baseline {baseline}: {e}"]
    out = state.run_dir / "baseline-comparison.json"
    out.write_text(
        json.dumps({"baseline": str(baseline), **comparison.to_dict()}, indent=1, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    return [*compare.format_comparison(comparison).splitlines(), f"written: {out}"]


class VerdictReporter:
    """Collects gate outcomes from test reports (xdist workers send theirs back with their user properties),
    then has the verdict module decide: the terminal verdict, RUN/promotion.json, and a non-zero exit status
    for anything short of PROMOTABLE. Registered on the controller only."""

    def __init__(self, state: LabState):
        self.state = state
        self.findings: list[str] = []
        self.blocked: list[str] = []
        self.outcomes: dict[str, GateOutcome] = {}
        self.quality_outcomes: dict[str, QualityOutcome] = {}
        self.sandbox_layers: list[str] | None = None  # the layers every report that ran generated code named
        self.unisolated_allowed = False
        self._decision: Decision | None = None
        self._quality: QualityDecision | None = None
        self.baseline_lines: list[str] = []
        self.reproduction_lines: list[str] = []
        self.report_line: str | None = None  # --b70-report: where the page went, or why it did not
        self.speedup: dict | None = None
        self.written = False
        self.exitstatus: int | None = None

    def begin(self) -> None:
        """An earlier verdict in this session's run folder stops counting now: until this session writes its
        own, the file says that a session is judging the folder (also if this process is killed)."""
        if (self.state.run_dir / PROMOTION).is_file():
            from ..judge import verdict

            verdict.write_unjudged(
                self.state.run_dir,
                f"a session started {time.strftime('%Y-%m-%d %H:%M:%S')} "
                f"(pid {os.getpid()}) is judging this folder and has not "
                f"written its verdict: it was stopped, or is still running",
            )

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.state.stop_reason = self.state.stop_reason or "interrupted (Ctrl-C or SIGTERM) before any verdict"

    def pytest_internalerror(self, excrepr) -> None:
        last = str(excrepr).strip().splitlines()[-1:] or ["?"]
        self.state.stop_reason = self.state.stop_reason or f"an internal error of pytest or a plugin: {last[0]}"

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """A session that judged nothing leaves the verdict it found (begin) not promotable, saying why; a
        folder without one keeps none (an absent verdict promotes nothing)."""
        folder = self.state.run_dir
        if self.written or not (folder / PROMOTION).is_file():
            return
        from ..judge import verdict

        why = self.state.stop_reason or (
            f"no gate test reported in this session (exit status {self.exitstatus})"
            if self.exitstatus is not None
            else "it stopped before it began"
        )
        verdict.write_unjudged(folder, f"the session stopped before judging: {why}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if report.when == "call" and FINDING_PROPERTY in props:
            self.findings.append(str(props[FINDING_PROPERTY]))
        if report.failed and BLOCKED_PROPERTY in props and str(props[BLOCKED_PROPERTY]) not in self.blocked:
            self.blocked.append(str(props[BLOCKED_PROPERTY]))
        if report.when == "call" and SANDBOX_PROPERTY in props:
            from ..isolation.sandbox import common_layers

            self.sandbox_layers = common_layers(self.sandbox_layers, str(props[SANDBOX_PROPERTY]).split())
            self.unisolated_allowed |= props.get(UNISOLATED_PROPERTY) in (True, "True")
        if report.when == "call" and report.passed and SPEEDUP_PROPERTY in props:
            import json

            self.speedup = json.loads(str(props[SPEEDUP_PROPERTY]))
        if report.when != "call" and report.passed:
            return  # setup and teardown that passed say nothing about a gate or a figure
        outcome: Outcome = "failed" if report.failed else "skipped" if report.skipped else "passed"
        if QUALITY_PROPERTY not in props and GATE_TEST_PROPERTY not in props and GATE_PROPERTY not in props:
            return
        from ..judge.verdict import GateOutcome, QualityOutcome

        observed = {k: v for k, v in props.items() if not k.startswith("b70_")}
        nodeid = report.nodeid
        if QUALITY_PROPERTY in props:
            if nodeid in self.quality_outcomes:
                self.quality_outcomes[nodeid].merge(outcome, reasons(report), observed)
            else:
                figure = str(props[QUALITY_PROPERTY])
                self.quality_outcomes[nodeid] = QualityOutcome(nodeid, figure, outcome, reasons(report), observed)
        elif nodeid in self.outcomes:
            self.outcomes[nodeid].merge(outcome, reasons(report), observed)
        else:
            gate, subject = props.get(GATE_PROPERTY), props.get(SUBJECT_PROPERTY)
            self.outcomes[nodeid] = GateOutcome(
                nodeid,
                None if gate is None else str(gate),
                None if subject is None else str(subject),
                outcome,
                reasons(report),
                observed,
            )

    def decision(self) -> Decision | None:
        """Decided once, after the last report (None when no gate test ran: not a gates session)."""
        if self._decision is None and self.outcomes:
            from ..judge import catalogue, verdict

            problems: list[str] = []
            required: list[tuple[str, str]] = []
            name, digest = self.state.contract_name, None
            try:
                contract = self.state.contract
                name, digest = contract.name, contract.digest
                problems += self.state.contract_problems
                required = catalogue.required_subjects(
                    contract, [p.id for p in self.state.prompts(contract)], self.state.extra_gates
                )
            except lab_errors() as e:
                problems.append(f"the required gate subjects cannot be known: {e}")
            self._decision = verdict.Decision(
                name,
                digest,
                required,
                list(self.outcomes.values()),
                problems,
                self.blocked,
                self.speedup,
                self.state.tables_checked(),
            )
        return self._decision

    def quality_decision(self) -> QualityDecision | None:
        """Gate 8's own verdict (None when no quality figure was judged in this session)."""
        if self._quality is None and self.quality_outcomes:
            from ..judge import verdict
            from ..quality import judge

            problems: list[str] = []
            required: list[str] = []
            unknowable: tuple[type[Exception], ...] = (*lab_errors(), NoQuality)
            try:
                required = list(judge.keys_by_figure(quality_set(self.state.contract)))
            except unknowable as e:
                problems.append(f"the required quality figures cannot be known: {e}")
            self._quality = verdict.QualityDecision(
                required, list(self.quality_outcomes.values()), problems, self.sandbox_layers, self.unisolated_allowed
            )
        return self._quality

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.exitstatus = int(session.exitstatus)
        decision, quality = self.decision(), self.quality_decision()
        if decision is None and quality is None:
            return
        from ..judge import verdict

        if self.state.run_dir.exists():
            verdict.write(decision, self.state.run_dir, quality)
            self.written = True
        session.config.hook.pytest_b70lab_verdict(
            config=session.config, decision=decision, quality=quality, run_dir=self.state.run_dir
        )
        if decision is not None and session.config.getoption("--b70-baseline"):
            self.baseline_lines = baseline_comparison(session.config, self.state)
        if decision is not None and self.written:
            from .reproduction import reproduction_lines

            self.reproduction_lines, not_reproduced = reproduction_lines(session.config, self.state)
            if not_reproduced and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if (page := session.config.getoption("--b70-report")) is not None and self.written:
            self.report_line = report_page(self.state.run_dir, page)
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
        from ..judge import verdict

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
        if self.report_line is None:
            terminalreporter.write_line(f"the run as one page: b70lab report {self.state.run_dir}")
        if self.reproduction_lines:
            terminalreporter.section("b70lab reproduction of a sealed record")
            for line in self.reproduction_lines:
                terminalreporter.write_line(line, bold=True, red=line.startswith("NOT"), green=line.startswith("REPRO"))
        if self.baseline_lines:
            terminalreporter.section("b70lab comparison with the baseline")
            for line in self.baseline_lines:
                terminalreporter.write_line(line)
        if self.report_line is not None:
            terminalreporter.write_line(self.report_line, bold=True)
