"""Gates 1 and 2, the KV-scale audits per rank: the target's calibrated FP8 scales as loaded, and the draft's
unit-scale FP8 cache layers."""

from __future__ import annotations

from ..contract.schema import Contract
from ..digests import kv_scale_digest
from ..evidence.record import Evidence
from .rules import (
    FP8_KV_DTYPES,
    Check,
    Verdict,
    layers_of,
    rank_audit,
    subject,
)


def target_scale_audit(
    start: Evidence, rank: int, contract: Contract, calibrated: dict[str, dict[str, float]] | None
) -> Verdict:
    """Every target attention layer holds FP8 KV with the checkpoint's calibrated scalar scales; their
    count and digest are the contract's; nothing calculates scales at run time. `calibrated` is the
    checkpoint's per-layer table (engine layer -> k_scale, v_scale): without it the gate cannot say which
    layer holds what, and fails."""
    c = Check("target-scale-audit", subject(start.start_index, rank=rank))
    if (audit := rank_audit(c, start, rank)) is None:
        return c.done()
    layers = layers_of(audit, "target")
    scales = {n: (layer["k_scale"], layer["v_scale"]) for n, layer in layers.items()}
    digest = kv_scale_digest(scales) if all(isinstance(v, float) for pair in scales.values() for v in pair) else None
    c.observe(scale_count=2 * len(layers), scale_digest=digest)
    c.expect(
        2 * len(layers) == contract.expect.target_kv_scale_count,
        f"{2 * len(layers)} K/V scales on {len(layers)} target layers, the contract expects "
        f"{contract.expect.target_kv_scale_count}",
    )
    c.expect(
        calibrated is not None,
        "no checkpoint table of calibrated scales to compare the engine's with "
        "(the target checkpoint could not be read: see the load-audit gate)",
    )
    for name, layer in sorted(layers.items()):
        c.expect(
            layer.get("kv_cache_dtype") in FP8_KV_DTYPES,
            f"{name}: KV cache dtype {layer.get('kv_cache_dtype')!r}, expected FP8",
        )
        # None: the engine has no run-time scale calculation at all (vLLM 0.32); an absent key: not audited.
        c.expect("calculate_kv_scales" in layer, f"{name}: the audit did not record calculate_kv_scales")
        c.expect(layer.get("calculate_kv_scales") in (False, None), f"{name}: calculates KV scales at run time")
        if scales[name] == (1.0, 1.0):
            c.expect(False, f"{name}: K and V scale are 1.0: the calibrated scales did not load")
        if calibrated is not None:
            if not c.expect(name in calibrated, f"{name}: the checkpoint has no calibrated scales for this layer"):
                continue
            want = (calibrated[name]["k_scale"], calibrated[name]["v_scale"])
            c.expect(scales[name] == want, f"{name}: engine scales (k, v) = {scales[name]}, checkpoint has {want}")
    for name in sorted(set(calibrated or {}) - set(layers)):
        c.expect(False, f"{name}: calibrated in the checkpoint, but no such target attention layer in the engine")
    c.expect(
        digest == contract.expect.target_kv_scale_digest,
        f"scale digest {digest} != contract's {contract.expect.target_kv_scale_digest}",
    )
    cache_config = audit.get("cache_config") or {}
    c.expect("calculate_kv_scales" in cache_config, "the audit did not record the cache config's calculate_kv_scales")
    c.expect(
        cache_config.get("calculate_kv_scales") in (False, None),
        "the engine's cache config calculates KV scales at run time",
    )
    return c.done()


def draft_cache_audit(start: Evidence, rank: int, contract: Contract) -> Verdict:
    """The draft's cache layers: the contract's count, FP8, unit scale; the draft declares no KV scheme."""
    c = Check("draft-cache-audit", subject(start.start_index, rank=rank))
    if (audit := rank_audit(c, start, rank)) is None:
        return c.done()
    layers = layers_of(audit, "draft")
    c.observe(draft_cache_layers=len(layers))
    c.expect(
        len(layers) == contract.expect.draft_unit_scale_layers,
        f"{len(layers)} draft cache layers, the contract expects {contract.expect.draft_unit_scale_layers}",
    )
    for name, layer in sorted(layers.items()):
        c.expect(
            layer.get("kv_cache_dtype") in FP8_KV_DTYPES,
            f"{name}: draft KV cache dtype {layer.get('kv_cache_dtype')!r}, expected FP8",
        )
        c.expect(
            (layer.get("k_scale"), layer.get("v_scale")) == (1.0, 1.0),
            f"{name}: draft scales (k, v) = {(layer.get('k_scale'), layer.get('v_scale'))}, expected unit scale",
        )
    # None: the draft's config has no quantization_config; a dict: it has one; anything else (absent, or
    # the audit's "unavailable: ..." note) means nobody looked, which is not "declares none".
    if not c.expect("draft_quantization" in audit, "the audit did not record the draft's quantization config"):
        return c.done()
    quant = audit["draft_quantization"]
    if not c.expect(
        quant is None or isinstance(quant, dict), f"the draft's quantization config could not be read: {quant!r}"
    ):
        return c.done()
    declares = isinstance(quant, dict) and quant.get("kv_cache_scheme") is not None
    c.expect(
        not declares,
        f"the draft checkpoint declares a KV calibration: {quant.get('kv_cache_scheme') if declares else ''}",
    )
    return c.done()
