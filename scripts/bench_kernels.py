"""Page-size A/B for the FP8 paged-attention kernels (a benchmark, not a test).

For each implementation found, page 32 vs 64, 1 and 12 query tokens, over context lengths: the KV bytes
the call must read (context x KV heads x head_dim x 2 for K and V, one byte each) divided by the median
time of repeated calls, next to this machine's copy bandwidth from a STREAM-like probe (median of copies of
a buffer far larger than the caches). Writes JSON under data/bench/ and prints a Markdown table.

    .venv/bin/python scripts/bench_kernels.py [--repeats 15] [--contexts 256,1024,4096,16384]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from pytest_b70lab import kernels

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 128


def copy_bandwidth(mib: int = 512, repeats: int = 9) -> float:
    """Bytes moved per second by a large tensor copy (read + write), median of `repeats`."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / statistics.median(times)


def time_call(impl, batch: kernels.Batch, repeats: int) -> float:
    k_scale, v_scale = batch.calibrated_scales()
    cache = impl.write(batch, k_scale, v_scale)
    impl.attention(cache, batch, k_scale, v_scale)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        impl.attention(cache, batch, k_scale, v_scale)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--contexts", default="256,1024,4096,16384")
    ap.add_argument("--out", type=Path, default=Path("data/bench"))
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    bandwidth = copy_bandwidth()
    rows = []
    for impl in kernels.discover():
        if isinstance(impl, kernels.Broken):
            print(f"{impl.name}: installed but broken, not benchmarked: {impl.error}", file=sys.stderr, flush=True)
            continue
        if isinstance(impl, kernels.Unavailable) or impl.name.startswith("reference"):
            continue  # the reference is a per-row Python loop: a correctness oracle, not a kernel
        for dtype in impl.dtypes:
            for q in (1, 12):
                for ctx in contexts:
                    per_page = {}
                    for page in (32, 64):
                        batch = kernels.Batch([ctx], [q], HEADS, KV_HEADS, HEAD_DIM, page, dtype).build()
                        seconds = time_call(impl, batch, args.repeats)
                        kv_bytes = (ctx + q) * KV_HEADS * HEAD_DIM * 2
                        per_page[page] = {"median_s": seconds, "kv_bytes_per_s": kv_bytes / seconds}
                    rows.append(
                        {
                            "impl": impl.name,
                            "dtype": str(dtype).removeprefix("torch."),
                            "queries": q,
                            "context": ctx,
                            "page32": per_page[32],
                            "page64": per_page[64],
                            "ratio_64_over_32": per_page[64]["kv_bytes_per_s"] / per_page[32]["kv_bytes_per_s"],
                        }
                    )
                    print(
                        f"{impl.name} {dtype} q{q} ctx {ctx}: page32 {per_page[32]['kv_bytes_per_s'] / 1e9:.2f} GB/s, "
                        f"page64 {per_page[64]['kv_bytes_per_s'] / 1e9:.2f} GB/s",
                        flush=True,
                    )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "copy_bandwidth_bytes_per_s": bandwidth,
                "repeats": args.repeats,
                "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\ncopy bandwidth (STREAM-like, 512 MiB copy, median of 9): {bandwidth / 1e9:.2f} GB/s\n")
    print("| impl | dtype | queries | context | page 32 GB/s | page 64 GB/s | 64/32 | page 32 % of copy bw |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        p32, p64 = r["page32"]["kv_bytes_per_s"], r["page64"]["kv_bytes_per_s"]
        print(
            f"| {r['impl']} | {r['dtype']} | {r['queries']} | {r['context']} | {p32 / 1e9:.2f} | {p64 / 1e9:.2f} | "
            f"{r['ratio_64_over_32']:.2f} | {100 * p32 / bandwidth:.1f} |"
        )
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
