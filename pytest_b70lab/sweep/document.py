"""`DIR/sweep.json` and `DIR/sweep-junit.xml`: what a finished sweep leaves for the page, CI and a later reader.
Built here from the runner's outcome and the table's rows, so that the command line only parses and prints."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from ..contract import variants
from ..contract.schema import Contract
from ..evidence import host
from . import plan, table
from .runner import Outcome, SweepError


def build(
    base: Contract,
    vary: list[str],
    named: tuple[str, ...],
    rounds: int,
    schedule: str,
    prompt_ids: list[str] | None,
    outcome: Outcome,
    rows: list[table.Row],
) -> dict[str, Any]:
    """The sweep's document: what was asked, in which order it ran, each variant's row with the base's values
    of the fields it varies, and the CPU it ran on."""
    fields = [variants.parse_vary(v)[0] for v in vary]
    return {
        "schema": plan.SWEEP_SCHEMA,
        "version": plan.SWEEP_VERSION,
        "base": base.name,
        "base_digest": base.digest,
        "varies": vary,
        "fields": fields,
        "named": list(named),
        "rounds": rounds,
        "schedule": schedule,
        "prompts": prompt_ids,
        "order": [p.label() for p in outcome.order],
        "status": outcome.status,
        "teachers": outcome.teachers,
        "problems": outcome.problems,
        "cpu": host.describe(host.cpu_identity()),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "variants": [{**r.as_dict(), "base_values": {f: variants.field_value(base, f) for f in fields}} for r in rows],
    }


def write(out: Path, document: dict[str, Any], rows: list[table.Row]) -> Path:
    """sweep.json and the JUnit file beside it; a full disk or a read-only folder is a SweepError naming it."""
    path = out / plan.SWEEP_JSON
    try:
        path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        (out / plan.JUNIT).write_text(table.junit_xml(rows, document["base"]))
    except OSError as e:
        raise SweepError(f"cannot write the sweep table into {out}: {e.strerror or e}") from e
    return path
