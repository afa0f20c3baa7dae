"""Two run folders side by side: did the change move decode speed and nothing else?

Pure functions of saved evidence (no engine, no pytest): what a run folder holds (`show`), and what differs
between two of them (`compare_runs`): the contract, the launch flags, the environment, the models, the
versions, the tokens of every prompt, and the decode speed as a ratio with a bootstrap interval.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import LabError
from ..evidence import host, run_folder, throughput
from ..evidence import record as evidence
from ..evidence.record import Evidence
from ..evidence.run_folder import Run
from . import verdict as verdict_mod
from .exactness import first_difference

PROMOTION = run_folder.PROMOTION
# Launch flags that name where this one start lived, not what it ran.
PER_RUN_FLAGS = frozenset({"--uds", "--port"})
# The private socket folder of one start (launch makes it under the temp folder; recorded bundles say
# "<socket dir>").
_SOCKET_DIR = re.compile(r"<socket dir>|/b70lab-[A-Za-z0-9_]+(?:/|$)")
# A file-system path inside a value: absolute, or rooted at a recorded bundle's placeholder (<repo>, <home>).
_PATH = re.compile(r"(?:<[a-z ]+>|(?<![\w.:/])/)[^\s\"',;=]*")
_ABSENT = "(absent)"
CONTEXT_CHARS = 30


class CompareError(LabError, ValueError):
    """A run folder cannot be compared: missing, without starts, or with a corrupted file (named)."""


@dataclass(frozen=True)
class Change:
    key: str
    a: Any
    b: Any

    def line(self) -> str:
        return f"{self.key}: {_value(self.a)} -> {_value(self.b)}"


@dataclass(frozen=True)
class PromptComparison:
    prompt_id: str
    identical: bool
    position: int | None  # first differing token index (the shorter length when one is a prefix)
    token_a: int | None  # token id there; None past the end of that run's output
    token_b: int | None
    length_a: int
    length_b: int
    context_a: str  # the text around the first differing character
    context_b: str
    starts_agree_a: bool  # every start of A that answered this prompt gave the same tokens
    starts_agree_b: bool
    rate_a: float | None  # median decode rate over the run's starts, tok/s
    rate_b: float | None

    @property
    def ratio(self) -> float | None:
        return self.rate_b / self.rate_a if self.rate_a and self.rate_b else None


@dataclass(frozen=True)
class Speed:
    """B/A two ways over the prompts both runs have: paired (throughput.paired_ratio, the geometric mean of
    the per-prompt ratios, the figure gate 7 judges: a shift common to the prompts shows in it even where
    the medians stay put) and as the ratio of the medians over prompts (the endpoint figure's own statistic,
    so it reads like the two headline numbers divided), each with a percentile bootstrap interval that
    resamples prompts, paired, with replacement."""

    paired: throughput.PairedRatio | None
    ratio: float | None
    low: float | None
    high: float | None
    median_a: float | None
    median_b: float | None
    prompts: int
    confidence: float
    resamples: int


@dataclass(frozen=True)
class Comparison:
    a: Path
    b: Path
    contract_digest: Change | None
    contract: tuple[Change, ...]
    flags: tuple[Change, ...]
    environment: tuple[Change, ...]
    models: tuple[Change, ...]
    versions: tuple[Change, ...]
    prompts: tuple[PromptComparison, ...]
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    speed: Speed
    # Each run's host class (evidence.host.host_class, recomputed from its first start) and, where they differ, why
    # its speed is not compared (the runs named A and B; a caller with other names asks host_classes itself): then
    # the speed figures are computed but no surface reads them as a change.
    host_classes: tuple[host.HostClass, host.HostClass] | None = None
    speed_not_compared: str | None = None

    @property
    def identical_outputs(self) -> int:
        return sum(p.identical for p in self.prompts)

    @property
    def only_speed_changed(self) -> bool:
        """The lab's question: every output identical and every input the same; only the speed may differ."""
        return (
            self.identical_outputs == len(self.prompts)
            and not self.only_in_a
            and not self.only_in_b
            and self.contract_digest is None
            and not self.contract
            and not self.flags
            and not self.environment
            and not self.models
            and not self.versions
        )

    def headline(self) -> str:
        s = self.speed
        if self.speed_not_compared:
            speed = f"speed B/A: {self.speed_not_compared}"
        elif s.ratio is None or s.paired is None:
            speed = "speed B/A: no prompt has a decode rate in both runs"
        else:
            speed = (
                f"speed B/A paired {s.paired.ratio:.3f} [{s.paired.low:.3f}, {s.paired.high:.3f}], "
                f"of medians {s.ratio:.3f} [{s.low:.3f}, {s.high:.3f}] "
                f"({s.confidence * 100:g} %, {_count(s.prompts, 'prompt')})"
            )
        outputs = f"outputs identical on {self.identical_outputs}/{len(self.prompts)} prompts"
        unmatched = len(self.only_in_a) + len(self.only_in_b)
        if unmatched:
            outputs += f" ({_count(unmatched, 'prompt')} in one run only)"
        parts = [
            speed,
            outputs,
            f"contract: {_differ(len(self.contract), 'field')}" if self.contract else "contract: identical",
        ]
        for name, changes in (
            ("flags", self.flags),
            ("environment", self.environment),
            ("models", self.models),
            ("versions", self.versions),
        ):
            if changes:
                parts.append(f"{name}: {_differ(len(changes), 'entry', 'entries')}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            a=str(self.a),
            b=str(self.b),
            headline=self.headline(),
            only_speed_changed=self.only_speed_changed,
            identical_outputs=self.identical_outputs,
        )
        return data


# --- loading ------------------------------------------------------------------------------------------


def load_run(run_dir: Path) -> Run:
    """Every start-N/evidence.json of a run folder, in start order, and its promotion.json if present."""
    run_dir = Path(run_dir)
    try:
        run = run_folder.read(run_dir)
    except evidence.EvidenceError as e:
        raise CompareError(str(e)) from e
    if not run.starts:
        raise CompareError(f"no starts in {run_dir} (expected start-N/{evidence.FILENAME})")
    return run


def last_promoted_run(runs_root: Path, exclude: Path | None = None) -> Path | None:
    """The run folder under runs_root whose promotion.json, written last, says promotable and complete.
    An unreadable promotion.json promotes nothing, so it is passed over rather than fatal."""
    skip = Path(exclude).resolve() if exclude is not None else None
    best: tuple[float, str, Path] | None = None
    for path in Path(runs_root).glob(f"*/{PROMOTION}"):
        if skip is not None and path.parent.resolve() == skip:
            continue
        try:
            verdict, _ = run_folder.read_promotion(path.parent)
            mtime = path.stat().st_mtime
        except (OSError, evidence.EvidenceError):
            continue
        if verdict is not None and verdict["promotable"] is True and verdict["complete"] is True:
            if best is None or (mtime, path.parent.name) > best[:2]:
                best = (mtime, path.parent.name, path.parent)
    return best[2] if best else None


# --- one run ------------------------------------------------------------------------------------------


def show(run: Run) -> str:
    """A human summary of one run folder: what ran, under which identity, how each start went, the verdict."""
    e = run.first
    lines = [f"run       {run.folder}", f"contract  {e.contract.name} ({e.contract.kind})  digest {e.contract.digest}"]
    for role, model in (("target", e.target), ("draft", e.draft)):
        lines.append(f"{role:<9} " + (_model_line(model) if model else "none"))
    lines.append(f"engine    vllm {e.engine.vllm_version or '?'}, torch {e.engine.torch_version or '?'}")
    lines.append(
        f"machine   {host.machine_line(e.host)}; FP8 attention "
        f"{host.fp8_attention_ran(e.audits) or 'not recorded'}; INT4 weights {host.int4_path_ran(e.audits) or 'none'}"
    )
    flags = parse_flags(e.engine.command)
    lines.append(
        "flags     "
        + " ".join(
            k if v is None else f"{k} {v}" for k, v in flags.items() if k.startswith("--") and k not in PER_RUN_FLAGS
        )
    )
    lines.append("starts")
    for s in run.starts:
        rates = throughput.prompt_rates(s)
        median = throughput.endpoint_median(list(rates.values())) if rates else None
        lines.append(
            f"  start-{s.start_index}  {s.status:<6}  "
            + (f"endpoint median {median:.2f} tok/s" if median is not None else "no endpoint median")
            + (f"  ready {s.ready_s:.1f} s" if s.ready_s is not None else "")
            + f"  {_count(len(s.requests), 'request')}"
            + (f"  failure: {s.failure.message}" if s.failure else "")
        )
    lines += _speed_lines(run)
    lines.append(_verdict_line(run))
    return "\n".join(lines)


def _speed_lines(run: Run) -> list[str]:
    """Gate 7's speed decisions as the gate takes them (reproduction.speed_decisions), with how many passes the
    session served and why: for a run whose starts all went to the end."""
    from .replay import recorded_contract
    from .reproduction import speed_decisions, speed_figures

    if len(run.starts) < 2 or any(s.status != "ok" for s in run.starts):
        return []
    try:
        contract = recorded_contract(run.starts, run.folder)
    except evidence.EvidenceError as e:
        return [f"gate 7    no speed figure: {e}"]
    lines, starts = [], list(run.starts)
    for d in speed_decisions(starts, speed_figures(starts, contract), contract):
        if d.paired is not None:
            within = "inside" if d.paired_within else "OUTSIDE"
            lines.append(
                f"gate 7    paired start-{d.start} / start-1 {d.paired.line()}; {d.rule} rule, "
                f"1 +/- {d.paired_tolerance:g}: {within}"
            )
    if (schedule := run.first.schedule) is not None:
        lines.append(
            f"          {_count(schedule.passes, 'pass', 'passes')} served"
            + (f": {schedule.sampling.stopped}" if schedule.sampling else " (fixed by the contract)")
        )
    return lines


def _model_line(m: evidence.ModelRef) -> str:
    return "  ".join(
        part
        for part in (
            m.ref + (f"@{m.revision}" if m.revision else ""),
            f"digest {m.digest}" if m.digest else "no checkpoint digest",
            f"manifest {m.manifest_digest}" if m.manifest_digest else "",
        )
        if part
    )


def _verdict_line(run: Run) -> str:
    line = "verdict   " + headline(run)[1]
    return line + "".join(f"\n          note: {n}" for n in run.notes)


def headline(run: Run) -> tuple[str, str]:
    """(kind, line) of a run folder's verdict as `evidence show` and `b70lab report` print it: the recorded one,
    else the verdict judged now from the evidence (kind "none": nothing was recorded, nothing is promoted)."""
    if run.promotion is None and run.starts:
        from ..contract import project
        from . import folder as judge

        return "none", judge.unrecorded_headline(run.folder, project.find("tests/gates") / "__snapshots__")
    return verdict_mod.recorded_headline(run.promotion, run.starts, run.folder)


# --- two runs -----------------------------------------------------------------------------------------


def compare_runs(a: Run, b: Run, *, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> Comparison:
    """Everything that differs between run A and run B, and B's decode speed relative to A's."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    ea, eb = a.first, b.first
    digest = (
        None
        if ea.contract.digest == eb.contract.digest
        else Change("contract digest", ea.contract.digest, eb.contract.digest)
    )
    ids_a = [r.prompt_id for r in ea.requests]
    ids_b = {r.prompt_id for r in eb.requests}
    rates_a, rates_b = _rates(a), _rates(b)
    prompts = tuple(_compare_prompt(pid, a, b, rates_a.get(pid), rates_b.get(pid)) for pid in ids_a if pid in ids_b)
    class_a, class_b = host.start_class(ea), host.start_class(eb)
    return Comparison(
        a=a.folder,
        b=b.folder,
        contract_digest=digest,
        contract=tuple(diff_values(ea.contract.canonical, eb.contract.canonical)),
        flags=tuple(_diff_maps(_launch_flags(ea.engine.command), _launch_flags(eb.engine.command))),
        environment=tuple(_diff_maps(_environment(ea.engine.environment), _environment(eb.engine.environment))),
        models=tuple(_diff_models(ea, eb)),
        versions=tuple(_diff_maps(_versions(ea), _versions(eb))),
        prompts=prompts,
        only_in_a=tuple(pid for pid in ids_a if pid not in ids_b),
        only_in_b=tuple(r.prompt_id for r in eb.requests if r.prompt_id not in ids_a),
        speed=_speed({p.prompt_id: (p.rate_a, p.rate_b) for p in prompts}, confidence, resamples, seed),
        host_classes=(class_a, class_b),
        speed_not_compared=class_a.not_compared(class_b),
    )


def speedup_figure(target_only: Run, candidate: Run) -> dict[str, Any]:
    """The candidate's speed over its target-only run (--b70-speedup, the sweep's target-only variant): the
    paired ratio with its interval, the ratio of medians, and whether the tokens agreed. A CompareError where
    no prompt has a rate on both sides."""
    c = compare_runs(target_only, candidate)
    p = c.speed.paired
    if p is None:
        raise CompareError(
            f"no prompt has a decode rate in both {target_only.folder} and {candidate.folder}: no speed-up can be told"
        )
    return {
        "ratio": p.ratio,
        "low": p.low,
        "high": p.high,
        "prompts": p.prompts,
        "confidence": p.confidence,
        "ratio_of_medians": c.speed.ratio,
        "target_only_median_tok_s": c.speed.median_a,
        "candidate_median_tok_s": c.speed.median_b,
        "outputs_identical": c.identical_outputs,
        "target_only_starts": len(target_only.starts),
        "candidate_starts": len(candidate.starts),
    }


def _versions(e: Evidence) -> dict[str, Any]:
    """What ran the experiment besides its flags: the libraries, the CPU, the FP8 attention path and the INT4
    weight path (outputs and speed depend on all of them)."""
    return {
        "vllm": e.engine.vllm_version,
        "torch": e.engine.torch_version,
        "cpu": host.describe(e.host) if e.host else None,
        "fp8 attention": host.fp8_attention_ran(e.audits),
        "int4 weights": host.int4_path_ran(e.audits),
    }


def diff_values(a: Any, b: Any, prefix: str = "") -> list[Change]:
    """Dotted keys down to the deepest level where both sides are still mappings (`engine.kv_cache_dtype`);
    a key on one side only reads as absent on the other."""
    if isinstance(a, dict) and isinstance(b, dict):
        changes: list[Change] = []
        for key in sorted(a.keys() | b.keys()):
            changes += diff_values(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{prefix}.{key}" if prefix else key)
        return changes
    return [] if a == b else [Change(prefix, a, b)]


def parse_flags(command: list[str]) -> dict[str, str | None]:
    """A launch command as `--flag: value` (None for a bare switch); positional words as `argv[i]`."""
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(command):
        word = command[i]
        if word.startswith("-") and not _is_number(word):
            name, eq, value = word.partition("=")
            if eq:
                flags[name] = value
            elif i + 1 < len(command) and (not command[i + 1].startswith("-") or _is_number(command[i + 1])):
                flags[name] = command[i + 1]
                i += 1
            else:
                flags[name] = None
        else:
            flags[f"argv[{i}]"] = word
        i += 1
    return flags


def _launch_flags(command: list[str]) -> dict[str, Any]:
    return {
        k: portable(v) if v is not None else None for k, v in parse_flags(command).items() if k not in PER_RUN_FLAGS
    }


def _environment(env: dict[str, str]) -> dict[str, Any]:
    return {k: portable(v) for k, v in env.items() if not _SOCKET_DIR.search(v)}


def portable(value: str) -> str:
    """A value with every file-system path cut to its last two parts: where a machine keeps its files is not
    part of the experiment (the checkpoint digests are), so a recorded bundle compares with a live run."""

    def tail(m: re.Match[str]) -> str:
        parts = [p for p in m.group(0).split("/") if p]
        return "…/" + "/".join(parts[-2:])

    return _PATH.sub(tail, value)


def _diff_maps(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    return [
        Change(k, a.get(k, _ABSENT), b.get(k, _ABSENT))
        for k in sorted(a.keys() | b.keys())
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    ]


def _diff_models(ea: Evidence, eb: Evidence) -> list[Change]:
    def fields(m: evidence.ModelRef | None) -> dict[str, Any]:
        return (
            {}
            if m is None
            else {
                "ref": portable(m.ref),
                "revision": m.revision,
                "manifest_digest": m.manifest_digest,
                "digest": m.digest,
            }
        )

    changes = []
    for role in ("target", "draft"):
        ma, mb = getattr(ea, role), getattr(eb, role)
        if (ma is None) != (mb is None):
            changes.append(Change(role, portable(ma.ref) if ma else None, portable(mb.ref) if mb else None))
        else:
            changes += [Change(f"{role}.{c.key}", c.a, c.b) for c in _diff_maps(fields(ma), fields(mb))]
    return changes


def _rates(run: Run) -> dict[str, float]:
    """Per prompt, the median decode rate over the run's starts, each start's taken as gate 7 takes it (every
    counted pass of an interleaved start: throughput.prompt_rates), recomputed from the arrival times; prompts
    with no rate are left out."""
    seen: dict[str, list[float]] = {}
    for start in run.starts:
        for pid, rate in throughput.prompt_rates(start).items():
            seen.setdefault(pid, []).append(rate)
    return {pid: statistics.median(rates) for pid, rates in seen.items()}


def _compare_prompt(pid: str, a: Run, b: Run, rate_a: float | None, rate_b: float | None) -> PromptComparison:
    ra, rb = a.first.request(pid), b.first.request(pid)
    assert ra is not None and rb is not None
    ta, tb = ra.token_ids, rb.token_ids
    position = first_difference(ta, tb)
    context_a = context_b = ""
    if position is not None or ra.text != rb.text:
        c = first_difference(ra.text, rb.text)
        c = len(ra.text) if c is None else c
        context_a, context_b = (t[max(0, c - CONTEXT_CHARS) : c + CONTEXT_CHARS] for t in (ra.text, rb.text))
    return PromptComparison(
        prompt_id=pid,
        identical=position is None,
        position=position,
        token_a=ta[position] if position is not None and position < len(ta) else None,
        token_b=tb[position] if position is not None and position < len(tb) else None,
        length_a=len(ta),
        length_b=len(tb),
        context_a=context_a,
        context_b=context_b,
        starts_agree_a=_starts_agree(a, pid),
        starts_agree_b=_starts_agree(b, pid),
        rate_a=rate_a,
        rate_b=rate_b,
    )


def _starts_agree(run: Run, pid: str) -> bool:
    answers = {tuple(r.token_ids) for s in run.starts if (r := s.request(pid)) is not None}
    return len(answers) <= 1


def _speed(pairs: dict[str, tuple[float | None, float | None]], confidence: float, resamples: int, seed: int) -> Speed:
    import numpy as np  # here, not at the top: `b70lab` imports this module for its error type

    usable = {pid: (x, y) for pid, (x, y) in pairs.items() if x and y}
    n = len(usable)
    if n == 0:
        return Speed(None, None, None, None, None, None, 0, confidence, resamples)
    paired = throughput.paired_ratio(
        {pid: x for pid, (x, _) in usable.items()},
        {pid: y for pid, (_, y) in usable.items()},
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    ra, rb = (np.array(side, dtype=float) for side in zip(*usable.values(), strict=False))
    median_a, median_b = float(np.median(ra)), float(np.median(rb))
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    ratios = np.median(rb[idx], axis=1) / np.median(ra[idx], axis=1)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Speed(paired, median_b / median_a, float(low), float(high), median_a, median_b, n, confidence, resamples)


# --- the report ---------------------------------------------------------------------------------------


def format_comparison(c: Comparison) -> str:
    """The headline, then every difference, then the prompts one per line."""
    lines = [c.headline(), f"A  {c.a}", f"B  {c.b}"]
    if c.contract_digest:
        lines.append(c.contract_digest.line())
    for title, changes in (
        ("contract", c.contract),
        ("engine flags", c.flags),
        ("environment", c.environment),
        ("models", c.models),
        ("versions", c.versions),
    ):
        lines.append(f"{title}: " + ("identical" if not changes else _differ(len(changes), "entry", "entries")))
        lines += [f"  {ch.line()}" for ch in changes]
    s = c.speed
    if c.speed_not_compared:
        lines.append(f"speed: {c.speed_not_compared}")
    elif s.median_a is not None:
        lines.append(
            f"speed: median over {_count(s.prompts, 'prompt')} {s.median_a:.2f} -> {s.median_b:.2f} tok/s; "
            f"paired: the geometric mean of the per-prompt ratios below "
            f"(per prompt: median decode rate over each run's starts; intervals: percentile bootstrap "
            f"over prompts, {s.resamples} resamples)"
        )
    lines.append("prompts (tokens of each run's first completed start):")
    width = max((len(p.prompt_id) for p in c.prompts), default=0)
    for p in c.prompts:
        speed = f"{p.rate_a:.1f} -> {p.rate_b:.1f} tok/s x{p.ratio:.3f}" if p.ratio else "no rate in both runs"
        if p.identical:
            what = f"identical ({p.length_a} tokens)"
        else:
            what = (
                f"differs at token {p.position}: {_token(p.token_a)} vs {_token(p.token_b)} "
                f"({p.length_a} vs {p.length_b} tokens); text {p.context_a!r} vs {p.context_b!r}"
            )
        flaky = [run for run, agree in (("A", p.starts_agree_a), ("B", p.starts_agree_b)) if not agree]
        lines.append(
            f"  {p.prompt_id:<{width}}  {speed:<32}  {what}"
            + (f"  (starts within {' and '.join(flaky)} disagree)" if flaky else "")
        )
    for run, ids in (("A", c.only_in_a), ("B", c.only_in_b)):
        if ids:
            lines.append(f"only in {run}: {', '.join(ids)}")
    lines.append("only the speed changed" if c.only_speed_changed else "more than the speed changed")
    return "\n".join(lines)


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True)


def _token(t: int | None) -> str:
    return "end" if t is None else str(t)


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _differ(n: int, word: str, plural: str | None = None) -> str:
    return f"{_count(n, word, plural)} {'differs' if n == 1 else 'differ'}"


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
