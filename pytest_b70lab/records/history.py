"""A decode figure's history over many runs, rebuilt from what the lab keeps (run folders, seals, sweep and bench
folders: anything holding start-N/evidence.json), one series per contract and host class, with its change points.

Nothing is appended in place: a CI job's folder is gone after it, so the series is whatever evidence is found
now, every file read (and its digest checked) as `evidence show` reads it. A point is one run folder: its
contract and digest, the host class it ran on, the lab commit, vLLM and torch, and its figure: the median over
prompts of each prompt's median measurement (every counted pass of every start), with a 90 % bootstrap interval
that resamples each prompt's measurements. Speeds are compared only within one host class.

Change points come from ruptures' PELT search on the log figures (a least-squares cost, so a step in the level):
"decode fell 4.1 % at commit abc1234" is found without anyone comparing runs by hand."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..digests import sha256_canonical
from ..errors import LabError
from ..evidence import host, throughput
from ..evidence import record as evidence
from ..evidence.record import Evidence
from .store import SEAL_FILE

CONFIDENCE = 0.90
# ruptures' PELT needs a penalty per change point. With a least-squares cost on the log figures, a step of size d
# between segments of n1 and n2 points lowers the cost by d^2 n1 n2 / (n1 + n2); the penalty is
# PENALTY_FACTOR sigma^2 log(n), sigma being the series' own run-to-run noise (NOISE_FLOOR at least). Chosen by
# simulation (normal noise, 300 series each): factor 4 gives a false change point in 9 % of 8-point series, 5 % of
# 20-point and 1 % of 40-point ones, and finds a step of 2 sigma in 38 %, 63 % and 80 % of them; factor 2 doubles
# the false ones, factor 9 halves what is found.
PENALTY_FACTOR = 4.0
NOISE_FLOOR = 0.005  # identical runs still differ by this much: a step below it is not a regression
MIN_SEGMENT = 2  # points a segment needs: one outlying run is not a regime


class HistoryError(LabError):
    """Nothing to build a history from, or a folder that cannot be read as one."""


@dataclass(frozen=True)
class Point:
    folder: str
    kind: str  # "seal" or "run"
    contract: str
    digest: str
    host_class: str
    when: str  # start-1's launch time (ISO 8601): the series' order
    commit: str | None
    vllm: str | None
    torch: str | None
    figure: float  # tok/s
    low: float
    high: float
    starts: int
    starts_digest: str  # which starts these are (starts_digest): the same run found in two folders is one point
    also: tuple[str, ...] = ()  # the other folders holding the same starts (a run folder and its seal)

    @property
    def where(self) -> str:
        """Its folder as printed and drawn, with the other folders holding the same run."""
        return self.folder + (f" (also {', '.join(self.also)})" if self.also else "")


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first point of the new level
    before: float  # median figure of the segment before, tok/s
    after: float  # and of the segment from `index`

    @property
    def change(self) -> float:
        return self.after / self.before - 1


@dataclass
class Series:
    contract: str
    host_class: str
    points: list[Point] = field(default_factory=list)
    changes: list[ChangePoint] = field(default_factory=list)

    def change_line(self, c: ChangePoint) -> str:
        p = self.points[c.index]
        verb = "rose" if c.change > 0 else "fell"
        return (
            f"decode {verb} {abs(c.change):.1%} at commit {short(p.commit)} ({p.when[:19]}, {p.folder}): "
            f"{c.before:.2f} -> {c.after:.2f} tok/s, the medians of the {c.index} points before and the "
            f"{len(self.points) - c.index} from there"
        )


def short(commit: str | None) -> str:
    if not commit:
        return "unknown"
    return commit[:10] + ("-dirty" if commit.endswith("-dirty") else "")


def find_runs(paths: Iterable[Path]) -> dict[Path, list[Path]]:
    """Every run folder under `paths` (a folder holding start-N/evidence.json), with its evidence files."""
    found: dict[Path, list[Path]] = {}
    for base in paths:
        if not base.exists():
            raise HistoryError(f"{base} does not exist")
        for path in sorted(base.rglob(evidence.FILENAME)):
            if path.parent.name.startswith("start-"):
                found.setdefault(path.parent.parent, []).append(path)
    return found


def point(folder: Path, files: Sequence[Path]) -> tuple[Point | None, str | None]:
    """The run folder's point, or why it has none (a failed start, no decode rate)."""
    try:
        starts = sorted((evidence.read(p) for p in files), key=lambda s: s.start_index)
    except evidence.EvidenceError as e:
        return None, f"{folder}: {e}"
    if failed := [s.start_index for s in starts if s.status != "ok"]:
        return None, f"{folder}: start-{failed[0]} failed: no figure"
    first = starts[0]
    if len({s.contract.digest for s in starts}) != 1:
        return None, f"{folder}: its starts were recorded under different contracts"
    samples = prompt_samples(starts)
    if not samples:
        return None, f"{folder}: no prompt has a decode rate at every start"
    figure, low, high = median_interval(samples)
    return (
        Point(
            folder=str(folder),
            kind="seal" if (folder / SEAL_FILE).is_file() else "run",
            contract=first.contract.name,
            digest=first.contract.digest,
            host_class=class_of(first),
            when=first.created_at,
            commit=first.lab_commit,
            vllm=first.engine.vllm_version,
            torch=first.engine.torch_version,
            figure=figure,
            low=low,
            high=high,
            starts=len(starts),
            starts_digest=starts_digest(starts),
        ),
        None,
    )


def starts_digest(starts: Sequence[Evidence]) -> str:
    """Which engine starts a run folder holds: each start's launch nonce and time (a seal's copy redacts the
    machine's paths, so its evidence digests differ from its run folder's; the nonce is each start's own)."""
    return sha256_canonical([[s.start_index, s.identity.nonce if s.identity else None, s.created_at] for s in starts])


def class_of(start: Evidence) -> str:
    """The start's host class (evidence.host.host_class: the CPU exactly, its cores, GPUs, any emulation and the
    FP8 attention path its ranks ran), by its label and key (two classes may share a label: a stepping, say):
    speeds are compared within one class only."""
    found = host.start_class(start)
    return f"{found.label} [{found.key}]"


def prompt_samples(starts: Sequence[Evidence]) -> dict[str, list[float]]:
    """Per prompt, every counted decode rate of every start (each pass of an interleaved start; the one request of
    a sequential one): the measurements a point's figure and interval come from."""
    out: dict[str, list[float]] = {}
    for s in starts:
        if s.schedule is None:
            found = throughput.arrival_rates(s.requests)[0]
            pairs = list(found.items())
        else:
            pairs = [(k[1], v) for k, v in throughput.counted_rates(s)[0].items()]
        for prompt_id, rate in pairs:
            out.setdefault(prompt_id, []).append(rate)
    common = [k for k, v in out.items() if len(v) >= len(starts)]
    return {k: out[k] for k in sorted(common)}


def median_interval(
    samples: dict[str, list[float]], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The median over prompts of each prompt's median measurement, with a percentile bootstrap that resamples
    each prompt's own measurements: the interval says how much the figure would move if the run were measured
    again, not how much the prompts differ (they differ 2-3x, and every run serves the same ones)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    point = statistics.median(statistics.median(v) for v in samples.values())
    columns = []
    for values in samples.values():
        v = np.asarray(values, dtype=float)
        columns.append(np.median(v[rng.integers(0, len(v), size=(resamples, len(v)))], axis=1))
    low, high = np.quantile(np.median(np.stack(columns, axis=1), axis=1), [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return float(point), float(low), float(high)


def build(paths: Iterable[Path], contract: str | None = None) -> tuple[list[Series], list[str]]:
    """The series under `paths` (of one contract, by name, where given), each with its change points, and the
    folders that gave no point, with why."""
    runs = find_runs(paths)
    kept: dict[str, Point] = {}
    skipped: list[str] = []
    for folder, files in sorted(runs.items()):
        found, why = point(_shown(folder), files)
        if found is None:
            skipped.append(why or str(folder))
            continue
        if contract is not None and found.contract != contract:
            continue
        earlier = kept.get(found.starts_digest)
        kept[found.starts_digest] = found if earlier is None else one_run(earlier, found)
    by_key: dict[tuple[str, str], Series] = {}
    for found in kept.values():
        key = (found.contract, found.host_class)
        by_key.setdefault(key, Series(*key)).points.append(found)
    series = sorted(by_key.values(), key=lambda s: (s.contract, s.host_class))
    for s in series:
        s.points.sort(key=lambda p: (p.when, p.folder))
        s.changes = change_points([p.figure for p in s.points])
    return series, skipped


def one_run(a: Point, b: Point) -> Point:
    """One point for the same starts found twice (a run folder and its seal, whose copy of the evidence has the
    paths redacted): counted as two they would double one run's weight (two points make a segment of the
    change-point search). The seal is the point shown, the other folder named beside it."""
    first, second = (b, a) if b.kind == "seal" and a.kind != "seal" else (a, b)
    return replace(first, also=(*first.also, second.folder, *second.also))


def _shown(folder: Path) -> Path:
    """A folder as the user would type it: relative to the working folder where it lies below it."""
    try:
        return folder.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return folder


def change_points(figures: Sequence[float]) -> list[ChangePoint]:
    """Where the level of the series moves (ruptures.Pelt, least squares on the log figures)."""
    if len(figures) < 2 * MIN_SEGMENT:
        return []
    import numpy as np
    import ruptures

    y = np.log(np.asarray(figures, dtype=float))
    sigma = noise(list(y))
    ends = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(y.reshape(-1, 1))
    breaks = ends.predict(pen=PENALTY_FACTOR * sigma**2 * math.log(len(y)))[:-1]
    out = []
    bounds = [0, *breaks, len(y)]
    for i, at in enumerate(breaks, 1):
        before = statistics.median(figures[bounds[i - 1] : at])
        after = statistics.median(figures[at : bounds[i + 1]])
        out.append(ChangePoint(at, before, after))
    return out


def noise(log_figures: Sequence[float]) -> float:
    """The series' run-to-run noise on the log scale: the spread of successive differences (1.4826 MAD / sqrt 2,
    which a step moves by one difference only), at least NOISE_FLOOR."""
    steps = [b - a for a, b in zip(log_figures, log_figures[1:], strict=False)]
    spread = 1.4826 * statistics.median(abs(d) for d in steps) / math.sqrt(2) if steps else 0.0
    return max(spread, NOISE_FLOOR)
