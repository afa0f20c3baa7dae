"""The reproduction part: start-2 / start-1 over consecutive gates sessions, by gate 7's figures."""

from __future__ import annotations

import math
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import REPO
from .figures import BenchError, Figure, checked, wall

REPRODUCTION_GOAL = 0.10


@dataclass(frozen=True)
class SessionDrift:
    """One session's start-2 / start-1, both ways gate 7 reads it, recomputed from the arrival times."""

    run_dir: str
    median_ratio: float
    paired: float
    paired_low: float
    paired_high: float
    graphs: tuple[str, ...]  # per start: compiled, loaded, mixed (some of each) or unknown
    schedule: str = "sequential"
    medians: tuple[float, ...] = ()  # each start's endpoint median, tok/s: the verdict's absolute figure
    # Gate 7's speed decision under the run's own contract (its rule and tolerances): both figures within.
    speed_passed: bool | None = None
    rule: str = "point"
    passes: int = 1


def _graph_source(start) -> str:
    sources = {
        str(m.get("source")) for a in start.audits for m in (a.get("compiled_modules") or []) if isinstance(m, dict)
    }
    return sources.pop() if len(sources) == 1 else "mixed" if sources else "unknown"


def session_drift(run_dir: Path) -> SessionDrift:
    """start-2 / start-1 of a run folder; a run without two completed starts with decode rates is an error."""
    from ..evidence import record as evidence
    from ..evidence.run_folder import read_starts
    from ..judge import reproduction
    from ..judge.replay import recorded_contract

    try:
        starts = read_starts(run_dir)
    except evidence.EvidenceError as e:
        raise BenchError(f"{run_dir}: {e}") from None
    if len(starts) < 2 or any(s.status != "ok" for s in starts[:2]):
        raise BenchError(
            f"{run_dir}: two completed starts are needed, found {[f'start-{s.start_index} {s.status}' for s in starts]}"
        )
    # The figures gate 7 judges, computed as it computes them (under the run's own schedule): one place.
    try:
        c = recorded_contract(starts, run_dir)
    except evidence.EvidenceError as e:
        raise BenchError(str(e)) from None
    figures = reproduction.speed_figures(starts[:2], c)
    medians, paired = figures.medians, figures.paired[0]
    if figures.problems:
        raise BenchError(f"{run_dir}: " + "; ".join(figures.problems))
    if paired is None or medians[0] is None or medians[1] is None:
        raise BenchError(f"{run_dir}: no prompt has a decode rate at both starts")
    (decision,) = reproduction.speed_decisions(starts[:2], figures, c)
    return SessionDrift(
        str(run_dir),
        medians[1] / medians[0],
        paired.ratio,
        paired.low,
        paired.high,
        tuple(_graph_source(s) for s in starts[:2]),
        c.reproduction.schedule,
        (medians[0], medians[1]),
        bool(decision.endpoint_within and decision.paired_within),
        c.reproduction.speed_rule,
        starts[0].schedule.passes if starts[0].schedule else 1,
    )


def drift_figures(sessions: Sequence[SessionDrift], schedule: str = "") -> list[Figure]:
    """Two rows: the median ratio and the paired figure over the sessions, each as median [min, max]."""
    if not sessions:
        raise BenchError("no session to summarise")
    kinds = statistics.multimode(" / ".join(s.graphs) for s in sessions)
    rows = _drift_rows(
        "reproduction",
        f"start-2 / start-1{f' ({schedule})' if schedule else ''}",
        "sessions",
        sessions,
        f"; graphs (start-1 / start-2) mostly {', '.join(kinds)}",
    )
    judged = [s for s in sessions if s.speed_passed is not None]
    if judged:
        passed = sum(bool(s.speed_passed) for s in judged)
        rules = ", ".join(sorted({s.rule for s in judged}))
        rows.append(
            Figure(
                "reproduction",
                f"gate 7's speed decision under each run's contract ({rules} rule)",
                passed / len(judged),
                "x",
                "report",
                None,
                f"passed in {passed} of {len(judged)} sessions; passes served "
                + ", ".join(str(s.passes) for s in judged),
                {"sessions": [asdict(s) for s in judged]},
            )
        )
    return rows


def _drift_rows(part: str, what: str, unit: str, drifts: Sequence, detail: str = "") -> list[Figure]:
    """The endpoint median ratio and the paired figure of each drift, as median [min, max] rows."""
    raw = {unit: [asdict(d) for d in drifts]}
    rows = []
    for measure, values in (
        ("endpoint median ratio", [d.median_ratio for d in drifts]),
        ("paired figure", [d.paired for d in drifts]),
    ):
        worst = max(abs(v - 1) for v in values)
        rows.append(
            Figure(
                part,
                f"{what}, {measure}, median of {len(drifts)} {unit}",
                statistics.median(values),
                "x",
                f"drift <= {REPRODUCTION_GOAL:.2f} in every one",
                worst <= REPRODUCTION_GOAL,
                f"min {min(values):.3f}, max {max(values):.3f}, largest drift {worst:.3f}{detail}",
                raw,
            )
        )
    return rows


COMPILE_CACHES = ("warm", "empty")


SCHEDULES = ("contract", "sequential", "interleaved", "both")


def schedule_contracts(contract_name: str, schedule: str, out_dir: Path) -> list[str]:
    """The contract (name or TOML path) of each session of a round: the contract as it is, or written under
    `out_dir` with its reproduction schedule replaced (both: sequential then interleaved, in one round, so that
    the two schedules' figures come from the same stretch of the machine's time)."""
    from ..contract import schema as contract_mod

    if schedule not in SCHEDULES:
        raise BenchError(f"schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    if schedule == "contract":
        return [contract_name]
    base = contract_mod.load(contract_name)
    out = []
    for name in ("sequential", "interleaved") if schedule == "both" else (schedule,):
        data = base.canonical()
        passes = base.reproduction.passes if base.reproduction.schedule == "interleaved" else 3
        data["reproduction"] = {k: v for k, v in data["reproduction"].items() if k not in ("schedule", "passes")}
        if name == "interleaved":
            data["reproduction"].update(schedule="interleaved", passes=passes)
        path = out_dir / "contracts" / f"{base.name}-{name}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(contract_mod.to_toml(contract_mod.Contract.model_validate(data, strict=False)))
        out.append(str(path))
    return out


def compile_cache_dir(cache_root: Path) -> Path:
    """vLLM's compile cache of the engine starts under `cache_root` (engine.environment.engine_environment's VLLM_CACHE_ROOT)."""
    return cache_root / "engine-state" / "vllm" / "torch_compile_cache"


def reproduction_sessions(
    contract_name: str,
    cache_root: Path,
    out_dir: Path,
    sessions: int = 10,
    say: Callable[[str], None] = print,
    compile_cache: str = "warm",
    schedule: str = "contract",
) -> list[Figure]:
    """`sessions` consecutive gates sessions as `make gates` runs them, one run folder each; with
    compile_cache "empty", each on an emptied compile cache (its start-1 compiles, its start-2 loads); with
    `schedule` (schedule_contracts), under that reproduction schedule, or both, alternating which goes first."""
    if compile_cache not in COMPILE_CACHES:
        raise BenchError(f"compile cache {compile_cache!r}: one of {', '.join(COMPILE_CACHES)}")
    contracts = schedule_contracts(contract_name, schedule, out_dir)
    drifts: dict[str, list[SessionDrift]] = {}
    for n in range(1, sessions + 1):
        for k, contract in enumerate(contracts if n % 2 else contracts[::-1]):
            run_dir = out_dir / "sessions" / f"{n:02d}{'ab'[k] if len(contracts) > 1 else ''}"
            if compile_cache == "empty":
                shutil.rmtree(compile_cache_dir(cache_root), ignore_errors=True)
            say(f"reproduction: session {n}/{sessions} ({compile_cache} compile cache, {contract}) -> {run_dir}")
            drift = _one_session(contract, cache_root, run_dir, n, say)
            drifts.setdefault(drift.schedule, []).append(drift)
    rows = [row for name, found in sorted(drifts.items()) for row in drift_figures(found, name)]
    if len(drifts) == 2:
        rows.append(across_schedules(drifts["sequential"], drifts["interleaved"]))
    return rows


def across_schedules(sequential: Sequence[SessionDrift], interleaved: Sequence[SessionDrift]) -> Figure:
    """Whether the verdict's tok/s means the same under both schedules: each round's interleaved session against
    its sequential one (same contract, same stretch of the machine's time), start by start, as the geometric
    mean over rounds of the endpoint medians' ratio, with a bootstrap interval over rounds."""
    from ..evidence.throughput import geometric_ratio

    rounds = [
        statistics.fmean(math.log(i / s) for s, i in zip(a.medians, b.medians, strict=True))
        for a, b in zip(sequential, interleaved, strict=False)
        if a.medians and b.medians
    ]
    if not rounds:
        raise BenchError("no round has endpoint medians under both schedules")
    figure = geometric_ratio(rounds, 0.95, 10_000, 0)
    return Figure(
        "reproduction",
        f"endpoint median, interleaved / sequential, geometric mean of {len(rounds)} rounds",
        figure.ratio,
        "x",
        "the 95 % interval holds 1: the verdict's tok/s compares across schedules",
        figure.low <= 1 <= figure.high,
        f"[{figure.low:.3f}, {figure.high:.3f}]; per round {', '.join(f'{math.exp(x):.3f}' for x in rounds)}",
        {"rounds": [math.exp(x) for x in rounds]},
    )


def _one_session(contract: str, cache_root: Path, run_dir: Path, n: int, say: Callable[[str], None]) -> SessionDrift:
    # Path values joined with '=': pytest reads a separate value as a test path unless the plugin is loaded first.
    cmd = [sys.executable, "-m", "pytest", "-m", "gates", f"--b70-contract={contract}", f"--b70-run-dir={run_dir}"]
    cmd += [f"--b70-cache-dir={cache_root}", "-q", "-p", "no:cacheprovider"]
    seconds, done = wall(cmd, REPO)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_suffix(".log").write_text(done.stdout + done.stderr)
    checked(done, f"gates session {n}", ok=(0, 1))  # a failed gate still has two starts to compare
    drift = session_drift(run_dir)
    say(
        f"reproduction: session {n} ({drift.schedule}): median ratio {drift.median_ratio:.3f}, paired "
        f"{drift.paired:.3f} [{drift.paired_low:.3f}, {drift.paired_high:.3f}], graphs {' / '.join(drift.graphs)}, "
        f"{seconds:.0f} s"
    )
    return drift
