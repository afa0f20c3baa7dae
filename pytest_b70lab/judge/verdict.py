"""The promotion verdict: what a promotion needs, what actually ran, and what that allows one to say.

The required (gate, subject) pairs come from the contract alone (`catalogue.required_subjects`); the outcomes
come from the gate tests' reports. PROMOTABLE means every required pair ran and passed and no other gate
test failed. A required pair that never ran (deselected with -k, --deselect, --lf or a marker subset, lost
with an xdist worker, or never collected) makes the run incomplete; one that was skipped counts as failed,
with the skip reason. Nothing here knows pytest: the plugin turns reports into `GateOutcome`s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..evidence.run_folder import PROMOTION

Pair = tuple[str, str]
Outcome = Literal["passed", "failed", "skipped"]
_RANK = {"passed": 0, "skipped": 1, "failed": 2}
SHOWN = 12  # pairs or failures listed in the terminal before "and N more"
EVIDENCE_CHECKS = "evidence-complete"  # the gate-marked tests that only check the evidence is all there


@dataclass
class GateOutcome:
    """One gate test's result over all its phases (setup, call, teardown)."""

    test: str
    gate: str | None  # None: a gate-marked test that judges no catalogue pair (an evidence check)
    subject: str | None
    outcome: Outcome
    reasons: str = ""
    observed: dict[str, Any] = field(default_factory=dict)

    @property
    def pair(self) -> Pair | None:
        return (self.gate, self.subject) if self.gate and self.subject else None

    def merge(self, outcome: Outcome, reasons: str, observed: dict[str, Any]) -> None:
        """A later phase of the same test: the worst outcome wins, its reasons with it."""
        self.observed.update(observed)
        if _RANK[outcome] > _RANK[self.outcome]:
            self.outcome, self.reasons = outcome, reasons


@dataclass
class Decision:
    contract: str
    contract_digest: str | None
    required: list[Pair]
    outcomes: list[GateOutcome]
    problems: list[str] = field(default_factory=list)  # why the required set itself could not be known
    # Why the session could not judge (a start that could not begin, or failed): the verdict is that cause,
    # not the gate tests it skipped.
    blocked: list[str] = field(default_factory=list)
    # --b70-speedup: the candidate's paired speed-up over its target-only start (compare.speedup_figure).
    speedup: dict[str, Any] | None = None
    # Per checkpoint part: "recomputed from ..." (the run folder's table copy matched its checkpoint) or
    # "taken on trust: ..." (the checkpoint is not on this machine).
    tables_checked: dict[str, str] = field(default_factory=dict)

    @property
    def by_pair(self) -> dict[Pair, list[GateOutcome]]:
        out: dict[Pair, list[GateOutcome]] = {}
        for o in self.outcomes:
            if o.pair:
                out.setdefault(o.pair, []).append(o)
        return out

    @property
    def missing(self) -> list[Pair]:
        ran = self.by_pair
        return [p for p in self.required if p not in ran]

    @property
    def failed(self) -> list[GateOutcome]:
        """Failed gate tests, and skipped ones whose pair a promotion requires."""
        required = set(self.required)
        return [o for o in self.outcomes if o.outcome == "failed" or (o.outcome == "skipped" and o.pair in required)]

    @property
    def complete(self) -> bool:
        return not self.problems and not self.blocked and bool(self.required) and not self.missing

    @property
    def promotable(self) -> bool:
        return self.complete and not self.failed

    @property
    def failed_gates(self) -> list[str]:
        """Catalogue gate names; the evidence checks that judge no catalogue pair are `evidence-complete`."""
        return sorted({o.gate or EVIDENCE_CHECKS for o in self.failed})

    @property
    def endpoint_medians(self) -> list[float] | None:
        for o in self.outcomes:
            if o.gate == "fresh-start-reproduction" and o.observed.get("endpoint_medians"):
                return list(o.observed["endpoint_medians"])
        return None


def paired_lines(decision: Decision) -> list[str]:
    """Gate 7's paired figure of each later start with its interval, as the gate observed it: the width is what
    says whether a session could tell a change of a few percent at all."""
    lines = []
    for o in decision.outcomes:
        if o.gate != "fresh-start-reproduction":
            continue
        for key in sorted(k for k in o.observed if k.startswith("paired_ratio_start")):
            n = key.removeprefix("paired_ratio_start")
            low, high = o.observed.get(f"paired_interval_start{n}") or (None, None)
            ratio = o.observed[key]
            if low is None or high is None or ratio is None:
                continue
            lines.append(
                f"  gate 7: paired start-{n} / start-1 {ratio:.3f} [{low:.3f}, {high:.3f}], "
                f"{(high - low) / 2:.1%} half-width"
            )
        break
    return lines


def _pairs(pairs: list[Pair]) -> str:
    shown = ", ".join(f"{gate} [{subject}]" for gate, subject in pairs[:SHOWN])
    return shown + (f", and {len(pairs) - SHOWN} more" if len(pairs) > SHOWN else "")


def promotable_line(
    medians: list[float] | None, contract: str, tally: str, speedup: dict[str, Any] | None = None
) -> str:
    """The one PROMOTABLE headline: the terminal's, the report's and `evidence show`'s."""
    shown = " / ".join(f"{m:.2f}" for m in medians) if medians else "n/a"
    starts = " / ".join(f"start-{i}" for i in range(1, len(medians or []) + 1))
    over = f", {speedup_text(speedup)}" if speedup else ""
    return f"PROMOTABLE at {shown} tok/s median ({starts}){over} - contract {contract} ({tally})"


def speedup_text(s: dict[str, Any]) -> str:
    """'2.41x target-only (paired [2.30, 2.52], 95 %, 6 prompts)'."""
    return (
        f"{s['ratio']:.2f}x target-only (paired [{s['low']:.2f}, {s['high']:.2f}], {s['confidence'] * 100:g} %, "
        f"{s['prompts']} prompts)"
    )


def recorded_headline(promotion: dict[str, Any] | None, starts: Sequence[Any], folder: Path) -> tuple[str, str]:
    """(kind, line) of a run folder's recorded verdict, for the surfaces that read one back (`b70lab report`,
    `b70lab evidence show`): never more favourable than promotion.json, and not promotable where the file
    contradicts the evidence beside it. kind: none, pass, fail or incomplete."""
    p = promotion
    if p is None:
        return "none", (
            f"No verdict recorded: {folder.name} has no {PROMOTION}. Replay the gates to decide "
            "one: pytest -m gates --b70-evidence RUN_DIR"
        )
    contract = p.get("contract") or (starts[0].contract.name if starts else "?")
    recorded = {s.contract.digest for s in starts}
    if p.get("contract_digest") and recorded and recorded != {p["contract_digest"]}:
        return "fail", (
            f"NOT PROMOTABLE: {PROMOTION} was decided for contract digest {p['contract_digest'][:16]}, "
            f"the evidence was recorded under {', '.join(sorted(d[:16] for d in recorded))}"
        )
    if p.get("blocked"):
        return "fail", f"NOT PROMOTABLE: {p['blocked']}"
    if failed := [s for s in starts if s.status != "ok"]:
        return "fail", (
            f"NOT PROMOTABLE - contract {contract}: start-{failed[0].start_index} failed"
            + (f": {failed[0].failure.message.splitlines()[0]}" if failed[0].failure else "")
        )
    required = [tuple(pair) for pair in p.get("required") or []]
    outcomes: dict[tuple[str, str], list[str]] = {}
    for g in p.get("gates") or []:
        outcomes.setdefault((g.get("gate"), g.get("subject")), []).append(g.get("outcome"))
    tally = _tally(required, outcomes)
    if p["promotable"] is True and p["complete"] is True and starts:
        return "pass", promotable_line(
            p.get("endpoint_medians_tok_s") or [], contract, tally, p.get("speedup_over_target_only")
        )
    why = []
    if p["complete"] is not True:
        missing = p.get("missing") or []
        why.append(
            "incomplete: "
            + (
                "; ".join(p.get("problems") or [])
                or f"{len(missing)} of {len(required)} required gate subjects did not run"
            )
        )
    if p.get("failed_gates"):
        why.append(f"failed gates: {', '.join(p['failed_gates'])}")
    if not starts:
        why.append("no engine start was recorded in this folder")
    return (
        "incomplete" if p["complete"] is not True and not p.get("failed_gates") else "fail",
        f"NOT PROMOTABLE - contract {contract}: {'; '.join(why) or 'promotion.json says so'} ({tally})",
    )


def _tally(required: Sequence[Pair], outcomes: Mapping[Pair, Sequence[str]]) -> str:
    """'N/M required gate subjects passed': a required pair passed when it ran and every test of it passed.
    The session's Decision and a recorded promotion.json are counted alike."""
    passed = sum(1 for pair in required if outcomes.get(pair) and all(o == "passed" for o in outcomes[pair]))
    return f"{passed}/{len(required)} required gate subjects passed"


def summary(decision: Decision, run_dir: Path) -> list[tuple[str, dict[str, bool]]]:
    """The terminal lines of the verdict, each with its TerminalWriter markup."""
    d = decision
    tally = _tally(d.required, {pair: [o.outcome for o in found] for pair, found in d.by_pair.items()})
    lines: list[tuple[str, dict[str, bool]]] = []
    if d.blocked:
        lines.append((f"NOT PROMOTABLE: {d.blocked[0]}", {"red": True, "bold": True}))
        lines.append(
            (
                f"  contract {d.contract}: no gate was judged past it (every test that needs the engine's "
                f"evidence was skipped)",
                {},
            )
        )
        lines.append((f"evidence and promotion.json: {run_dir}", {}))
        return lines
    if d.promotable:
        lines.append((promotable_line(d.endpoint_medians, d.contract, tally, d.speedup), {"green": True, "bold": True}))
    else:
        if not d.complete:
            why = (
                "; ".join(d.problems)
                if d.problems
                else (
                    f"{len(d.missing)} of {len(d.required)} required gate subjects did not run (deselected, not "
                    f"collected, or lost with a worker): {_pairs(d.missing)}"
                )
            )
            lines.append(
                (f"NOT PROMOTABLE (incomplete) - contract {d.contract}: {why}", {"yellow": True, "bold": True})
            )
        if d.failed:
            lines.append(
                (
                    f"NOT PROMOTABLE - contract {d.contract}; failed gates: {', '.join(d.failed_gates)} ({tally})",
                    {"red": True, "bold": True},
                )
            )
            for o in d.failed[:SHOWN]:
                what = "skipped, but a promotion requires it" if o.outcome == "skipped" else "failed"
                lines.append((f"  {o.test} {what}: {o.reasons}", {}))
            if len(d.failed) > SHOWN:
                lines.append(
                    (f"  ... and {len(d.failed) - SHOWN} more failed gate tests (promotion.json lists all)", {})
                )
    if d.speedup and not d.promotable:
        lines.append((f"  speed-up over target-only: {speedup_text(d.speedup)}; reported, not promoted", {}))
    lines += [(line, {}) for line in paired_lines(d)]
    if trusted := {part: why for part, why in d.tables_checked.items() if why.startswith("taken on trust")}:
        lines.append(
            (
                "  checkpoint tables taken on trust (no checkpoint here to recompute them from): "
                + "; ".join(f"{part}: {why.removeprefix('taken on trust: ')}" for part, why in trusted.items()),
                {"yellow": True},
            )
        )
    lines.append((f"evidence and promotion.json: {run_dir}", {}))
    return lines


def record(decision: Decision, run_dir: Path) -> dict[str, Any]:
    """promotion.json: the verdict with everything it was decided from."""
    d = decision
    return {
        "promotable": d.promotable,
        "complete": d.complete,
        "problems": d.problems,
        "blocked": d.blocked[0] if d.blocked else None,
        "contract": d.contract,
        "contract_digest": d.contract_digest,
        "run_dir": str(run_dir),
        "endpoint_medians_tok_s": d.endpoint_medians,
        "failed_gates": d.failed_gates,
        "required": [list(p) for p in d.required],
        "observed": sorted([o.gate, o.subject, o.outcome] for o in d.outcomes if o.pair),
        "missing": [list(p) for p in d.missing],
        "failed": [
            {"test": o.test, "gate": o.gate, "subject": o.subject, "outcome": o.outcome, "reasons": o.reasons}
            for o in d.failed
        ],
        "gates": [asdict(o) for o in d.outcomes],
        "speedup_over_target_only": d.speedup,
        "checkpoint_tables_checked": d.tables_checked,
    }


# --- gate 8: its own verdict, never mixed with exactness --------------------------------------------------


@dataclass
class QualityOutcome:
    test: str
    figure: str
    outcome: Outcome
    reasons: str = ""
    observed: dict[str, Any] = field(default_factory=dict)

    def merge(self, outcome: Outcome, reasons: str, observed: dict[str, Any]) -> None:
        self.observed.update(observed)
        if _RANK[outcome] > _RANK[self.outcome]:
            self.outcome, self.reasons = outcome, reasons

    @property
    def regressed(self) -> bool:
        """Judged and found worse (a p-value was computed), as opposed to not judged at all."""
        return self.outcome == "failed" and self.observed.get("p_value") is not None

    @property
    def figure_text(self) -> str:
        o = self.observed
        if o.get("samples") is None:
            return "not judged"
        return f"{o.get('candidate_passed')}/{o['samples']} vs {o.get('baseline_passed')}/{o['samples']}"


@dataclass
class QualityDecision:
    required: list[str]  # the figures of the contract's quality set
    outcomes: list[QualityOutcome]
    problems: list[str] = field(default_factory=list)
    # the sandbox layers every run of generated code had (None: no code ran in this session), and whether
    # running it with no OS layer was allowed (--b70-allow-unisolated-code)
    sandbox_layers: list[str] | None = None
    unisolated_allowed: bool = False

    @property
    def missing(self) -> list[str]:
        ran = {o.figure for o in self.outcomes}
        return [f for f in self.required if f not in ran]

    @property
    def regressed(self) -> list[QualityOutcome]:
        return [o for o in self.outcomes if o.regressed]

    @property
    def not_judged(self) -> list[QualityOutcome]:
        return [o for o in self.outcomes if o.outcome != "passed" and not o.regressed]

    @property
    def status(self) -> str:
        if self.regressed:
            return "regressed"
        if self.problems or self.missing or self.not_judged or not self.required:
            return "incomplete"
        return "ok"


def quality_summary(q: QualityDecision) -> list[tuple[str, dict[str, bool]]]:
    """`QUALITY OK`, or `QUALITY REGRESSED: <figure>: <figure> vs <baseline>`, and what was not judged."""
    lines: list[tuple[str, dict[str, bool]]] = []
    if q.status == "ok":
        shown = ", ".join(f"{o.figure} {o.figure_text}" for o in sorted(q.outcomes, key=lambda o: o.figure))
        lines.append(
            (f"QUALITY OK - {len(q.outcomes)} figures against the FP8 baseline: {shown}", {"green": True, "bold": True})
        )
    if q.regressed:
        lines.append(
            (
                "QUALITY REGRESSED: " + "; ".join(f"{o.figure}: {o.figure_text}" for o in q.regressed),
                {"red": True, "bold": True},
            )
        )
    if q.not_judged or q.missing or q.problems or (not q.required and q.status != "ok"):
        reasons = {o.reasons for o in q.not_judged}
        if len(q.not_judged) > 1 and len(reasons) == 1:  # one cause (a recording run, a missing baseline): once
            judged = [f"{len(q.not_judged)} figures: {reasons.pop()}"]
        else:
            judged = [
                f"{o.figure}: {o.reasons if o.reasons.startswith(o.outcome) else f'{o.outcome}: {o.reasons}'}"
                for o in q.not_judged
            ]
        parts = q.problems + judged + [f"{f}: did not run" for f in q.missing]
        lines.append(
            (
                "QUALITY NOT JUDGED: " + "; ".join(parts[:SHOWN]) + (" ..." if len(parts) > SHOWN else ""),
                {"yellow": True, "bold": True},
            )
        )
    if q.sandbox_layers is not None:
        lines.append(sandbox_line(q.sandbox_layers, q.unisolated_allowed))
    return lines


def sandbox_line(layers: list[str], unisolated_allowed: bool) -> tuple[str, dict[str, bool]]:
    """Which isolation the model-written code had: the OS layers, or a warning that there were none."""
    from ..isolation.sandbox import has_os_layer

    shown = ", ".join(layers) or "none"
    if has_os_layer(layers):
        return f"  generated code ran sandboxed: {shown}", {}
    allowed = " (allowed by --b70-allow-unisolated-code)" if unisolated_allowed else ""
    return f"  generated code ran WITHOUT OS isolation{allowed}: only {shown}", {"yellow": True, "bold": True}


def quality_record(q: QualityDecision) -> dict[str, Any]:
    return {
        "status": q.status,
        "required": q.required,
        "missing": q.missing,
        "problems": q.problems,
        "regressed": [o.figure for o in q.regressed],
        "not_judged": [o.figure for o in q.not_judged],
        "figures": [asdict(o) for o in sorted(q.outcomes, key=lambda o: o.figure)],
        "sandbox_layers": q.sandbox_layers,
        "unisolated_allowed": q.unisolated_allowed,
    }


def write_unjudged(run_dir: Path, why: str) -> Path:
    """promotion.json of a folder that this session has not judged (yet): not promotable, and why. A
    folder's promotion.json is the verdict of the last session that used it, so an older PROMOTABLE never
    outlives a session that stopped before it could judge (a damaged replay, a bad contract, Ctrl-C)."""
    from ..evidence import promotion

    data = {"promotable": False, "complete": False, "judged": False, "run_dir": str(run_dir), "problems": [why]}
    return promotion.write(promotion.build(**data), run_dir / PROMOTION)


def write(decision: Decision | None, run_dir: Path, quality: QualityDecision | None = None) -> Path:
    """promotion.json. Quality is a section of its own: it never changes `promotable`. A session that ran
    no gate test decides no promotion (promotable false, incomplete)."""
    path = run_dir / PROMOTION
    data = (
        record(decision, run_dir)
        if decision is not None
        else {
            "promotable": False,
            "complete": False,
            "run_dir": str(run_dir),
            "problems": ["no gate test ran in this session: nothing decides a promotion"],
        }
    )
    if quality is not None:
        data["quality"] = quality_record(quality)
    from ..evidence import promotion

    return promotion.write(promotion.build(**data), path)
