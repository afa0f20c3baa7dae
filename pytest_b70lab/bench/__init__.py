"""`b70lab bench`: what the harness costs, and whether its decode figure agrees with the tools a lab would
otherwise reach for. One run, one table of ratios and medians against each goal: a benchmark on a shared,
noisy machine, so it reports and never asserts.

Rows (each a part that can be run alone with --parts):
  overhead  `pytest -m gates` wall time vs a bare script making the same starts and streamed requests with
            no audits, evidence or gates (goal <= 1.05)
  decode    one start: the client's (N-1)/(t_N-t_1) median vs the server's own per-token figure vs
            `vllm bench serve` on the same prompts (goal: within 1 %). `vllm bench serve` speaks TCP only,
            so this start listens on loopback behind a fresh API key (engine.command.TcpListen); the gates keep
            their private socket
  start     two starts on an empty compile cache: the first compiles, the second loads vLLM's AOT artifacts
            (goal: second start <= 40 % of the first), each split by phase
  replay    `pytest -m gates --b70-evidence RUN` on a saved run (goal < 2 s)
  audit     the worker audit's weight hashing rate on one core (bytes per second per rank), and what it
            would spend on a production rank (the audit streams each tensor in 64 MiB chunks)
  import    what the auto-loaded plugin adds to `pytest --co` of a one-test file that does not use it
            (goal <= 50 ms)
  reproduction
            start-2 / start-1 over consecutive `make gates` sessions (--sessions, default 10): the endpoint
            median ratio and the paired figure (gate 7's), their median, min and max, and whether each start
            compiled or loaded its graphs (goal: paired drift <= 0.10 in every session). Tens of minutes:
            not among the default parts. --compile-cache empty empties vLLM's compile cache before each
            session, so that start-1 compiles and start-2 loads in every one, as on a fresh clone
  steadiness
            the control for reproduction: one start per session (--sessions) streams the gate prompts, waits
            --gap-s (about what a restart takes), and streams them again; pass-2 / pass-1 by the paired
            figure, with the host's steal time during each pass beside it. If one
            process drifts as far over the same time as two fresh starts do, nothing about a fresh start is
            needed to explain the drift. Tens of minutes: not among the default parts
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import LabError

PARTS = ("import", "replay", "audit", "start", "decode", "overhead", "reproduction", "steadiness")
DEFAULT_PARTS = PARTS[:-2]
REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"


@dataclass
class Figure:
    """One row of the table: what was measured, the goal, whether it was met (None: not measurable)."""

    part: str
    measure: str
    value: float | None
    unit: str
    goal: str
    met: bool | None
    detail: str = ""
    raw: dict = field(default_factory=dict)

    def cells(self) -> list[str]:
        value = "-" if self.value is None else f"{self.value:.3f}" if self.unit == "x" else f"{self.value:.1f}"
        verdict = {True: "met", False: "MISSED", None: "n/a"}[self.met]
        return [self.part, self.measure, f"{value} {self.unit}".strip(), self.goal, verdict, self.detail]


def table(figures: Sequence[Figure]) -> str:
    rows = [["part", "measure", "figure", "goal", "", "detail"], ["---"] * 6] + [f.cells() for f in figures]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _wall(
    cmd: Sequence[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, done


def _checked(done: subprocess.CompletedProcess, what: str, ok: Sequence[int] = (0,)) -> None:
    if done.returncode not in ok:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise BenchError(f"{what} exited with {done.returncode}:\n{tail}")


class BenchError(LabError, RuntimeError):
    """A part could not be measured (the command it times failed); the message says which and why."""


# --- import: the plugin's cost on runs that do not use it -------------------------------------------------


def plugin_cost(repeats: int = 21) -> Figure:
    """Alternating runs with and without `-p no:b70lab` in a folder of its own (no project conftest or
    ini), so the difference of the medians is the plugin alone: its import and its hooks."""
    with tempfile.TemporaryDirectory(prefix="b70bench-") as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text("[pytest]\n")
        (folder / "test_one.py").write_text("def test_one():\n    pass\n")
        base = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "test_one.py"]
        with_plugin: list[float] = []
        without: list[float] = []
        for _ in range(repeats):
            for times, extra in ((with_plugin, []), (without, ["-p", "no:b70lab"])):
                seconds, done = _wall(base + extra, folder)
                _checked(done, "pytest --co on a one-test file")
                times.append(seconds)
    cost_ms = (statistics.median(with_plugin) - statistics.median(without)) * 1000
    import_ms = statistics.median(_module_import_ms("pytest_b70lab.plugin") for _ in range(5))
    return Figure(
        "import",
        "plugin cost on an unrelated `pytest --co`",
        cost_ms,
        "ms",
        "<= 50 ms",
        cost_ms <= 50,
        f"median of {repeats}: {statistics.median(with_plugin) * 1000:.0f} ms with the plugin, "
        f"{statistics.median(without) * 1000:.0f} ms with -p no:b70lab (run-to-run noise is tens of ms); "
        f"the plugin module's own import (-X importtime, pytest already loaded): {import_ms:.1f} ms",
        {"with_s": with_plugin, "without_s": without, "plugin_import_ms": import_ms},
    )


def _module_import_ms(module: str) -> float:
    """Cumulative import time of `module` alone, pytest imported first (it is loaded before any plugin)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import pytest; import {module}"], capture_output=True, text=True
    )
    _checked(done, f"python -X importtime -c 'import {module}'")
    for line in done.stderr.splitlines():
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2] == module:
            return int(fields[1]) / 1000
    raise BenchError(f"python -X importtime did not report {module}")


# --- replay: the gates on saved evidence ---------------------------------------------------------------------


def replay_time(run_dir: Path = BUNDLE, repeats: int = 5) -> Figure:
    """As a user types it, from the repository root (all test folders in reach). A replay writes its verdict
    into the run folder, so it replays a copy: the recorded bundle stays as it was committed."""
    import shutil

    walls = []
    with tempfile.TemporaryDirectory(prefix="b70bench-") as tmp:
        copy = Path(tmp) / run_dir.name
        shutil.copytree(run_dir, copy)
        # `=`: pytest fixes its root folder before plugins load, and would take a separate DIR outside the
        # repository for a test path (and its root folder: the project's ini unread, the cwd collected).
        cmd = [sys.executable, "-m", "pytest", "-m", "gates", f"--b70-evidence={copy}", "-q", "-p", "no:cacheprovider"]
        for _ in range(repeats):
            seconds, done = _wall(cmd, REPO)
            _checked(done, f"the replay of {run_dir}")
            walls.append(seconds)
    median = statistics.median(walls)
    return Figure(
        "replay",
        f"`pytest -m gates --b70-evidence` on {run_dir.name}",
        median,
        "s",
        "< 2 s",
        median < 2,
        f"median of {repeats} (min {min(walls):.2f} s)",
        {"walls_s": walls},
    )


# --- audit: the weight hashing every rank does at every start ----------------------------------------------


def audit_rate(megabytes: int = 1024, repeats: int = 3) -> Figure:
    """The audit's own hash function over a tensor of `megabytes`: on CPU this is SHA-256 over host memory;
    on an XPU rank each 64 MiB chunk is first copied to the host, so this is an upper bound there."""
    import torch

    from ..in_engine.worker_ext import _tensor_sha256

    t = torch.ones(megabytes << 20, dtype=torch.uint8)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _tensor_sha256(t)
        rates.append(t.numel() / (time.perf_counter() - t0))
    rate = statistics.median(rates)
    per_10gb = 10e9 / rate
    return Figure(
        "audit",
        "weight hashing per rank (one core)",
        rate / 1e6,
        "MB/s",
        "report",
        None,
        f"median of {repeats} over {megabytes} MiB; {per_10gb:.0f} s per 10 GB of weights on a rank "
        f"(ranks hash in parallel)",
        {"bytes_per_s": rates},
    )


# --- decode: client vs server vs vllm bench serve ---------------------------------------------------------


def per_token_rate(tpots_s: Sequence[float]) -> float:
    """Tokens per second from per-request times per output token: 1 / their mean, which is what the
    server's `request_time_per_output_token` histogram gives (sum / count), so the three sources are
    compared on one statistic. (The gates' endpoint figure is the median of per-request rates instead.)"""
    return 1.0 / statistics.fmean(tpots_s)


def _bench_serve_tpots(result: dict) -> list[float]:
    """Per request (latency - ttft) / (N - 1), from `vllm bench serve`'s detailed result: the same
    accounting as the client's (t_N - t_1) / (N - 1)."""
    return [
        (latency - ttft) / (n - 1)
        for n, latency, ttft in zip(result["output_lens"], result["latencies"], result["ttfts"], strict=False)
        if n > 1 and latency > ttft
    ]


def _vllm_bench_serve(
    round_no: int,
    tcp,
    model: str,
    tokenizer: str,
    dataset: Path,
    tokens: int,
    count: int,
    work: Path,
    env: dict[str, str],
) -> float:
    """One `vllm bench serve` over the dataset's prompts against the running server: its decode rate."""
    from ..engine.command import ENTRY_MODULE

    result = f"vllm-bench-serve-{round_no}.json"
    cmd = [
        sys.executable,
        "-m",
        ENTRY_MODULE,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        tcp.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--sharegpt-output-len",
        str(tokens),
        "--num-prompts",
        str(count),
        "--max-concurrency",
        "1",
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        "0",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(work),
        "--result-filename",
        result,
    ]
    _seconds, done = _wall(cmd, work, env)
    (work / f"vllm-bench-serve-{round_no}.log").write_text(done.stdout + done.stderr)
    _checked(done, "vllm bench serve")
    tpots = _bench_serve_tpots(json.loads((work / result).read_text()))
    if len(tpots) != count:
        raise BenchError(f"vllm bench serve measured {len(tpots)} of {count} requests ({work / result})")
    return per_token_rate(tpots)


def _sharegpt_dataset(prompts: list, work: Path) -> Path:
    """The prompts in ShareGPT's layout, not vLLM's "custom" JSONL: the custom loader needs pandas, which the
    engine does not; the completion turn is a placeholder (--sharegpt-output-len fixes the output length)."""
    work.mkdir(parents=True, exist_ok=True)
    dataset = work / "prompts-sharegpt.json"
    dataset.write_text(
        json.dumps(
            [{"conversations": [{"from": "human", "value": p.prompt}, {"from": "gpt", "value": "-"}]} for p in prompts]
        )
    )
    return dataset


def decode_agreement(
    contract_name: str, cache_root: Path, out_dir: Path, rounds: int = 3, say: Callable[[str], None] = print
) -> list[Figure]:
    """One start; `rounds` times: the client streams every prompt (the server's histograms cover exactly
    those requests), then `vllm bench serve` sends the same prompts. Client and server are compared on the
    same requests; client and `vllm bench serve` on medians over rounds, as they cannot share a request."""
    from ..contract import schema as contract_mod
    from ..engine.client import metrics_text, served_model, stream_completion
    from ..engine.command import TcpListen
    from ..engine.server import start_engine
    from ..engine.starts import resolve_models, serve_config
    from ..evidence import throughput

    c = contract_mod.load(contract_name)
    prompts = contract_mod.load_prompts(c)
    models = resolve_models(c, cache_root)
    config = serve_config(c, models)
    tcp = TcpListen.fresh()
    tokens = c.decode.tokens_per_request
    phases: dict[str, float] = {}

    def progress(phase: str, seconds: float) -> None:
        phases[phase] = seconds
        say(f"decode start: {phase} ({seconds:.0f} s)")

    work = out_dir / "decode"
    dataset = _sharegpt_dataset(prompts, work)
    env = {**os.environ, "OPENAI_API_KEY": tcp.api_key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    server = start_engine(
        config, work, cache_root / "engine-state", tcp=tcp, deadline_s=c.deadlines.start_s, on_progress=progress
    )
    client_rates, server_rates, bench_rates, endpoint_medians = [], [], [], []
    try:
        with server.client(timeout=c.deadlines.request_s) as client:
            model = served_model(client)
            stream_completion(client, model, "warm up", 8, prompt_id="warm-up")
            for r in range(1, rounds + 1):
                before = metrics_text(client)
                rates = []
                for p in prompts:
                    req = stream_completion(
                        client, model, p.prompt, tokens, prompt_id=p.id, timeout_s=c.deadlines.request_s
                    )
                    rates.append(throughput.decode_rate(req.chunk_times, req.chunk_tokens))
                _step_s, per_token_s, _rate = throughput.server_decode_figures(before, metrics_text(client))
                client_rates.append(per_token_rate([1 / x for x in rates]))
                server_rates.append(1 / per_token_s if per_token_s else float("nan"))
                endpoint_medians.append(throughput.endpoint_median(rates))
                say(
                    f"decode round {r}: client {client_rates[-1]:.1f} tok/s, server {server_rates[-1]:.1f}; "
                    "vllm bench serve on the same prompts"
                )
                bench_rates.append(
                    _vllm_bench_serve(r, tcp, model, str(config.model_ref), dataset, tokens, len(prompts), work, env)
                )
                say(f"decode round {r}: vllm bench serve {bench_rates[-1]:.1f} tok/s")
    finally:
        server.stop()
    return [
        start_phases(phases),
        *_agreement_figures(rounds, client_rates, server_rates, bench_rates, endpoint_medians),
    ]


def _agreement_figures(
    rounds: int,
    client_rates: list[float],
    server_rates: list[float],
    bench_rates: list[float],
    endpoint_medians: list[float],
) -> list[Figure]:
    raw = {
        "client": client_rates,
        "server": server_rates,
        "vllm_bench_serve": bench_rates,
        "client_endpoint_medians": endpoint_medians,
    }
    same = [a / b for a, b in zip(client_rates, server_rates, strict=False)]
    server_ratio = statistics.median(same)
    bench_ratio = statistics.median(client_rates) / statistics.median(bench_rates)
    return [
        Figure(
            "decode",
            "client / server, same requests (1 / mean time per output token)",
            server_ratio,
            "x",
            "within 1 %",
            abs(server_ratio - 1) <= 0.01,
            f"median over {rounds} rounds; client {statistics.median(client_rates):.1f}, server "
            f"{statistics.median(server_rates):.1f} tok/s",
            raw,
        ),
        Figure(
            "decode",
            "client / `vllm bench serve`, same prompts",
            bench_ratio,
            "x",
            "within 1 %",
            abs(bench_ratio - 1) <= 0.01,
            f"medians over {rounds} rounds: {statistics.median(client_rates):.1f} vs "
            f"{statistics.median(bench_rates):.1f} tok/s; gate endpoint medians "
            + ", ".join(f"{m:.1f}" for m in endpoint_medians),
            raw,
        ),
    ]


def phase_spans(phases: dict[str, float]) -> str:
    """Where a start's seconds go, from the log lines engine.server.PHASES recognises: process start to the first
    weight load is Python imports and engine set-up, then weights, then Dynamo + Inductor (on CPU both
    happen while 'compiling', or the AOT artifacts load then), KV allocation, API server."""
    order = ["loading weights", "compiling", "allocating KV cache", "starting API server", "ready"]
    names = ["imports + set-up", "weights", "compile", "KV cache", "API server"]
    spans, last = [], 0.0
    for name, key in zip(names, order, strict=False):
        if key in phases:
            spans.append(f"{name} {phases[key] - last:.0f} s")
            last = phases[key]
    return ", ".join(spans)


def start_phases(phases: dict[str, float]) -> Figure:
    return Figure(
        "start",
        "engine start (decode part's start)",
        phases.get("ready"),
        "s",
        "report",
        None,
        phase_spans(phases),
        {"phases_s": phases},
    )


AOT_LOADED = "Directly load AOT compilation"


def compile_reuse(contract_name: str, cache_root: Path, out_dir: Path, say: Callable[[str], None] = print) -> Figure:
    """Two starts sharing an engine-state folder that starts empty: the first compiles and saves vLLM's AOT
    artifacts, the second should load them. Whether it did is read from the ranks' logs, not assumed."""
    from ..contract import schema as contract_mod
    from ..engine.server import start_engine
    from ..engine.starts import resolve_models, serve_config

    c = contract_mod.load(contract_name)
    config = serve_config(c, resolve_models(c, cache_root))
    state = out_dir / "start-state"
    shutil.rmtree(state, ignore_errors=True)
    phases: list[dict[str, float]] = []
    loaded: list[int] = []
    for index in (1, 2):
        seen: dict[str, float] = {}

        def progress(phase: str, seconds: float, seen=seen, index=index) -> None:
            seen[phase] = seconds
            say(f"start {index}: {phase} ({seconds:.0f} s)")

        work = out_dir / "starts" / f"start-{index}"
        start_engine(config, work, state, deadline_s=c.deadlines.start_s, on_progress=progress).stop()
        phases.append(seen)
        # The ranks' own logs only: server.log repeats their lines.
        loaded.append(sum(p.read_text(errors="replace").count(AOT_LOADED) for p in work.glob("ranks/*.log")))
    first, second = phases[0].get("ready"), phases[1].get("ready")
    if not first or not second:
        raise BenchError(f"a start never reported ready ({out_dir / 'starts'})")
    ratio = second / first
    detail = (
        f"{first:.0f} s compiling ({phase_spans(phases[0])}) then {second:.0f} s with "
        f"{loaded[1]} AOT artifacts loaded over the ranks ({phase_spans(phases[1])})"
    )
    return Figure(
        "start",
        "second start / first (compile cache empty, then warm)",
        ratio,
        "x",
        "<= 0.40",
        ratio <= 0.40 and loaded[1] > 0 and loaded[0] == 0,
        detail,
        {"phases_s": phases, "aot_artifacts_loaded": loaded},
    )


# --- overhead: pytest -m gates vs a bare script -----------------------------------------------------------


def _bare_progress(say: Callable[[str], None], index: int) -> Callable[[str, float], None]:
    def progress(phase: str, seconds: float) -> None:
        say(f"bare start-{index}: {phase} ({seconds:.0f} s)")

    return progress


def bare_starts(contract_name: str, cache_root: Path, out_dir: Path, say: Callable[[str], None] = print) -> float:
    """The gates' engine work and nothing else: the contract's fresh starts, each streaming every prompt
    once, no audit, no metrics, no evidence. Returns the wall time in seconds."""
    from ..contract import schema as contract_mod
    from ..engine.client import served_model, stream_completion
    from ..engine.server import start_engine
    from ..engine.starts import resolve_models, serve_config

    t0 = time.perf_counter()
    c = contract_mod.load(contract_name)
    prompts = contract_mod.load_prompts(c)
    config = serve_config(c, resolve_models(c, cache_root))
    for index in range(1, c.reproduction.fresh_starts + 1):
        server = start_engine(
            config,
            out_dir / "bare" / f"start-{index}",
            cache_root / "engine-state",
            deadline_s=c.deadlines.start_s,
            on_progress=_bare_progress(say, index),
        )
        try:
            with server.client(timeout=c.deadlines.request_s) as client:
                model = served_model(client)
                for p in prompts:
                    stream_completion(
                        client,
                        model,
                        p.prompt,
                        c.decode.tokens_per_request,
                        prompt_id=p.id,
                        timeout_s=c.deadlines.request_s,
                    )
        finally:
            server.stop()
    return time.perf_counter() - t0


def gates_overhead(contract_name: str, cache_root: Path, out_dir: Path, say: Callable[[str], None] = print) -> Figure:
    say("overhead: pytest -m gates")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gates",
        "-m",
        "gates",
        f"--b70-contract={contract_name}",
        f"--b70-run-dir={out_dir / 'gates'}",
        f"--b70-cache-dir={cache_root}",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
    ]
    gates_s, done = _wall(cmd, REPO)
    (out_dir / "gates.log").write_text(done.stdout + done.stderr)
    _checked(done, "pytest -m gates", ok=(0, 1))  # a NOT PROMOTABLE verdict still costs what it costs
    say(f"overhead: pytest -m gates took {gates_s:.1f} s; now the bare script")
    bare_s = bare_starts(contract_name, cache_root, out_dir, say)
    ratio = gates_s / bare_s
    return Figure(
        "overhead",
        "`pytest -m gates` wall / bare starts + requests",
        ratio,
        "x",
        "<= 1.05",
        ratio <= 1.05,
        f"{gates_s:.1f} s vs {bare_s:.1f} s",
        {"gates_s": gates_s, "bare_s": bare_s},
    )


# --- reproduction: start-2 / start-1 over consecutive gates sessions ----------------------------------------

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
    return SessionDrift(
        str(run_dir),
        medians[1] / medians[0],
        paired.ratio,
        paired.low,
        paired.high,
        tuple(_graph_source(s) for s in starts[:2]),
        c.reproduction.schedule,
        (medians[0], medians[1]),
    )


def drift_figures(sessions: Sequence[SessionDrift], schedule: str = "") -> list[Figure]:
    """Two rows: the median ratio and the paired figure over the sessions, each as median [min, max]."""
    if not sessions:
        raise BenchError("no session to summarise")
    kinds = statistics.multimode(" / ".join(s.graphs) for s in sessions)
    return _drift_rows(
        "reproduction",
        f"start-2 / start-1{f' ({schedule})' if schedule else ''}",
        "sessions",
        sessions,
        f"; graphs (start-1 / start-2) mostly {', '.join(kinds)}",
    )


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
    seconds, done = _wall(cmd, REPO)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_suffix(".log").write_text(done.stdout + done.stderr)
    _checked(done, f"gates session {n}", ok=(0, 1))  # a failed gate still has two starts to compare
    drift = session_drift(run_dir)
    say(
        f"reproduction: session {n} ({drift.schedule}): median ratio {drift.median_ratio:.3f}, paired "
        f"{drift.paired:.3f} [{drift.paired_low:.3f}, {drift.paired_high:.3f}], graphs {' / '.join(drift.graphs)}, "
        f"{seconds:.0f} s"
    )
    return drift


# --- steadiness: one start measured twice, the control for reproduction ------------------------------------


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine so far, from /proc/stat's first line: the hypervisor's
    steal is the time a runnable vCPU was not given a physical core."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


@dataclass(frozen=True)
class PassDrift:
    """One start's second pass over the gate prompts against its first, and what the machine did meanwhile."""

    paired: float
    paired_low: float
    paired_high: float
    median_ratio: float
    steal: tuple[float, float]  # share of the machine's time stolen during pass 1, pass 2


def _measured_pass(client, model: str, prompts, tokens: int, timeout_s: float) -> tuple[dict[str, float], float]:
    """Each prompt's decode rate, recomputed from its arrival times as gate 7 does, and the pass's steal."""
    from ..engine.client import stream_completion
    from ..evidence import throughput

    steal0, total0 = cpu_ticks()
    requests = [
        stream_completion(client, model, p.prompt, tokens, prompt_id=p.id, timeout_s=timeout_s) for p in prompts
    ]
    steal1, total1 = cpu_ticks()
    rates, problems = throughput.arrival_rates(requests)
    if problems:
        raise BenchError("steadiness pass: " + "; ".join(f"{k}: {v}" for k, v in problems.items()))
    return rates, (steal1 - steal0) / max(total1 - total0, 1)


def steadiness_sessions(
    contract_name: str,
    cache_root: Path,
    out_dir: Path,
    sessions: int = 10,
    gap_s: float = 50.0,
    say: Callable[[str], None] = print,
) -> list[Figure]:
    """`sessions` starts, each measuring the gate prompts twice `gap_s` apart, as a gates start measures them
    (no warm-up request, the contract's tokens per request)."""
    from ..contract import schema as contract_mod
    from ..engine.client import served_model
    from ..engine.server import start_engine
    from ..engine.starts import resolve_models, serve_config

    c = contract_mod.load(contract_name)
    prompts = contract_mod.load_prompts(c)
    config = serve_config(c, resolve_models(c, cache_root))
    drifts: list[PassDrift] = []
    for n in range(1, sessions + 1):
        work = out_dir / "steadiness" / f"{n:02d}"
        say(f"steadiness: session {n}/{sessions} -> {work}")
        server = start_engine(config, work, cache_root / "engine-state", deadline_s=c.deadlines.start_s)
        try:
            with server.client(timeout=c.deadlines.request_s) as client:
                model = served_model(client)
                first, steal_1 = _measured_pass(
                    client, model, prompts, c.decode.tokens_per_request, c.deadlines.request_s
                )
                time.sleep(gap_s)
                second, steal_2 = _measured_pass(
                    client, model, prompts, c.decode.tokens_per_request, c.deadlines.request_s
                )
        finally:
            server.stop()
        drift = pass_drift(first, second, (steal_1, steal_2))
        if drift is None:
            raise BenchError(f"steadiness session {n}: no prompt has a decode rate in both passes ({work})")
        (work / "passes.json").write_text(
            json.dumps({"pass_1": first, "pass_2": second, **asdict(drift)}, indent=1) + "\n"
        )
        say(
            f"steadiness: session {n}: paired {drift.paired:.3f} [{drift.paired_low:.3f}, {drift.paired_high:.3f}], "
            f"median ratio {drift.median_ratio:.3f}, steal {steal_1:.1%} / {steal_2:.1%}"
        )
        drifts.append(drift)
    return steadiness_figures(drifts, gap_s)


def pass_drift(first: dict[str, float], second: dict[str, float], steal: tuple[float, float]) -> PassDrift | None:
    """Pass-2 / pass-1 both ways gate 7 reads two starts; None when no prompt has a rate in both."""
    from ..evidence import throughput

    paired = throughput.paired_ratio(first, second)
    if paired is None:
        return None
    both = [k for k in first if k in second]
    median_ratio = throughput.endpoint_median([second[k] for k in both]) / throughput.endpoint_median(
        [first[k] for k in both]
    )
    return PassDrift(paired.ratio, paired.low, paired.high, median_ratio, steal)


def steadiness_figures(drifts: Sequence[PassDrift], gap_s: float) -> list[Figure]:
    if not drifts:
        raise BenchError("no start to summarise")
    steal = max(max(d.steal) for d in drifts)
    return _drift_rows(
        "steadiness",
        f"pass-2 / pass-1 of one start, {gap_s:.0f} s apart",
        "starts",
        drifts,
        f"; steal at most {steal:.1%} of a pass",
    )


def run(
    parts: Sequence[str],
    contract_name: str,
    cache_root: Path,
    out_dir: Path,
    replay_dir: Path = BUNDLE,
    say: Callable[[str], None] = print,
    sessions: int = 10,
    compile_cache: str = "warm",
    gap_s: float = 50.0,
    schedule: str = "contract",
) -> list[Figure]:
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    for part in parts:
        say(f"bench: {part}")
        if part == "import":
            figures.append(plugin_cost())
        elif part == "replay":
            figures.append(replay_time(replay_dir))
        elif part == "audit":
            figures.append(audit_rate())
        elif part == "start":
            figures.append(compile_reuse(contract_name, cache_root, out_dir, say))
        elif part == "decode":
            figures += decode_agreement(contract_name, cache_root, out_dir, say=say)
        elif part == "overhead":
            figures.append(gates_overhead(contract_name, cache_root, out_dir, say))
        elif part == "reproduction":
            figures += reproduction_sessions(contract_name, cache_root, out_dir, sessions, say, compile_cache, schedule)
        elif part == "steadiness":
            figures += steadiness_sessions(contract_name, cache_root, out_dir, sessions, gap_s, say)
        else:
            raise BenchError(f"unknown part {part!r} (parts: {', '.join(PARTS)})")
        (out_dir / "bench.json").write_text(json.dumps([asdict(f) for f in figures], indent=1) + "\n")
    (out_dir / "bench.md").write_text(table(figures) + "\n")
    return figures
