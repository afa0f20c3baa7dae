"""Gate 6, the compiled-graph topology per rank: the graph and break counts the contract expects."""

from __future__ import annotations

from typing import Any

from ..contract.schema import Contract
from ..evidence.record import Evidence
from .rules import (
    Check,
    Verdict,
    rank_audit,
    subject,
)


def compile_topology(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """Graphs = the compiled pieces vLLM saw (piecewise graphs, or whole graphs where nothing is split);
    breaks = the split points between them plus Dynamo graph breaks."""
    c = Check("compile-topology", subject(start.start_index, rank=rank))
    if (audit := rank_audit(c, start, rank)) is None:
        return c.done()
    counters = audit.get("compile_counters")
    if not c.expect(
        isinstance(counters, dict) and isinstance(counters.get("vllm"), dict),
        f"the audit has no compile counters ({counters!r})",
    ):
        return c.done()
    assert isinstance(counters, dict)
    needed = {"num_graphs_seen", "num_piecewise_graphs_seen"} - set(counters["vllm"])
    needed |= {"dynamo_unique_graphs", "dynamo_graph_breaks"} - set(counters)
    if not c.expect(not needed, f"the audit's compile counters lack {sorted(needed)}"):
        return c.done()
    graphs, breaks = topology(counters)
    c.observe(compile_graphs=graphs, compile_breaks=breaks, compilation_mode=audit.get("compilation", {}).get("mode"))
    modules = audit.get("compiled_modules")
    if isinstance(modules, list):  # bundles recorded before the audit listed its compiled modules lack it
        c.observe(
            compiled_modules={
                f"{m.get('owner')}/{m.get('tag') or m.get('class')}": m.get("source")
                for m in modules
                if isinstance(m, dict)
            }
        )
        loaded = sum(1 for m in modules if isinstance(m, dict) and m.get("source") == "loaded")
        counted = int(counters["vllm"].get("num_aot_artifacts_loaded", 0))
        c.expect(
            loaded == counted,
            f"the audit lists {loaded} modules loaded from the AOT compile cache, "
            f"vLLM's counter says {counted}: which graphs this start compiled is unknown",
        )
    c.expect(
        graphs == contract.expect.compile_graphs,
        f"{graphs} compiled graphs, the contract expects {contract.expect.compile_graphs}",
    )
    c.expect(
        breaks == contract.expect.compile_breaks,
        f"{breaks} graph breaks, the contract expects {contract.expect.compile_breaks} "
        f"(Dynamo reasons: {counters.get('dynamo_graph_break_reasons')})",
    )
    return c.done()


def topology(counters: dict[str, Any]) -> tuple[int, int]:
    """(graphs, breaks) from one rank's counters. Piecewise compilation (GPU/XPU) counts the pieces and the
    split points between them (a graph loaded from the AOT compile cache goes through vLLM's backend again,
    so it is counted the same way); where nothing is split (vLLM's CPU build traces each model once with
    torch's own backend, the target and the draft), the graphs are Dynamo's unique graphs plus the whole
    graphs loaded from the AOT cache, which Dynamo never sees. An AOT artifact is captured with fullgraph,
    so a loaded one has no graph break; Dynamo graph breaks always count as breaks."""
    v = counters["vllm"]
    whole = int(v.get("num_graphs_seen", 0))
    pieces = int(v.get("num_piecewise_graphs_seen", 0))
    if pieces:
        graphs, splits = pieces, max(pieces - max(whole, 1), 0)
    else:
        traced = int(counters.get("dynamo_unique_graphs", 0)) + int(v.get("num_aot_artifacts_loaded", 0))
        graphs, splits = whole or traced, 0
    return graphs, splits + int(counters.get("dynamo_graph_breaks", 0))
