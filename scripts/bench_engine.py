"""Decode throughput of the embedded default engine under several layouts (a benchmark, not a test).

Starts one fresh server per layout on the mini model, sends one warm-up request, then streams each prompt of
the mini contract's prompt set with the contract's decode accounting ((N - 1) / (t_N - t_1), N tokens per
request) and reports the median over prompts, the start-up time and, for DFlash layouts, vLLM's own
speculative counters over the measured requests: accepted draft tokens per draft (bonus token not counted)
and the acceptance rate per draft position. Writes JSON under data/bench/ and prints a Markdown table with
each DFlash layout's speed ratio to its target-only twin.

    .venv/bin/python scripts/bench_engine.py [--tokens 100] [--layouts tp1,tp1-dflash,tp2ep2,tp2ep2-dflash]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pytest_b70lab import mini
from pytest_b70lab.contract import schema as contract
from pytest_b70lab.engine import command
from pytest_b70lab.engine.client import metrics_text, served_model, stream_completion
from pytest_b70lab.engine.server import start_engine
from pytest_b70lab.evidence import metrics, throughput

PROMPTS = [p.prompt for p in contract.load_prompts(contract.load("mini-laguna-cpu"))]
SPEC = "vllm:spec_decode_num_"


def acceptance(before: str, after: str) -> dict:
    """vLLM's speculative counters over the measured requests: accepted tokens per draft, per position."""

    def delta(name: str) -> float:
        return metrics.counter_total(after, SPEC + name) - metrics.counter_total(before, SPEC + name)

    drafts = delta("drafts_total")
    if not drafts:
        return {}
    by_pos_before = metrics.counter_by_label(before, SPEC + "accepted_tokens_per_pos_total", "position")
    by_pos = metrics.counter_by_label(after, SPEC + "accepted_tokens_per_pos_total", "position")
    per_pos = [(by_pos[p] - by_pos_before.get(p, 0.0)) / drafts for p in sorted(by_pos, key=int)]
    return {
        "drafts": drafts,
        "accepted": delta("accepted_tokens_total"),
        "accepted_per_draft": round(delta("accepted_tokens_total") / drafts, 3),
        "acceptance_per_position": [round(a, 3) for a in per_pos],
    }


LAYOUTS = {
    "tp1": dict(tensor_parallel=1),
    "tp1-dflash": dict(tensor_parallel=1, speculative=True),
    "tp2ep2": dict(tensor_parallel=2, expert_parallel=True),
    "tp2ep2-dflash": dict(tensor_parallel=2, expert_parallel=True, speculative=True),
}


def run_layout(
    name: str, model_dir: Path, out_dir: Path, tokens: int, niceness: int = 0, env_extra: dict[str, str] | None = None
) -> dict:
    spec = dict(LAYOUTS[name])
    speculative = spec.pop("speculative", False)
    config = command.ServeConfig(model=model_dir / "target", draft=model_dir / "draft" if speculative else None, **spec)
    t0 = time.monotonic()
    server = start_engine(
        config,
        out_dir / name,
        out_dir / "state",
        niceness=niceness,
        env_extra=env_extra,
        on_progress=lambda ph, t: print(f"  {name}: [{t:6.1f} s] {ph}", flush=True),
    )
    try:
        start_s = time.monotonic() - t0
        with server.client() as client:
            model = served_model(client)
            stream_completion(client, model, "warm up", 8, prompt_id="warm-up")
            before = metrics_text(client)
            rates = []
            for i, prompt in enumerate(PROMPTS):
                c = stream_completion(client, model, prompt, tokens, prompt_id=str(i))
                rates.append(throughput.decode_rate(c.chunk_times, c.chunk_tokens))
            spec = acceptance(before, metrics_text(client))
    finally:
        report = server.stop()
    return {
        "layout": name,
        "niceness": niceness,
        "env_extra": env_extra or {},
        "config": {k: str(v) for k, v in vars(config).items()},
        "start_s": round(start_s, 1),
        "tokens": tokens,
        "rates": [round(r, 2) for r in rates],
        "median_tok_s": round(throughput.endpoint_median(rates), 2),
        "speculation": spec,
        "teardown_clean": report.clean,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--out", type=Path, default=Path("data/bench"))
    ap.add_argument("--niceness", type=int, default=0, help="run the engine at this nice level (client stays at 0)")
    ap.add_argument(
        "--bind",
        default=None,
        help="VLLM_CPU_OMP_THREADS_BIND instead of environment.thread_binding's (e.g. 0|0), to compare bindings",
    )
    ap.add_argument(
        "--allreduce",
        choices=("auto", "shm", "gloo"),
        default="auto",
        help="vLLM's SHM all-reduce or gloo (auto: environment.ranks_need_blocking_allreduce decides)",
    )
    args = ap.parse_args()
    env_extra = {
        **({"VLLM_CPU_OMP_THREADS_BIND": args.bind} if args.bind else {}),
        **({"VLLM_CPU_SHM_ALLREDUCE": "1" if args.allreduce == "shm" else "0"} if args.allreduce != "auto" else {}),
    }
    model_dir = mini.build()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.out / f"engine-{stamp}"
    results = []
    for name in args.layouts.split(","):
        print(f"{name}: starting", flush=True)
        results.append(run_layout(name, model_dir, out_dir, args.tokens, args.niceness, env_extra))
        print(f"{name}: {results[-1]['median_tok_s']} tok/s median, start {results[-1]['start_s']} s", flush=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    medians = {r["layout"]: r["median_tok_s"] for r in results}
    print(
        f"\n| layout | start (s) | decode tok/s, median of {len(PROMPTS)} prompts | min-max | vs target-only "
        f"| accepted / draft | acceptance per position |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        twin = medians.get(r["layout"].removesuffix("-dflash")) if r["layout"].endswith("-dflash") else None
        ratio = f"{r['median_tok_s'] / twin:.2f}x" if twin else ""
        spec = r["speculation"]
        print(
            f"| {r['layout']} | {r['start_s']} | {r['median_tok_s']} | {min(r['rates'])}-{max(r['rates'])} | {ratio} "
            f"| {spec.get('accepted_per_draft', '')} | {' '.join(map(str, spec.get('acceptance_per_position', [])))} |"
        )
    print(f"\nwritten: {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
