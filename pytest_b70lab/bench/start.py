"""The start part: two starts on an empty compile cache, each split by phase (the second loads the first's graphs);
and the bare starts the overhead part compares a gates session with."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .figures import BenchError, Figure


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
