"""What the trained mini can do, measured through vLLM on held-out curriculum prompts (a measurement, not a test).

One start per KV-cache flavour, target only, TP1 (quality does not depend on the layout; speculation is
token-exact): the served target with its calibrated FP8 KV cache, and its plain reference checkpoint with an
unquantized (fp32) cache, which shows what FP8 KV costs. Per start:
  - retrieval: held-out needles at the longest context that fits the contract's max-model-len;
  - code: held-out function prompts (new identifiers, constants from the held-out set), the completion run
    against the sample's checks in a subprocess; and shapes the training never showed (reported, no bar);
  - tools: held-out tools through /v1/chat/completions with `tools`, parsed by vLLM's `poolside_v1` parser
    (`--enable-auto-tool-choice`): one call, the right tool, arguments valid against its schema.
Writes JSON under data/eval/ and prints a Markdown table.

    .venv/bin/python scripts/eval_mini.py [--n 50] [--kv fp8,auto]
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
from pytest_b70lab.engine.client import served_model
from pytest_b70lab.engine.server import start_engine
from pytest_b70lab.mini import curriculum, evaluate

SEED = 0


def longest_needle(tok, max_model_len: int, answer_tokens: int = 8) -> int:
    """The most key=value pairs whose prompt still leaves room for the answer."""
    pairs = 2
    while True:
        s = curriculum.sample("heldout", SEED, 0, "retrieval", n_pairs=pairs + 1)
        if len(tok(s.prompt)["input_ids"]) + answer_tokens > max_model_len:
            return pairs
        pairs += 1


def completion(client, model: str, prompt: str, max_tokens: int) -> str:
    r = client.post(
        "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    )
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def tool_calls(client, model: str, sample: curriculum.Sample) -> list[dict]:
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": sample.meta["messages"],
            "tools": sample.meta["tools"],
            "tool_choice": "auto",
            "max_tokens": 200,
            "temperature": 0.0,
        },
    )
    r.raise_for_status()
    calls = r.json()["choices"][0]["message"].get("tool_calls") or []
    return [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")} for c in calls]


def run(kv: str, folder: Path, out: Path, n: int, max_model_len: int, tok) -> dict:
    part = "target" if kv == "fp8" else "reference"
    config = command.ServeConfig(
        model=folder / part, kv_cache_dtype=kv, max_model_len=max_model_len, tool_call_parser="poolside_v1"
    )
    server = start_engine(
        config, out / kv, out / "state", on_progress=lambda ph, t: print(f"  {kv}: [{t:6.1f} s] {ph}", flush=True)
    )
    results: dict = {"kv_cache_dtype": kv, "model": part}
    try:
        with server.client(timeout=300) as client:
            model = served_model(client)
            pairs = longest_needle(tok, max_model_len)
            plan = [("retrieval", "heldout", 8), ("code", "heldout", 128), ("code", "unseen", 128)]
            for family, split, max_tokens in plan:
                t0 = time.monotonic()
                samples = [curriculum.sample(split, SEED, i, family, n_pairs=pairs) for i in range(n)]
                ok = [evaluate.score(s, completion(client, model, s.prompt, max_tokens)) for s in samples]
                results[f"{family}/{split}"] = {
                    "correct": sum(ok),
                    "of": n,
                    "seconds": round(time.monotonic() - t0, 1),
                    **(
                        {"pairs": pairs, "prompt_tokens": len(tok(samples[0].prompt)["input_ids"])}
                        if family == "retrieval"
                        else {}
                    ),
                }
                print(f"  {kv}: {family}/{split} {sum(ok)}/{n}", flush=True)
            if kv == "fp8":
                samples = [curriculum.sample("heldout", SEED, i, "tool") for i in range(n)]
                ok = [evaluate.tool_call_ok(s, tool_calls(client, model, s)) for s in samples]
                results["tool/heldout"] = {"correct": sum(ok), "of": n, "parser": "poolside_v1"}
                print(f"  {kv}: tool/heldout {sum(ok)}/{n}", flush=True)
    finally:
        results["teardown_clean"] = server.stop().clean
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50, help="held-out samples a family")
    ap.add_argument("--kv", default="fp8,auto", help="KV-cache flavours: fp8 (calibrated), auto (unquantized)")
    ap.add_argument("--out", type=Path, default=Path("data/eval"))
    args = ap.parse_args()
    folder = mini.build()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder / "target"), local_files_only=True)
    max_model_len = contract.load("mini-laguna-cpu").engine.max_model_len
    out = args.out / f"mini-{time.strftime('%Y%m%d-%H%M%S')}"
    results = [run(kv, folder, out, args.n, max_model_len, tok) for kv in args.kv.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    keys = sorted({k for r in results for k in r if "/" in k})
    print("\n| KV cache | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for r in results:
        cells = [f"{r[k]['correct']}/{r[k]['of']}" if k in r else "" for k in keys]
        print(f"| {r['kv_cache_dtype']} ({r['model']}) | " + " | ".join(cells) + " |")
    print(f"\nwritten: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
