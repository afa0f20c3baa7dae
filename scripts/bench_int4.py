"""Decode speed of the INT4 mini beside the unquantized one, in one run on one machine (a benchmark).

Four kinds of start: `mini-laguna-cpu` and `mini-laguna-cpu-int4` (the INT4 build on the portable INT4 path),
each as its contract serves it (with the DFlash draft) and as its teacher (target only). Starts are interleaved
(A B C D, D C B A, ...) so that drift falls on every kind alike. Per start: the gate prompts at the contract's
token count, the median decode rate, and the draft's acceptance from the engine's counters. Prints medians and
ratios to the unquantized kind; writes DIR/int4.json.

With `--prompts quality` the held-out quality set is sent instead (each sample at its own max_tokens, EOS
ignored, tool-use samples rendered through the chat template), to the two speculative kinds only: the draft's
acceptance on prompts none of the drafts was distilled on.

    .venv/bin/python scripts/bench_int4.py [--rounds 2] [--prompts gates|quality] [--out DIR]
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
from pytest_b70lab.engine.client import served_model, stream_completion
from pytest_b70lab.engine.server import start_engine
from pytest_b70lab.engine.starts import resolve_models, serve_config
from pytest_b70lab.evidence import host, throughput
from pytest_b70lab.mini.build import default_cache_root

CONTRACTS = ("mini-laguna-cpu", "mini-laguna-cpu-int4")


def kinds() -> dict[str, contract_mod.Contract]:
    out = {}
    for name in CONTRACTS:
        c = contract_mod.load(name)
        out[f"{name} (draft)"] = c
        out[f"{name} (target only)"] = c.teacher()
    return out


def quality_prompts(c: contract_mod.Contract, target: Path) -> list[tuple[str, str, int]]:
    """(id, text, max_tokens) of the contract's quality set (the unquantized lane's where it has none), chat
    samples rendered by the served tokenizer."""
    from transformers import AutoTokenizer

    from pytest_b70lab.quality import samples as quality_samples

    quality = c.quality or contract_mod.load(CONTRACTS[0]).quality  # the INT4 contract has no set of its own
    assert quality is not None
    tok = AutoTokenizer.from_pretrained(str(target))
    out = []
    for s in quality_samples.load(contract_mod.repo_path(quality.file), quality.sha256, quality.count):
        text = s.prompt or tok.apply_chat_template(
            s.messages, tools=s.tools, add_generation_prompt=True, tokenize=False
        )
        out.append((s.id, text, s.max_tokens))
    return out


def one_start(kind: str, c: contract_mod.Contract, out: Path, cache_root: Path, prompt_set: str = "gates") -> dict:
    models = resolve_models(c, cache_root)
    if prompt_set == "quality":
        prompts = quality_prompts(c, Path(models.target_model))
    else:
        prompts = [(p.id, p.prompt, c.decode.tokens_per_request) for p in contract_mod.load_prompts(c)]
    config = serve_config(c, models)
    os.environ.pop("B70LAB_INT4_PATH", None)
    if c.expect.int4_path == "portable":  # as a session of the contract asks its ranks (engine/starts.py)
        os.environ["B70LAB_INT4_PATH"] = "portable"
    t0 = time.monotonic()
    server = start_engine(config, out, cache_root / "engine-state", deadline_s=c.deadlines.start_s)
    rates = []
    try:
        with server.client(timeout=c.deadlines.request_s) as client:
            model = served_model(client)
            for prompt_id, text, max_tokens in prompts:
                r = stream_completion(
                    client, model, text, max_tokens, prompt_id=prompt_id, timeout_s=c.deadlines.request_s
                )
                rates.append(throughput.decode_rate(r.chunk_times, r.chunk_tokens))
            counters = client.get("/metrics").text
    finally:
        server.stop()
        os.environ.pop("B70LAB_INT4_PATH", None)
    drafts = accepted = 0.0
    for line in counters.splitlines():
        if line.startswith("vllm:spec_decode_num_drafts_total"):
            drafts += float(line.split()[-1])
        elif line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            accepted += float(line.split()[-1])
    return {
        "kind": kind,
        "ready_s": round(time.monotonic() - t0, 1),
        "decode_median": throughput.endpoint_median(rates),
        "accepted_per_draft": round(accepted / drafts, 3) if drafts else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("data/bench") / time.strftime("int4-%Y%m%d-%H%M%S"))
    parser.add_argument("--prompts", choices=["gates", "quality"], default="gates")
    args = parser.parse_args()
    cache_root = default_cache_root()
    identity = host.cpu_identity(environ={})
    order = kinds()
    if args.prompts == "quality":
        order = {kind: c for kind, c in order.items() if c.speculative is not None}
    print(f"{host.describe(identity)}: {', '.join(order)}; {args.rounds} rounds", flush=True)
    starts = []
    for r in range(args.rounds):
        names = list(order) if r % 2 == 0 else list(order)[::-1]
        for kind in names:
            folder = args.out / f"round-{r + 1}" / kind.replace(" ", "_")
            record = one_start(kind, order[kind], folder, cache_root, args.prompts)
            starts.append(record)
            print(json.dumps(record), flush=True)
    summary = {}
    for kind in order:
        mine = [s for s in starts if s["kind"] == kind]
        summary[kind] = {"decode_median": statistics.median(s["decode_median"] for s in mine)}
        per_draft = [s["accepted_per_draft"] for s in mine if s["accepted_per_draft"] is not None]
        summary[kind]["accepted_per_draft"] = statistics.median(per_draft) if per_draft else None
    print(f"{'start kind':<38} {'decode tok/s':>13} {'x unquantized':>14} {'accepted/draft':>15}")
    for kind, figures in summary.items():
        base = summary[kind.replace("mini-laguna-cpu-int4", "mini-laguna-cpu")]["decode_median"]
        per_draft = figures["accepted_per_draft"]
        print(
            f"{kind:<38} {figures['decode_median']:>13.1f} {figures['decode_median'] / base:>14.3f} "
            f"{per_draft if per_draft is not None else '-':>15}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int4.json").write_text(json.dumps({"cpu": identity, "starts": starts, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
