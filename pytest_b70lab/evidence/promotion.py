"""promotion.json as a typed, versioned document: the file CI systems read. Tagged as the evidence is
(`"schema": "b70lab.promotion"`, `"version": 1`); its JSON Schema is `b70lab schema promotion`. A file
written before the tag (until 2026-12-03) still reads, and the reader says it is old."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import LabError

SCHEMA: Final = "b70lab.promotion"
VERSION: Final = 1
UNTAGGED = "written before promotion.json carried a schema tag (b70lab.promotion, version 1): an old file"


class PromotionError(LabError, ValueError):
    """A promotion.json that is not one: the message names the file and what is wrong."""


class Failed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    test: str
    gate: str | None
    subject: str | None
    outcome: str
    reasons: str


class Promotion(BaseModel):
    """The verdict of the last session that used a run folder, with what it was decided from. A folder that
    no session judged to the end says so (`judged` false, `problems` why)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_name: Literal["b70lab.promotion"] = Field(default=SCHEMA, alias="schema")
    version: Literal[1] = VERSION
    promotable: bool
    complete: bool
    judged: bool = True
    problems: list[str] = Field(default_factory=list)
    blocked: str | None = None
    contract: str | None = None
    contract_digest: str | None = None
    run_dir: str | None = None
    endpoint_medians_tok_s: list[float] | None = None
    failed_gates: list[str] = Field(default_factory=list)
    required: list[tuple[str, str]] = Field(default_factory=list)
    observed: list[tuple[str | None, str | None, str]] = Field(default_factory=list)
    missing: list[tuple[str, str]] = Field(default_factory=list)
    failed: list[Failed] = Field(default_factory=list)
    gates: list[dict[str, Any]] = Field(default_factory=list)  # every gate test's outcome, as verdict.GateOutcome
    speedup_over_target_only: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None  # gate 8's own section (verdict.quality_record)
    # per checkpoint part: "recomputed from ..." or "taken on trust: ..." (verdict.Decision.tables_checked)
    checkpoint_tables_checked: dict[str, str] = Field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=1, sort_keys=True, default=str) + "\n"


def _validated(raw: dict[str, Any]) -> Promotion:
    # Strict, through JSON as a reader sees the file: "yes" is not a boolean, a list is a JSON array.
    return Promotion.model_validate_json(json.dumps(raw, default=str), strict=True)


def build(**fields: Any) -> Promotion:
    """A promotion document from the verdict's fields (verdict.record), checked against the schema."""
    return _validated(fields)


def write(document: Promotion, path: Path) -> Path:
    path.write_text(document.as_json())
    return path


def read(path: Path) -> tuple[Promotion, list[str]]:
    """(the document, what a reader should know of it: an old, untagged file). A file that is not JSON, is of
    another schema or version, or does not match the schema is a PromotionError naming the file."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PromotionError(f"{path} is not valid JSON: {e}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise PromotionError(f"{path} cannot be read as a promotion verdict: {e}") from e
    if not isinstance(raw, dict):
        raise PromotionError(f"{path} is not a b70lab promotion verdict: not a JSON object")
    notes = []
    if "schema" not in raw:
        raw = {**raw, "schema": SCHEMA, "version": VERSION}
        notes.append(f"{path}: {UNTAGGED}")
    if raw.get("schema") != SCHEMA:
        raise PromotionError(f"{path} is not a b70lab promotion verdict (schema {raw.get('schema')!r})")
    if raw.get("version") != VERSION:
        raise PromotionError(f"{path} has version {raw.get('version')!r}; this b70lab reads version {VERSION}")
    try:
        return _validated(raw), notes
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PromotionError(f"{path} does not match the promotion schema: {where}: {first['msg']}") from e


def json_schema() -> dict[str, Any]:
    return Promotion.model_json_schema(by_alias=True)
