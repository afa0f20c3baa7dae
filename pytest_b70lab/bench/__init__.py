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
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .figures import Figure


# One module of this folder per part (import: plugin_cost.py).
PARTS = ("import", "replay", "audit", "start", "decode", "overhead", "reproduction", "steadiness")
DEFAULT_PARTS = PARTS[:-2]
REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"


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
    """Each part asked for, in order; bench.json rewritten after each (a long run keeps what it measured) and
    bench.md, the table, at the end. Each part's module is imported only when it runs."""
    from .audit import audit_rate
    from .decode import decode_agreement
    from .figures import BenchError, table
    from .overhead import gates_overhead
    from .plugin_cost import plugin_cost
    from .replay import replay_time
    from .reproduction import reproduction_sessions
    from .start import compile_reuse
    from .steadiness import steadiness_sessions

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
