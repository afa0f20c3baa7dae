"""The decode part: the client's decode figure against the server's own and `vllm bench serve`'s, one start."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .figures import BenchError, Figure, checked, wall
from .start import start_phases


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
    _seconds, done = wall(cmd, work, env)
    (work / f"vllm-bench-serve-{round_no}.log").write_text(done.stdout + done.stderr)
    checked(done, "vllm bench serve")
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


def _server_rate(client, before: str) -> float:
    """The server's own per-token figure over the requests since `before` (a /metrics text)."""
    from ..engine.client import metrics_text
    from ..evidence import throughput

    _step_s, per_token_s, _rate = throughput.server_decode_figures(before, metrics_text(client))
    return 1 / per_token_s if per_token_s else float("nan")


def decode_agreement(
    contract_name: str, cache_root: Path, out_dir: Path, rounds: int = 6, say: Callable[[str], None] = print
) -> list[Figure]:
    """One start; `rounds` times: the client streams every prompt (the server's histograms cover exactly those
    requests) and `vllm bench serve` sends the same prompts, in alternating order (client first in odd rounds,
    bench serve first in even ones: never always one after the other, so that warm-up or drift does not fall on
    one side). Client and server are compared on the same requests; client and `vllm bench serve` by each
    round's ratio (they cannot share a request), the geometric mean over rounds with Student's t interval."""
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
    server_under_bench: list[float] = []  # the server's own figure for bench serve's requests
    try:
        with server.client(timeout=c.deadlines.request_s) as client:
            model = served_model(client)
            stream_completion(client, model, "warm up", 8, prompt_id="warm-up")

            def ours(r: int) -> None:
                before = metrics_text(client)
                rates = []
                for p in prompts:
                    req = stream_completion(
                        client, model, p.prompt, tokens, prompt_id=p.id, timeout_s=c.deadlines.request_s
                    )
                    rates.append(throughput.decode_rate(req.chunk_times, req.chunk_tokens))
                client_rates.append(per_token_rate([1 / x for x in rates]))
                server_rates.append(_server_rate(client, before))
                endpoint_medians.append(throughput.endpoint_median(rates))
                say(f"decode round {r}: client {client_rates[-1]:.1f} tok/s, server {server_rates[-1]:.1f}")

            def theirs(r: int) -> None:
                before = metrics_text(client)
                bench_rates.append(
                    _vllm_bench_serve(r, tcp, model, str(config.model_ref), dataset, tokens, len(prompts), work, env)
                )
                server_under_bench.append(_server_rate(client, before))
                say(
                    f"decode round {r}: vllm bench serve {bench_rates[-1]:.1f} tok/s, server meanwhile "
                    f"{server_under_bench[-1]:.1f}"
                )

            for r in range(1, rounds + 1):
                for side in (ours, theirs) if r % 2 else (theirs, ours):
                    side(r)
    finally:
        server.stop()
    return [
        start_phases(phases),
        *_agreement_figures(rounds, client_rates, server_rates, bench_rates, endpoint_medians, server_under_bench),
    ]


def _agreement_figures(
    rounds: int,
    client_rates: list[float],
    server_rates: list[float],
    bench_rates: list[float],
    endpoint_medians: list[float],
    server_under_bench: list[float],
) -> list[Figure]:
    """Where the two clients part: each against the server's own figure for its requests (the accounting), and
    the server's figure under each (the engine itself slower while bench serve's process shares the cores)."""
    from ..evidence import throughput

    raw = {
        "client": client_rates,
        "server": server_rates,
        "vllm_bench_serve": bench_rates,
        "server_under_vllm_bench_serve": server_under_bench,
        "client_endpoint_medians": endpoint_medians,
    }
    same = [a / b for a, b in zip(client_rates, server_rates, strict=False)]
    server_ratio = statistics.median(same)
    per_round = [math.log(a / b) for a, b in zip(client_rates, bench_rates, strict=True)]
    bench = throughput.t_ratio(per_round, throughput.EQUIVALENCE_CONFIDENCE)
    first = ", ".join(
        f"{a / b:.3f} ({'client' if r % 2 else 'bench serve'} first)"
        for r, (a, b) in enumerate(zip(client_rates, bench_rates, strict=True), 1)
    )
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
            "client / `vllm bench serve`, same prompts, alternating rounds",
            bench.ratio,
            "x",
            "within 1 %",
            abs(bench.ratio - 1) <= 0.01,
            f"geometric mean of {rounds} rounds' ratios [{bench.low:.3f}, {bench.high:.3f}] (90 %, t): {first}; "
            f"gate endpoint medians " + ", ".join(f"{m:.1f}" for m in endpoint_medians),
            raw,
        ),
        Figure(
            "decode",
            "`vllm bench serve` / server, same requests",
            (theirs := statistics.median(a / b for a, b in zip(bench_rates, server_under_bench, strict=True))),
            "x",
            "within 1 %",
            abs(theirs - 1) <= 0.01,
            "median over rounds: bench serve's own accounting against the server's for its requests",
            raw,
        ),
        Figure(
            "decode",
            "server under the client / server under `vllm bench serve`",
            statistics.median(a / b for a, b in zip(server_rates, server_under_bench, strict=True)),
            "x",
            "reported",
            None,
            "median over rounds: above 1, the engine itself decodes slower while bench serve's process runs",
            raw,
        ),
    ]
