"""How a sweep is cut into shards, and how plan.json keeps them.

A shard is the base and some variants with all their rounds, run on one box in one attempt: every shard repeats
the base, so each variant's paired figure is taken against a base measured on its own box, in its own session."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import LabError

SHARDS_DIR = "shards"


class ShardError(LabError, ValueError):
    """A shard size the sweep cannot use, or a plan.json whose shards do not read back."""


@dataclass(frozen=True)
class Shard:
    name: str  # "shard-01": its folder under DIR/shards/ and its key in the ledger
    variants: tuple[str, ...]  # the base first, then the shard's own variants

    def as_plan(self) -> dict[str, Any]:
        return {"name": self.name, "variants": list(self.variants)}


def split(names: Sequence[str], size: int) -> list[Shard]:
    """The base (`names[0]`) with every `size` of the other variants, in the grid's order; a grid of the base
    alone is one shard."""
    if size < 1:
        raise ShardError(f"--shard-size {size}: a shard holds at least one variant besides the base")
    if not names:
        raise ShardError("a sweep without variants has no shards")
    base, others = names[0], list(names[1:])
    chunks = [others[i : i + size] for i in range(0, len(others), size)] or [[]]
    width = max(2, len(str(len(chunks))))
    return [Shard(f"shard-{i:0{width}d}", (base, *chunk)) for i, chunk in enumerate(chunks, 1)]


def from_plan(record: dict[str, Any], names: Sequence[str]) -> list[Shard]:
    """The shards plan.json recorded, checked against the variants the plan names (`names`, base first)."""
    raw = record.get("shards")
    if not isinstance(raw, list) or not raw:
        raise ShardError("plan.json names no shards: it is not a fleet sweep's plan")
    shards = []
    for item in raw:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("name"), str)
            or not isinstance(item.get("variants"), list)
        ):
            raise ShardError(f"plan.json: a shard should be {{name, variants}}, found {item!r}")
        shards.append(Shard(item["name"], tuple(str(v) for v in item["variants"])))
    covered = [v for s in shards for v in s.variants[1:]]
    if any(s.variants[:1] != (names[0],) for s in shards) or sorted(covered) != sorted(names[1:]):
        raise ShardError(
            f"plan.json's shards {[s.variants for s in shards]} do not split the plan's variants {list(names)} "
            "(each shard the base first, every other variant in exactly one shard)"
        )
    return shards
