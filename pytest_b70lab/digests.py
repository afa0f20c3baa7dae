"""The one home of the digests the package compares, so that contract, evidence, mini, checkpoint tables and
gates identify things the same way: canonical JSON, a file's sha256, tensor moments, the KV-scale digest.

Imports nothing heavy (no torch): the gates use it on any machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# Tensor moments (float64 sum, sum of squares, element count) are defined in in_engine.observe and only re-exported
# here: that module runs inside vLLM's processes and imports nothing else of the package, so the definition
# has to live there for the engine side and the checkpoint side to compute the very same thing.
from .in_engine.observe import add_moments, moments

__all__ = [
    "add_moments",
    "bytes_sha256",
    "canonical_json",
    "file_sha256",
    "kv_scale_digest",
    "moments",
    "sha256_canonical",
    "text_sha256",
]


def canonical_json(obj: Any) -> bytes:
    """One byte string per JSON value: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256_canonical(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def text_sha256(text: str) -> str:
    """A generated text's digest (evidence, teacher snapshots): SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def kv_scale_digest(scales: dict[str, tuple[float, float]]) -> str:
    """Digest of {engine attention layer: (k_scale, v_scale)}, exact to the bit (float.hex), by layer name."""
    lines = "".join(f"{name} {float(k).hex()} {float(v).hex()}\n" for name, (k, v) in sorted(scales.items()))
    return hashlib.sha256(lines.encode()).hexdigest()
