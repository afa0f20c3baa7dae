"""How fast `checkpoint.read_table` reads a checkpoint, first time and from its cache (a benchmark, not a test).

Writes a synthetic bf16 safetensors checkpoint (1 GiB by default) into a temporary folder, then reads it with
`read_table`: the first read computes every tensor's moments and the file's sha256 in one pass (each run
into an empty cache folder), the cached read only looks its per-file entries up. Prints MB/s (checkpoint
bytes over wall time, median of the runs) next to plain sha256 of the same file, for scale. The file was
just written, so the page cache holds it: the first-read figure is the CPU side, not the disk.

    .venv/bin/python scripts/bench_checkpoint_read.py [--size-mib 1024] [--tensor-mib 64] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from pytest_b70lab import digests
from pytest_b70lab.evidence import checkpoint


def write_checkpoint(folder: Path, size_mib: int, tensor_mib: int) -> int:
    """bf16 tensors of `tensor_mib` each (4096 wide) adding up to `size_mib`; returns the file's size."""
    generator = torch.Generator().manual_seed(0)
    rows = tensor_mib * 2**20 // (2 * 4096)
    tensors = {
        f"model.layers.{i}.mlp.weight": torch.randn(rows, 4096, generator=generator).to(torch.bfloat16)
        for i in range(max(1, size_mib // tensor_mib))
    }
    (folder / "config.json").write_text("{}")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return (folder / "model.safetensors").stat().st_size


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--tensor-mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3, help="first reads (each into an empty cache)")
    parser.add_argument("--cached-runs", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="b70lab-bench-read-") as tmp:
        folder = Path(tmp) / "checkpoint"
        folder.mkdir()
        size = write_checkpoint(folder, args.size_mib, args.tensor_mib)
        mb = size / 1e6
        sha_only = statistics.median(
            timed(lambda: digests.file_sha256(folder / "model.safetensors")) for _ in range(args.runs)
        )
        first, table = [], None
        for run in range(args.runs):
            cache = Path(tmp) / f"cache-{run}"
            first.append(timed(lambda cache=cache: checkpoint.read_table(folder, cache)))
        cache = Path(tmp) / "cache-0"
        cached = [timed(lambda: checkpoint.read_table(folder, cache)) for _ in range(args.cached_runs)]
        table = checkpoint.read_table(folder, cache)
        assert table["read"]["files_read"] == 0 and table["read"]["files_cached"] == 2

    print(
        f"checkpoint: {mb:.0f} MB bf16, {len(table['tensors'])} tensors of {args.tensor_mib} MiB, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"sha256 only      {mb / sha_only:8.0f} MB/s  (median of {args.runs}, {sha_only:.2f} s)")
    print(
        f"first read       {mb / statistics.median(first):8.0f} MB/s  (median of {args.runs}, "
        f"{statistics.median(first):.2f} s: moments + sha256, one pass)"
    )
    print(
        f"from the cache   {mb / statistics.median(cached):8.0f} MB/s  (median of {args.cached_runs}, "
        f"{statistics.median(cached) * 1e3:.1f} ms: per-file entries looked up, nothing read)"
    )


if __name__ == "__main__":
    main()
