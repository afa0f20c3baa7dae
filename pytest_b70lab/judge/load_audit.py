"""The load audit: every tensor a rank holds equals its share of the checkpoint's (by moments), mapped from the
engine's parameter names to the checkpoint's."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import Any

from ..contract.schema import Contract
from ..digests import add_moments
from ..evidence.record import Evidence
from .rules import (
    Check,
    Verdict,
    started,
    subject,
)


def checkpoint_sources(engine_name: str, checkpoint: dict[str, dict[str, Any]]) -> list[str]:
    """The checkpoint tensors an engine parameter is made of. vLLM fuses q/k/v and gate/up, and stacks the
    experts (`experts.w13_<part>` = every expert's gate and up `<part>`); quantized layers keep the
    checkpoint's part names (`weight_packed`, `weight_scale`, ...), so the part carries through."""
    name = engine_name.replace(".routed_experts.", ".")
    for fused, members in (
        (".qkv_proj.", (".q_proj.", ".k_proj.", ".v_proj.")),
        (".gate_up_proj.", (".gate_proj.", ".up_proj.")),
    ):
        if fused in name:
            stem, part = name.rsplit(fused, 1)
            found = [stem + m + part for m in members if stem + m + part in checkpoint]
            if found:
                return found
    stem, _, leaf = name.rpartition(".experts.")
    for stacked, stacked_members in (("w13_", (".gate_proj.", ".up_proj.")), ("w2_", (".down_proj.",))):
        if stem and leaf.startswith(stacked):
            prefix, part = stem + ".experts.", leaf.removeprefix(stacked)
            return sorted(
                k
                for k in checkpoint
                if k.startswith(prefix)
                and k[len(prefix) :].split(".")[0].isdigit()
                and any(k.endswith(m + part) for m in stacked_members)
            )
    return [name] if name in checkpoint else []


# Checkpoint tensors the engine consumes at load instead of keeping as a parameter, and where they are
# audited instead.
CONSUMED_AT_LOAD = {
    "*.self_attn.k_scale": "KV scale, consumed at load: audited by target-scale-audit",
    "*.self_attn.v_scale": "KV scale, consumed at load: audited by target-scale-audit",
    "*.self_attn.k_proj.output_scale": "KV scale, consumed at load: audited by target-scale-audit",
    "*.self_attn.v_proj.output_scale": "KV scale, consumed at load: audited by target-scale-audit",
}


def _sources_in(
    checkpoint: dict[str, dict[str, Any]], to_checkpoint: Callable[[str], str]
) -> Callable[[str], list[str]]:
    """checkpoint_sources of an engine name, renamed as its checkpoint names it."""
    return lambda name: checkpoint_sources(to_checkpoint(name), checkpoint)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _same_values(seen: dict[str, Any], want: dict[str, Any]) -> bool:
    """Sums and sums of squares agree, and so do the packed words' 4-bit fields where both sides have them
    (a flipped low nibble moves only those)."""
    if not (_close(seen["sum"], want["sum"]) and _close(seen["sumsq"], want["sumsq"])):
        return False
    a, b = seen.get("nibbles"), want.get("nibbles")
    return not (isinstance(a, dict) and isinstance(b, dict)) or (a["sum"] == b["sum"] and a["sumsq"] == b["sumsq"])


def _described(m: dict[str, Any]) -> str:
    fields = f", 4-bit fields {m['nibbles']['sum']:.0f} / {m['nibbles']['sumsq']:.0f}" if "nibbles" in m else ""
    return f"sum {m['sum']:.6g}, sum of squares {m['sumsq']:.6g}{fields}"


def loaded_alternatives(engine_name: str, parts: list[str]) -> list[list[str]]:
    """What an engine parameter may hold of its checkpoint tensors: all of them (added up), except a fused or
    stacked layer's `weight_shape`. vLLM keeps one weight_shape per fused layer ([2]) and per stacked expert
    ([experts, 2]), and each member's load overwrites it: the member loaded last wins, in the checkpoint's file
    order (notes/2026-12-04-int4-weight-shape-last-member-wins.md). No kernel reads it; the audit accepts the
    shape of any one member, and of one member for every expert alike."""
    if not engine_name.endswith("weight_shape") or len(parts) < 2:
        return [parts]
    members = sorted({p.rsplit(".", 2)[-2] for p in parts})  # q_proj / k_proj / v_proj, gate_proj / up_proj
    return [[p for p in parts if p.rsplit(".", 2)[-2] == m] for m in members]


def _moment_mismatches(
    per_rank: dict[Any, dict[str, dict[str, Any]]],
    checkpoint: dict[str, dict[str, Any]],
    sources: Callable[[str], list[str]],
) -> tuple[int, set[str], list[str]]:
    """Compare each engine parameter's moments with those of the checkpoint tensors it is made of: per rank
    where it is replicated, added over the ranks where it is sharded (zero padding adds nothing)."""
    covered: set[str] = set()
    problems: list[str] = []
    compared = 0
    for name in sorted({n for params in per_rank.values() for n in params}):
        parts = sources(name)
        if not parts:
            continue
        covered.update(parts)
        if any("moments" not in checkpoint[s] for s in parts):
            problems.append(f"{name}: the checkpoint table has no moments for {parts}")
            continue
        wants = [add_moments([checkpoint[s]["moments"] for s in alt]) for alt in loaded_alternatives(name, parts)]
        recorded = {rank: params[name].get("moments") for rank, params in per_rank.items() if name in params}
        seen = {rank: m for rank, m in recorded.items() if m is not None}
        if len(seen) != len(recorded):
            problems.append(f"{name}: the audit recorded no moments (evidence from an older b70lab audit)")
            continue
        compared += 1
        want = wants[-1]
        if all(m["numel"] == want["numel"] for m in seen.values()):
            for rank, m in sorted(seen.items()):
                if not any(_same_values(m, w) for w in wants):
                    problems.append(f"{name} on rank {rank}: {_described(m)}; checkpoint {_described(want)}")
        else:
            problems += _sharded_mismatches(name, seen, loaded_alternatives(name, parts), checkpoint, wants)
    return compared, covered, problems


def _rank_shares(
    parts: list[str], checkpoint: dict[str, dict[str, Any]], ranks: int, rank: int
) -> list[tuple[dict[str, Any], str]]:
    """What one rank of `ranks` may hold of these checkpoint tensors: its equal part along either dimension
    (tensor parallel: the table's shard moments), or its block of whole routed experts (expert parallel,
    vLLM's linear placement). Each as (moments, how it was cut)."""
    shares = []
    for dim in ("0", "1"):
        pieces = [checkpoint[p].get("shards", {}).get(dim, {}).get(str(ranks)) for p in parts]
        if all(isinstance(piece, list) and len(piece) == ranks for piece in pieces):
            shares.append(
                (add_moments([piece[rank] for piece in pieces]), f"part {rank + 1} of {ranks} along dim {dim}")
            )
    experts = sorted({int(m.group(1)) for p in parts if (m := re.search(r"\.experts\.(\d+)\.", p))})
    if experts and len(experts) % ranks == 0:
        block = experts[rank * len(experts) // ranks : (rank + 1) * len(experts) // ranks]
        owned = [p for p in parts if any(f".experts.{e}." in p for e in block)]
        shares.append((add_moments([checkpoint[p]["moments"] for p in owned]), f"experts {block[0]}-{block[-1]}"))
    return shares


def _share_mismatch(
    name: str, rank: Any, moments: dict[str, Any], own: list[tuple[dict[str, Any], str]], held: list[tuple[Any, str]]
) -> str:
    """What one rank holds instead of its share: another rank's (named), or values of no rank's share."""
    if held:
        other, how = held[0]
        return (
            f"{name} on rank {rank}: rank {rank} holds rank {other}'s share ({how}), "
            f"not its own (" + " or ".join(h for _, h in own) + ")"
        )
    return f"{name} on rank {rank}: {_described(moments)}; its share of the checkpoint " + " or ".join(
        f"({how}) {_described(m)}" for m, how in own
    )


def _sharded_mismatches(
    name: str,
    seen: dict[Any, dict[str, Any]],
    alternatives: list[list[str]],
    checkpoint: dict[str, dict[str, Any]],
    wants: list[dict[str, Any]],
) -> list[str]:
    """A parameter split over the ranks: each rank against its own share of the checkpoint where the table
    lets the audit cut it (so the rank that differs is named), and the ranks together against the whole (an
    uneven split, such as a padded vocabulary, is judged by the whole alone)."""
    total = add_moments(list(seen.values()))
    whole_ok = total["numel"] >= wants[-1]["numel"] and any(_same_values(total, w) for w in wants)
    ranks = sorted(seen)
    shares = {
        r: [s for alt in alternatives for s in _rank_shares(alt, checkpoint, len(ranks), i)]
        for i, r in enumerate(ranks)
    }
    fits = {r: any(_same_values(seen[r], m) for m, _ in shares[r]) for r in ranks}
    # A rank that holds another rank's share: two ranks that swapped theirs fit none of their own, and their
    # total is the checkpoint's, so the whole alone would pass them.
    held = {r: [(q, how) for q in ranks if q != r for m, how in shares[q] if _same_values(seen[r], m)] for r in ranks}
    if all(shares.values()) and not all(fits.values()) and (any(fits.values()) or any(held.values())):
        return [_share_mismatch(name, r, seen[r], shares[r], held[r]) for r in ranks if not fits[r]]
    if whole_ok:
        return []
    return [
        f"{name} over ranks {ranks}: {_described(total)} over {total['numel']} values; checkpoint "
        f"{_described(wants[-1])} over {wants[-1]['numel']}"
    ]


def load_audit(
    start: Evidence,
    contract: Contract,
    target: dict[str, Any] | None,
    draft: dict[str, Any] | None,
    problems: dict[str, str] | None = None,
) -> Verdict:
    """Every tensor of the target (and draft) checkpoint reached the engine with its values: the float64
    sum and sum of squares of what the ranks loaded equal those of the checkpoint tensors each engine
    parameter is made of. Moments see through tensor-parallel sharding, fusion, kernel repacking and zero
    padding; a tensor left at its initial value (a router bias at zero) or loaded from the wrong place
    changes them. `target` / `draft` are checkpoint tables (pytest_b70lab.evidence.checkpoint); a checkpoint tensor
    that no parameter is made of fails, unless the contract exempts it by name with a reason."""
    c = Check("load-audit", subject(start.start_index))
    if not started(c, start):
        return c.done()
    exempt = {**CONSUMED_AT_LOAD, **contract.expect.load_audit_exempt}
    parts: list[tuple[str, dict[str, Any] | None, str, Callable[[str], str]]] = [
        ("target", target, "parameters", lambda n: n)
    ]
    if contract.speculative is not None:
        # The draft's engine names carry a "model." prefix its checkpoint does not; embedding and lm_head
        # are shared from the target and have no draft tensor.
        parts.append(("draft", draft, "draft_parameters", lambda n: n.removeprefix("model.")))
    for label, table, key, to_checkpoint in parts:
        tensors = (table or {}).get("tensors")
        why = (problems or {}).get(label) or "the checkpoint was not read"
        if not c.expect(bool(tensors), f"{label}: no checkpoint table to compare the engine with: {why}"):
            continue
        assert table is not None and tensors
        served = start.target if label == "target" else start.draft
        if served is not None and served.digest is not None:
            c.expect(
                served.digest == table.get("digest"),
                f"{label}: the engine served checkpoint {served.digest[:16]}..., the checkpoint table is of "
                f"{str(table.get('digest'))[:16]}...: the table is not of the served model",
            )
        per_rank = {a.get("tp_rank"): a.get(key) or {} for a in start.audits}
        if not c.expect(any(per_rank.values()), f"{label}: the audit recorded no {label} parameters"):
            continue
        compared, covered, mismatches = _moment_mismatches(per_rank, tensors, _sources_in(tensors, to_checkpoint))
        uncovered = sorted(k for k in tensors if k not in covered)
        exempted = {
            k: reason
            for k in uncovered
            if (reason := next((r for pattern, r in exempt.items() if fnmatch.fnmatchcase(k, pattern)), None))
        }
        missing = [k for k in uncovered if k not in exempted]
        c.observe(
            **{
                f"{label}_parameters_compared": compared,
                f"{label}_tensors_covered": len(covered),
                f"{label}_tensors": len(tensors),
                f"{label}_coverage": f"{len(covered)}/{len(tensors)}",
                f"{label}_exempted": len(exempted),
                f"{label}_mismatched": len(mismatches),
            }
        )
        c.expect(
            not mismatches,
            f"{label}: {len(mismatches)} mismatch(es) with the checkpoint: "
            + "; ".join(mismatches[:3])
            + (f"; and {len(mismatches) - 3} more" if len(mismatches) > 3 else ""),
        )
        c.expect(
            not missing,
            f"{label}: {len(missing)} of {len(tensors)} checkpoint tensors never reached an engine "
            f"parameter (and the contract does not exempt them): "
            + ", ".join(missing[:5])
            + (" ..." if len(missing) > 5 else ""),
        )
    return c.done()
