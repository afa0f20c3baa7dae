"""Gate 5, cold prompts: no token of a gate prompt came from a cache."""

from __future__ import annotations

from ..evidence.metrics import counter_total, has_counter
from ..evidence.record import Evidence
from .rules import (
    Check,
    Verdict,
    every_pass,
    request_of,
    subject,
)


def cold_prompt(start: Evidence, prompt_id: str) -> Verdict:
    """The prompt was computed from scratch: no cached tokens, and the prefix-cache hit counter did not move
    during the run."""
    c = Check("cold-prompt", subject(start.start_index, prompt=prompt_id))
    if (request := request_of(c, start, prompt_id)) is None:
        return c.done()
    c.observe(cached_tokens=request.cached_tokens)
    for label, r in every_pass(start, prompt_id):
        c.expect(r.cached_tokens == 0, f"{label}: {r.cached_tokens} cached prompt tokens, expected 0")
    hits = "vllm:prefix_cache_hits_total"
    for when, text in (("before", start.metrics_before), ("after", start.metrics_after)):
        if not c.expect(
            has_counter(text, hits),
            f"start-{start.start_index}: /metrics {when} the prompts has no "
            f"{hits}: whether the prefix cache was hit cannot be told",
        ):
            return c.done()
    delta = counter_total(start.metrics_after, hits) - counter_total(start.metrics_before, hits)
    c.observe(prefix_cache_hits_delta=delta)
    c.expect(delta == 0, f"the prefix-cache hit counter moved by {delta:g} during the run")
    return c.done()
