"""What every gate's rule shares: the verdict it returns with its reasons and observed values, the check that
collects failed expectations, the one spelling of a subject, and the ways a rule finds its start's request or a
rank's audit (failing, never passing, when they are missing).

No rule launches anything or reads anything but its arguments, so a saved run can be judged again on any
machine. Each verdict carries the observed values, which the tests attach as JUnit properties."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..evidence.record import Evidence, Request

FP8_KV_DTYPES = {"fp8", "fp8_e4m3"}
FP8_STORAGE_DTYPES = {"uint8", "float8_e4m3fn"}


def subject(start: int | None = None, rank: int | None = None, prompt: str | None = None) -> str:
    """The one spelling of a gate's subject, shared by the gates, the tests' collection and the verdict."""
    if start is None:
        return "run"
    if rank is not None:
        return f"start-{start} rank-{rank}"
    if prompt is not None:
        return f"start-{start} prompt:{prompt}"
    return f"start-{start}"


@dataclass
class Verdict:
    gate: str
    subject: str
    passed: bool
    reasons: list[str] = field(default_factory=list)
    observed: dict[str, Any] = field(default_factory=dict)

    def explain(self) -> str:
        head = f"{self.gate} [{self.subject}]: {'PASS' if self.passed else 'FAIL'}"
        return head + "".join(f"\n  - {r}" for r in self.reasons)


class Check:
    """Collects failed expectations; a verdict passes when none failed."""

    def __init__(self, gate: str, subject: str):
        self.verdict = Verdict(gate, subject, True)

    def expect(self, ok: bool, reason: str) -> bool:
        if not ok:
            self.verdict.passed = False
            self.verdict.reasons.append(reason)
        return ok

    def observe(self, **values: Any) -> None:
        self.verdict.observed.update(values)

    def done(self) -> Verdict:
        return self.verdict


def started(check: Check, start: Evidence) -> bool:
    return check.expect(
        start.status == "ok",
        f"start-{start.start_index} did not complete: "
        f"{start.failure.message.splitlines()[0] if start.failure else 'no failure recorded'}",
    )


def request_of(check: Check, start: Evidence, prompt_id: str) -> Request | None:
    """The start's request for `prompt_id`, or None (and a failed check) when the start or the request is
    missing."""
    if not started(check, start):
        return None
    request = start.request(prompt_id)
    check.expect(request is not None, f"no request for prompt {prompt_id!r} in start-{start.start_index}")
    return request


def every_pass(start: Evidence, prompt_id: str) -> list[tuple[str, Request]]:
    """Every request of the prompt (the interleaved schedule's later passes and attempts too), each labelled
    for a message: the output gates judge them all under the one (start, prompt) subject."""
    found = start.every_request(prompt_id)
    return [(prompt_id if i == 0 else f"{prompt_id} (request {i + 1} of {len(found)})", r) for i, r in enumerate(found)]


def rank_audit(check: Check, start: Evidence, rank: int) -> dict[str, Any] | None:
    """The start's audit from TP rank `rank`, or None (and a failed check) when the start or the audit is
    missing."""
    if not started(check, start):
        return None
    audits = [a for a in start.audits if a.get("tp_rank") == rank]
    if not check.expect(
        len(audits) == 1,
        f"start-{start.start_index}: {len(audits)} audits from TP rank {rank} "
        f"(ranks seen: {sorted((a.get('tp_rank') for a in start.audits), key=rank_order)})",
    ):
        return None
    return audits[0]


def rank_order(rank: object) -> tuple[bool, int, str]:
    """Ranks in numeric order, then what is not a rank number (a missing or malformed tp_rank) by its text."""
    return (False, rank, "") if isinstance(rank, int) else (True, 0, repr(rank))


def layers_of(audit: dict[str, Any], owner: str) -> dict[str, dict[str, Any]]:
    return {n: layer for n, layer in audit.get("attention_layers", {}).items() if layer.get("owner") == owner}
