"""Decode speed of the embedded default on each FP8 attention path, in one run on one machine (a benchmark).

Paths: `native` (vLLM's own CPU ops, where the CPU has AVX-512 or AMX), `portable` (the package's portable
path forced on the same CPU: B70LAB_FP8_ATTENTION=portable, so the ratio isolates the attention), and
`avx2` (the whole AVX2 emulation: vLLM's AVX2 library, torch and oneDNN at AVX2, hence portable attention).
Starts are interleaved (A B C, C B A, ...) so that drift falls on every path alike. Per start: the gate
prompts at the contract's token count, then the quality set's longest long-context needles (near 2048
tokens: the slowest case for a gathered attention). Prints medians and ratios to native; writes DIR/fp8-paths.json.

    .venv/bin/python scripts/bench_fp8_paths.py [--contract mini-laguna-cpu] [--rounds 2] [--needles 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from pytest_b70lab.contract import schema as contract_mod
from pytest_b70lab.engine.client import audit, served_model, stream_completion
from pytest_b70lab.engine.server import start_engine
from pytest_b70lab.engine.starts import resolve_models, serve_config
from pytest_b70lab.evidence import host, throughput
from pytest_b70lab.mini.build import default_cache_root
from pytest_b70lab.quality import samples as quality_samples

PATHS = {"native": {}, "portable": {"B70LAB_FP8_ATTENTION": "portable"}, "avx2": {"B70LAB_EMULATE_CPU": "avx2"}}
SWITCHES = ("B70LAB_FP8_ATTENTION", "B70LAB_EMULATE_CPU")
NEEDLE_TOKENS = 32


def one_start(c, models, path: str, out: Path, cache_root: Path, needles) -> dict:
    for name in SWITCHES:
        os.environ.pop(name, None)
    os.environ.update(PATHS[path])
    config = serve_config(c, models)
    t0 = time.monotonic()
    server = start_engine(config, out, cache_root / "engine-state", deadline_s=c.deadlines.start_s)
    rates, long_rates, prompt_tokens = [], [], []
    try:
        with server.client(timeout=c.deadlines.request_s) as client:
            audits = audit(client)
            model = served_model(client)
            for p in contract_mod.load_prompts(c):
                r = stream_completion(
                    client,
                    model,
                    p.prompt,
                    c.decode.tokens_per_request,
                    prompt_id=p.id,
                    timeout_s=c.deadlines.request_s,
                )
                rates.append(throughput.decode_rate(r.chunk_times, r.chunk_tokens))
            for sample in needles:
                r = stream_completion(
                    client, model, sample.prompt, NEEDLE_TOKENS, prompt_id=sample.id, timeout_s=c.deadlines.request_s
                )
                long_rates.append(throughput.decode_rate(r.chunk_times, r.chunk_tokens))
                prompt_tokens.append(len(r.prompt_token_ids))
    finally:
        server.stop()
    return {
        "path": path,
        "ran": host.fp8_attention_ran(audits),
        "ready_s": round(time.monotonic() - t0, 1),
        "decode_median": throughput.endpoint_median(rates),
        "long_context_median": statistics.median(long_rates) if long_rates else None,
        "long_context_prompt_tokens": prompt_tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contract", default="mini-laguna-cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--needles", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("data/bench") / time.strftime("fp8-paths-%Y%m%d-%H%M%S"))
    args = parser.parse_args()
    cache_root = default_cache_root()
    c = contract_mod.load(args.contract)
    models = resolve_models(c, cache_root)
    q = c.quality
    samples = [
        s for s in quality_samples.load(contract_mod.repo_path(q.file), q.sha256, q.count) if s.family == "long_context"
    ]
    needles = sorted(samples, key=lambda s: len(s.prompt), reverse=True)[: args.needles]
    identity = host.cpu_identity(environ={})
    paths = list(PATHS) if host.native_fp8_possible(identity) else ["portable"]
    print(f"{host.describe(identity)}: paths {', '.join(paths)}, {args.rounds} rounds", flush=True)
    starts = []
    for r in range(args.rounds):
        for path in paths if r % 2 == 0 else paths[::-1]:
            record = one_start(c, models, path, args.out / f"round-{r + 1}" / path, cache_root, needles)
            starts.append(record)
            print(json.dumps(record), flush=True)
    summary = {}
    for path in paths:
        mine = [s for s in starts if s["path"] == path]
        summary[path] = {k: statistics.median(s[k] for s in mine) for k in ("decode_median", "long_context_median")}
    base = summary.get("native")
    print(f"{'path':<9} {'decode tok/s':>13} {'x native':>9} {'long-ctx tok/s':>15} {'x native':>9}")
    for path, figures in summary.items():

        def ratio(k: str, figures: dict = figures) -> str:
            return f"{figures[k] / base[k]:.3f}" if base else "n/a"

        print(
            f"{path:<9} {figures['decode_median']:>13.1f} {ratio('decode_median'):>9} "
            f"{figures['long_context_median']:>15.1f} {ratio('long_context_median'):>9}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8-paths.json").write_text(
        json.dumps({"cpu": identity, "starts": starts, "summary": summary}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
