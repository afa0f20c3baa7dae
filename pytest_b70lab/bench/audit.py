"""The audit part: the worker audit's weight hashing rate on one core."""

from __future__ import annotations

import statistics
import time

from .figures import Figure


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
