"""Quality prompt sets: one JSON object a line, each a sample of one family with what its check needs.

A set is pinned by sha256 in the contract's [quality] table, like the gate prompts. Families:

- coding:       `prompt` (a function head) completed; `prompt + completion + test` then `check(entry_point)` is
                run in the sandbox. `test` defines `check(candidate)` (HumanEval's convention).
- structured:   `prompt` asking for JSON; asked twice, guided by `schema` (vLLM's `structured_outputs`)
                and unguided; the answer must validate against `schema`.
- tool_use:     chat `messages` with `tools`; the server's parsed tool call must name `expected_tool`
                with arguments that validate against that tool's parameters.
- repetition:   a free `prompt`, `max_tokens` long; judged by word n-gram repetition and the longest
                repeated span.
- long_context: `prompt` = a needle among key=value pairs; the answer must start with `expected`.
                `position` says where in the context window the prompt ends (quarter, half, near-max).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import LabError

Family = Literal["coding", "structured", "tool_use", "repetition", "long_context"]
FAMILIES: tuple[str, ...] = ("coding", "structured", "tool_use", "repetition", "long_context")
POSITIONS = ("quarter", "half", "near-max")


class QualityPromptError(LabError, ValueError):
    """A quality prompt set is missing, changed, or has a malformed line (the message names file and line)."""


class QualitySample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.\-/]+$")
    family: Family
    max_tokens: int = Field(gt=0)
    prompt: str | None = None  # every family but tool_use
    stop: list[str] = Field(default_factory=list)  # stop strings sent with the request
    entry_point: str | None = None  # coding
    test: str | None = None  # coding: defines check(candidate)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # structured
    messages: list[dict[str, Any]] | None = None  # tool_use
    tools: list[dict[str, Any]] | None = None  # tool_use
    expected_tool: str | None = None  # tool_use
    expected: str | None = None  # long_context
    position: Literal["quarter", "half", "near-max"] | None = None  # long_context
    prompt_tokens: int | None = None  # long_context: the prompt's length in the model's tokens
    source: str | None = None  # where the sample comes from (e.g. "HumanEval/12")

    @model_validator(mode="after")
    def _fields_of_family(self) -> QualitySample:
        need = {
            "coding": ("prompt", "entry_point", "test"),
            "structured": ("prompt", "schema_"),
            "tool_use": ("messages", "tools", "expected_tool"),
            "repetition": ("prompt",),
            "long_context": ("prompt", "expected", "position"),
        }[self.family]
        missing = [n.rstrip("_") for n in need if getattr(self, n) in (None, "", [])]
        if missing:
            raise ValueError(f"a {self.family} sample needs {', '.join(missing)}")
        return self

    @property
    def variants(self) -> tuple[str, ...]:
        """The requests this sample makes: structured output is asked guided and unguided."""
        return ("guided", "unguided") if self.family == "structured" else ("",)


def load(path: Path, sha256: str, count: int) -> list[QualitySample]:
    """The pinned quality prompt set, checked against its sha256 and count, ids unique."""
    from ..contract.schema import read_pinned_jsonl

    return read_pinned_jsonl(
        path,
        sha256,
        count,
        QualitySample,
        f"quality prompt set {path}",
        QualityPromptError,
        noun="samples",
        changed="the samples changed; a new set needs a new version and digest (and a new quality baseline)",
    )


def dump_line(sample: QualitySample) -> str:
    """One line of a prompt set file (generators use this, so every set is written the same way)."""
    return sample.model_dump_json(by_alias=True, exclude_none=True, exclude_defaults=False)
