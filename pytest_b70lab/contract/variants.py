"""Variants of a contract, for the lab's experiments (issue 25's sweep): one full contract per point of a grid
over the contract's own dotted field names, plus the two the optimisation loop always needs.

    --vary speculative.num_speculative_tokens=3,7,11 --vary engine.block_size=32,64

Each variant is validated exactly as a contract file is (the same rules, the same messages, naming the field),
digested, and named after what it changes. Linked fields move together: a DFlash depth sets its verify width
(depth + 1). Named variants: `target-only` (the contract's teacher) and `unquantized-kv` (its unquantized-KV
reference). Which teacher judges a variant follows from what it changes: speculation alone keeps the base's
teacher (`shares_teacher`); anything that changes the target's output needs its own.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .schema import Contract, ContractError, format_errors

NAMED = ("target-only", "unquantized-kv")
# Fields that follow another: the verify width of a DFlash depth is the depth plus the bonus position.
LINKED: dict[str, dict[str, Callable[[int], int]]] = {
    "speculative.num_speculative_tokens": {"speculative.verify_width": lambda depth: depth + 1}
}
# What a variant may not change: what it is (its name and kind are derived), and the pinned sets.
FIXED = ("schema_version", "name", "kind", "description", "prompts", "quality")


class VariantError(ContractError):
    """A --vary that names no field of the contract, or a variant the contract's rules refuse."""


@dataclass(frozen=True)
class Variant:
    name: str
    contract: Contract
    changes: dict[str, Any]  # dotted field -> value, as asked (linked fields not listed)

    def shares_teacher(self, base: Contract) -> bool:
        """Judged against the base's teacher: the target-only run of this candidate is the base's own. A
        teacher or the unquantized-KV reference is judged by no teacher."""
        return (
            self.contract.kind == "candidate" and self.contract.teacher().output_digest == base.teacher().output_digest
        )

    def judged_against(self, base: Contract) -> str:
        if self.contract.kind == "teacher":
            return "no teacher: it is the target-only run the candidates are held to"
        if self.contract.kind == "reference":
            return "no teacher: the gates that need no FP8 cache"
        if self.shares_teacher(base):
            return f"the base's teacher ({base.teacher().name})"
        return f"its own teacher ({self.contract.teacher().name}), recorded in the sweep"


def parse_vary(spec: str) -> tuple[str, list[Any]]:
    """'FIELD=V1,V2' -> (FIELD, [V1, V2]); each value read as a TOML value (3, 0.35, true, "fp8" or fp8)."""
    field, sep, values = spec.partition("=")
    field = field.strip()
    if not sep or not field or not values.strip():
        raise VariantError(
            f"--vary {spec!r}: expected FIELD=V1,V2 (for example speculative.num_speculative_tokens=3,7,11)"
        )
    return field, [_value(v.strip(), spec) for v in values.split(",")]


def _value(text: str, spec: str) -> Any:
    if not text:
        raise VariantError(f"--vary {spec!r}: an empty value")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string (fp8, auto)


def _set(data: dict[str, Any], field: str, value: Any, base: Contract) -> None:
    *tables, leaf = field.split(".")
    if field.split(".")[0] in FIXED:
        raise VariantError(
            f"--vary {field}: a variant keeps the base's {field.split('.')[0]} (only the engine, "
            f"speculation, models, decode, reproduction, deadlines and expectations vary)"
        )
    node = data
    for i, table in enumerate(tables):
        if not isinstance(node.get(table), dict):
            raise VariantError(
                f"--vary {field}: contract {base.name} has no table {'.'.join(tables[: i + 1])}" + _known(node, dict)
            )
        node = node[table]
    if leaf not in node:
        raise VariantError(f"--vary {field}: contract {base.name} has no field {field}" + _known(node, None))
    node[leaf] = value


def _known(node: dict[str, Any], kind: type | None) -> str:
    names = sorted(k for k, v in node.items() if kind is None or isinstance(v, kind))
    return f" (it has {', '.join(names)})" if names else ""


def derive(base: Contract, changes: dict[str, Any]) -> Variant:
    """The base with `changes` (and their linked fields) applied, validated as a contract file would be."""
    data = base.canonical()
    for field, value in changes.items():
        _set(data, field, value, base)
        for linked, follow in LINKED.get(field, {}).items():
            _set(data, linked, follow(value), base)
    name = variant_name(base.name, changes)
    data.update(
        name=name, description=f"variant of {base.name}: " + ", ".join(f"{k} = {v}" for k, v in changes.items())
    )
    try:
        contract = Contract.model_validate(data, strict=False)
    except ValidationError as e:
        raise VariantError(
            f"variant {name} of contract {base.name} is refused by the contract rules:\n{format_errors(e)}"
        ) from e
    return Variant(name, contract, dict(changes))


def named(base: Contract, which: str) -> Variant:
    """`target-only` (the teacher) or `unquantized-kv` (the reference judged without FP8)."""
    if which == "target-only":
        return Variant(which, base.teacher(), {"draft": None, "speculative": None})
    if which == "unquantized-kv":
        return Variant(which, base.unquantized_kv_reference(), {"engine.kv_cache_dtype": "auto"})
    raise VariantError(f"no named variant {which!r}: the named ones are {', '.join(NAMED)}")


def grid(base: Contract, varies: list[str], extra: tuple[str, ...] = ()) -> list[Variant]:
    """The base first (every ratio is to it), then every other point of the --vary grid (in the order given,
    the last field varying fastest; a point that is the base in substance is the base), then the named
    variants in `extra`. Refused before anything starts: an unknown field, a value the contract rules
    forbid, two points that would be the same contract."""
    axes = [parse_vary(v) for v in varies]
    fields = [f for f, _ in axes]
    if len(set(fields)) != len(fields):
        raise VariantError(f"--vary names {sorted({f for f in fields if fields.count(f) > 1})} twice")
    out = [Variant(base.name, base, {})]
    seen = {substance(base): base.name}
    points = (
        [
            derive(base, dict(zip(fields, point, strict=False)))
            for point in itertools.product(*(vals for _, vals in axes))
        ]
        if axes
        else []
    )
    # A grid point that is the base in substance is the base, measured once.
    points = [v for v in points if substance(v.contract) != substance(base)]
    for v in points + [named(base, which) for which in extra]:
        key = substance(v.contract)
        if key in seen:
            raise VariantError(f"variants {seen[key]} and {v.name} are the same contract (they differ only in name)")
        seen[key] = v.name
        out.append(v)
    return out


def field_value(c: Contract, field: str) -> Any:
    """A dotted field's value in the contract (None where it has no such field)."""
    node: Any = c.canonical()
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def substance(c: Contract) -> str:
    """The contract's digest without its name and description: what a start of it would run and judge."""
    from ..digests import sha256_canonical

    data = c.canonical()
    data.pop("name")
    data.pop("description")
    return sha256_canonical(data)


def variant_name(base: str, changes: dict[str, Any]) -> str:
    """`<base>-<field leaf>-<value>` per change, in the contract name alphabet (a-z, 0-9, '.', '-')."""
    parts = [base] + [f"{field.rsplit('.', 1)[-1]}-{value}" for field, value in changes.items()]
    return re.sub(r"[^a-z0-9.\-]+", "-", "-".join(str(p).lower() for p in parts)).strip("-")
