"""How often a request's last chunk arrives a second late, with and without the `shm_reader_spin` runtime fix
(a benchmark, not a test).

Starts of the embedded default alternate between the two arms (A: every runtime fix but `shm_reader_spin`; B:
every fix), each serving the gate prompts `--rounds` times, one request at a time with `--gap-s` of idle between
requests (about the interleaved schedule's quiet wait), and counts the requests with a gap of more than 0.5 s
between two streamed chunks, and where in the request it fell. Prints one line per start and a summary per arm.

    .venv/bin/python scripts/last_chunk_stalls.py [--starts 4] [--rounds 6] [--gap-s 1.2] [--out data/bench/stalls]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.engine.client import served_model, stream_completion
from pytest_b70lab.engine.server import start_engine
from pytest_b70lab.engine.starts import resolve_models, serve_config
from pytest_b70lab.in_engine.fixes import ENV_SELECT, FIX_NAMES
from pytest_b70lab.mini.build import default_cache_root

STALL_S = 0.5
ARMS = {
    "A (spin 1 s)": ",".join(n for n in FIX_NAMES if n != "shm_reader_spin"),
    "B (spin capped)": "all",
}


def one_start(c: contract.Contract, arm: str, out: Path, rounds: int, gap_s: float) -> dict:
    cache = default_cache_root().resolve()
    models = resolve_models(c, cache)
    prompts = contract.load_prompts(c)
    server = start_engine(
        serve_config(c, models), out, cache / "engine-state", env_extra={ENV_SELECT: ARMS[arm]}, deadline_s=900
    )
    requests = []
    try:
        with server.client(timeout=120) as client:
            model = served_model(client)
            stream_completion(client, model, "warm up", 8, prompt_id="warm-up")
            for _ in range(rounds):
                for p in prompts:
                    time.sleep(gap_s)
                    r = stream_completion(client, model, p.prompt, c.decode.tokens_per_request, prompt_id=p.id)
                    gaps = [b - a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
                    stalls = [i for i, g in enumerate(gaps) if g > STALL_S]
                    requests.append(
                        {
                            "prompt": p.id,
                            "rate": r.decode_rate,
                            "chunks": len(r.chunk_times),
                            "stalls": stalls,
                            "last": bool(stalls) and stalls[-1] == len(gaps) - 1,
                        }
                    )
    finally:
        server.stop()
    return {"arm": arm, "requests": requests}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contract", default="mini-laguna-cpu")
    ap.add_argument("--starts", type=int, default=4, help="starts in all, the arms alternating (A B A B ...)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--gap-s", type=float, default=1.2)
    ap.add_argument("--out", type=Path, default=Path("data/bench/stalls"))
    a = ap.parse_args(argv)
    c = contract.load(a.contract)
    results = []
    for i in range(a.starts):
        arm = list(ARMS)[i % 2]
        found = one_start(c, arm, a.out / f"start-{i + 1}", a.rounds, a.gap_s)
        n = len(found["requests"])
        stalled = [r for r in found["requests"] if r["stalls"]]
        print(
            f"start {i + 1} {arm}: {len(stalled)} of {n} requests with a gap over {STALL_S} s "
            f"({sum(r['last'] for r in stalled)} at the last chunk); median rate "
            f"{statistics.median(r['rate'] for r in found['requests']):.1f} tok/s",
            flush=True,
        )
        results.append(found)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "stalls.json").write_text(json.dumps(results, indent=1))
    for arm in ARMS:
        reqs = [r for f in results if f["arm"] == arm for r in f["requests"]]
        if reqs:
            stalled = sum(bool(r["stalls"]) for r in reqs)
            print(
                f"{arm}: {stalled} of {len(reqs)} requests stalled; median rate "
                f"{statistics.median(r['rate'] for r in reqs):.1f} tok/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
