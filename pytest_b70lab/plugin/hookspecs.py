"""The hooks another plugin implements to add a gate to the promotion and to read the verdict.

A gate of another plugin is a test like the catalogue's: marked `gates` and `b70_gate(NAME)`, per
`b70_start` / `b70_rank` / `b70_prompt` as its scope says, judging `b70_verdict(...)` from evidence. Declaring
it here makes the verdict require it: a run where it is deselected, skipped or lost is not promotable.
tests/unit/test_hooks.py is a worked example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..judge.catalogue import Gate
    from ..judge.verdict import Decision, QualityDecision


@pytest.hookspec
def pytest_b70lab_gates(config: pytest.Config) -> Mapping[str, str] | None:
    """Gates this plugin adds, as {name: scope} with scope "rank", "prompt", "start" or "run": the verdict
    requires (name, subject) for every subject of that scope (each start's ranks or prompts, each start, or
    the run once), and `b70_gate(name)` accepts the name. A name of the catalogue, an unknown scope, or a
    name two plugins declare with different scopes is a usage error."""


@pytest.hookspec
def pytest_b70lab_catalogue(config: pytest.Config) -> Sequence[Gate] | None:
    """Gates this plugin adds as catalogue entries, declared the way the catalogue's own are:
    `catalogue.Gate(name, reads, test, rule, declared_scope=...)`, the rule a pure function of
    `catalogue.Inputs` and `catalogue.Subject`. The verdict requires them as it requires a
    pytest_b70lab_gates entry (the same usage errors); their tests call `b70_gate_check` like the suite's, and
    `judge.judge(..., added=...)` judges them in-process with the same rule."""


@pytest.hookspec
def pytest_b70lab_verdict(
    config: pytest.Config, decision: Decision | None, quality: QualityDecision | None, run_dir: Path
) -> None:
    """Called once, on the controller, after the verdict was decided and RUN/promotion.json written;
    `decision` is None when no gate ran, `quality` None when gate 8 did not. Read-only: a plugin that
    disagrees adds a gate instead."""
