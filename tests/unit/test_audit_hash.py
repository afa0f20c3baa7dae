"""The worker audit hashes every weight in bounded chunks: the digest must be the one of the whole tensor's
bytes (recorded evidence and teacher identities were made that way), whatever the chunk size."""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch")

from pytest_b70lab.in_engine import worker_ext  # noqa: E402


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 26])
def test_chunked_digest_is_the_whole_tensor_digest(monkeypatch, chunk: int) -> None:
    monkeypatch.setattr(worker_ext, "HASH_CHUNK_BYTES", chunk)
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(37, 53, generator=g),
        torch.zeros(0),
        torch.tensor(3.0),
        torch.randint(-9, 9, (4097,), dtype=torch.int32, generator=g),
        torch.ones(5, dtype=torch.bool),
        torch.randn(8, 9, generator=g).t(),
        torch.randn(64, generator=g).to(torch.bfloat16),
    ]
    for t in tensors:
        whole = hashlib.sha256(
            t.contiguous().numpy().tobytes()
            if t.dtype != torch.bfloat16
            else t.contiguous().view(torch.int16).numpy().tobytes()
        ).hexdigest()
        assert worker_ext._tensor_sha256(t) == whole, (t.dtype, tuple(t.shape))
