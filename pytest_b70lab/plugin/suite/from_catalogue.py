"""The gates' tests, made from the catalogue: one function per gate, named as its `Gate.test` says and
parametrized by its scope, each one call of `b70_gate_check`. Written out by hand they were sixteen copies of
the same line; made here, a gate added to the catalogue is a test of the session without another edit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ...judge import catalogue


def _per_rank() -> Callable[..., None]:
    def test(b70_start_evidence: Any, b70_rank: int, b70_gate_check: Any) -> None:
        b70_gate_check(b70_start_evidence, rank=b70_rank)

    return test


def _per_prompt() -> Callable[..., None]:
    def test(b70_start_evidence: Any, b70_prompt: str, b70_gate_check: Any) -> None:
        b70_gate_check(b70_start_evidence, prompt=b70_prompt)

    return test


def _per_start() -> Callable[..., None]:
    def test(b70_start_evidence: Any, b70_gate_check: Any) -> None:
        b70_gate_check(b70_start_evidence)

    return test


def _per_run() -> Callable[..., None]:
    def test(b70_gate_check: Any) -> None:
        b70_gate_check()

    return test


# A fresh function per gate (its b70_gate mark goes on the function object), asking for the fixtures that
# parametrize its scope: b70_start_evidence per start, and its b70_rank or b70_prompt.
_BY_SCOPE = {"rank": _per_rank, "prompt": _per_prompt, "start": _per_start, "run": _per_run}


def gate_tests(collected_as: str) -> dict[str, Callable[..., None]]:
    """The tests of the catalogue's gates that `collected_as` (a suite file name) holds, in catalogue order."""
    made: dict[str, Callable[..., None]] = {}
    for gate in catalogue.CATALOGUE:
        file, name = gate.test.split("::")
        if file != collected_as:
            continue
        test = _BY_SCOPE[gate.scope]()
        test.__name__ = test.__qualname__ = name
        test.__doc__ = f"{gate.name} ({gate.scope}): reads {', '.join(gate.reads)}."
        made[name] = pytest.mark.b70_gate(gate.name)(test)
    return made
