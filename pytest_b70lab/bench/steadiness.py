"""The steadiness part, reproduction's control: one start streams the prompts twice, a restart's time apart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .figures import BenchError, Figure
from .reproduction import (
    _drift_rows,
)


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine so far, from /proc/stat's first line: the hypervisor's
    steal is the time a runnable vCPU was not given a physical core."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


@dataclass(frozen=True)
class PassDrift:
    """One start's second pass over the gate prompts against its first, and what the machine did meanwhile."""

    paired: float
    paired_low: float
    paired_high: float
    median_ratio: float
    steal: tuple[float, float]  # share of the machine's time stolen during pass 1, pass 2


def _measured_pass(client, model: str, prompts, tokens: int, timeout_s: float) -> tuple[dict[str, float], float]:
    """Each prompt's decode rate, recomputed from its arrival times as gate 7 does, and the pass's steal."""
    from ..engine.client import stream_completion
    from ..evidence import throughput

    steal0, total0 = cpu_ticks()
    requests = [
        stream_completion(client, model, p.prompt, tokens, prompt_id=p.id, timeout_s=timeout_s) for p in prompts
    ]
    steal1, total1 = cpu_ticks()
    rates, problems = throughput.arrival_rates(requests)
    if problems:
        raise BenchError("steadiness pass: " + "; ".join(f"{k}: {v}" for k, v in problems.items()))
    return rates, (steal1 - steal0) / max(total1 - total0, 1)


def steadiness_sessions(
    contract_name: str,
    cache_root: Path,
    out_dir: Path,
    sessions: int = 10,
    gap_s: float = 50.0,
    say: Callable[[str], None] = print,
) -> list[Figure]:
    """`sessions` starts, each measuring the gate prompts twice `gap_s` apart, as a gates start measures them
    (no warm-up request, the contract's tokens per request)."""
    from ..contract import schema as contract_mod
    from ..engine.client import served_model
    from ..engine.server import start_engine
    from ..engine.starts import resolve_models, serve_config

    c = contract_mod.load(contract_name)
    prompts = contract_mod.load_prompts(c)
    config = serve_config(c, resolve_models(c, cache_root))
    drifts: list[PassDrift] = []
    for n in range(1, sessions + 1):
        work = out_dir / "steadiness" / f"{n:02d}"
        say(f"steadiness: session {n}/{sessions} -> {work}")
        server = start_engine(config, work, cache_root / "engine-state", deadline_s=c.deadlines.start_s)
        try:
            with server.client(timeout=c.deadlines.request_s) as client:
                model = served_model(client)
                first, steal_1 = _measured_pass(
                    client, model, prompts, c.decode.tokens_per_request, c.deadlines.request_s
                )
                time.sleep(gap_s)
                second, steal_2 = _measured_pass(
                    client, model, prompts, c.decode.tokens_per_request, c.deadlines.request_s
                )
        finally:
            server.stop()
        drift = pass_drift(first, second, (steal_1, steal_2))
        if drift is None:
            raise BenchError(f"steadiness session {n}: no prompt has a decode rate in both passes ({work})")
        (work / "passes.json").write_text(
            json.dumps({"pass_1": first, "pass_2": second, **asdict(drift)}, indent=1) + "\n"
        )
        say(
            f"steadiness: session {n}: paired {drift.paired:.3f} [{drift.paired_low:.3f}, {drift.paired_high:.3f}], "
            f"median ratio {drift.median_ratio:.3f}, steal {steal_1:.1%} / {steal_2:.1%}"
        )
        drifts.append(drift)
    return steadiness_figures(drifts, gap_s)


def pass_drift(first: dict[str, float], second: dict[str, float], steal: tuple[float, float]) -> PassDrift | None:
    """Pass-2 / pass-1 both ways gate 7 reads two starts; None when no prompt has a rate in both."""
    from ..evidence import throughput

    paired = throughput.paired_ratio(first, second)
    if paired is None:
        return None
    both = [k for k in first if k in second]
    median_ratio = throughput.endpoint_median([second[k] for k in both]) / throughput.endpoint_median(
        [first[k] for k in both]
    )
    return PassDrift(paired.ratio, paired.low, paired.high, median_ratio, steal)


def steadiness_figures(drifts: Sequence[PassDrift], gap_s: float) -> list[Figure]:
    if not drifts:
        raise BenchError("no start to summarise")
    steal = max(max(d.steal) for d in drifts)
    return _drift_rows(
        "steadiness",
        f"pass-2 / pass-1 of one start, {gap_s:.0f} s apart",
        "starts",
        drifts,
        f"; steal at most {steal:.1%} of a pass",
    )
