"""Discovery of the Intel adapters (kernels/intel.py): each is found, absent with an explicit reason, or broken
with its error; and the adapter plumbing that runs without Intel hardware (page read-back, the refused
reference fallback). The adapters' numeric tests are test_kernels.py's, over every discovered implementation."""

from __future__ import annotations

import importlib.metadata as md
import logging
import sys

import pytest
import torch

from pytest_b70lab import kernels
from pytest_b70lab.kernels import discovery
from pytest_b70lab.kernels import intel as kernels_intel

pytestmark = pytest.mark.kernels


def _one(found: list, prefix: str):
    matching = [f for f in found if f.name.startswith(prefix)]
    assert len(matching) == 1, found
    return matching[0]


def test_each_intel_adapter_is_reported_here_with_its_reason(record_property) -> None:
    """What this machine has decides the branch; every branch names its cause."""
    found = kernels.discover()
    xpu, ipex = _one(found, "vllm-xpu"), _one(found, "ipex")
    said = {item.name: getattr(item, "reason", None) or getattr(item, "error", None) or "found" for item in (xpu, ipex)}
    record_property("b70_finding", "; ".join(f"{name}: {text}" for name, text in said.items()))
    if not discovery._has_xpu():
        assert isinstance(xpu, kernels.Unavailable) and xpu.reason.startswith("no XPU device here")
    if not discovery._importable("intel_extension_for_pytorch"):
        assert isinstance(ipex, kernels.Unavailable)
        assert "intel-extension-for-pytorch is not installed here" in ipex.reason and "make kernels-ipex" in ipex.reason
    elif isinstance(ipex, kernels.Unavailable):  # .venv-ipex: the CPU build's answer to an E4M3 cache
        assert "refuses an FP8 E4M3 KV cache" in ipex.reason and " raised " in ipex.reason, ipex.reason


def test_vllm_xpu_without_an_xpu_is_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_has_xpu", lambda: False)
    found = discovery._vllm_xpu()
    assert len(found) == 1 and isinstance(found[0], kernels.Unavailable)
    assert found[0].reason == (
        "no XPU device here (torch.xpu.is_available() is False): vLLM's XPU ops "
        "(vllm-xpu-kernels) run where the B70 cards are"
    )


def test_vllm_xpu_on_an_xpu_host_without_the_package_is_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_has_xpu", lambda: True)
    monkeypatch.setattr(discovery, "_importable", lambda module: False)
    found = discovery._vllm_xpu()
    assert isinstance(found[0], kernels.Unavailable)
    assert "an XPU is present, but vllm-xpu-kernels" in found[0].reason and "is not installed" in found[0].reason


def test_vllm_xpu_installed_on_an_xpu_host_but_not_loading_is_broken(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_has_xpu", lambda: True)
    monkeypatch.setattr(discovery, "_importable", lambda module: True)
    monkeypatch.setitem(sys.modules, "vllm_xpu_kernels", None)  # its import now raises ImportError
    found = discovery._vllm_xpu()
    assert isinstance(found[0], kernels.Broken), found
    assert "its ops do not load" in found[0].error and "vllm_xpu_kernels" in found[0].error


def test_ipex_not_installed_is_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_importable", lambda module: False)
    found = discovery._ipex()
    assert isinstance(found[0], kernels.Unavailable) and found[0].name == "ipex"
    assert found[0].reason == (
        "intel-extension-for-pytorch is not installed here (it pins its own torch; "
        "`make kernels-ipex` runs these tests in .venv-ipex)"
    )


def test_ipex_beside_another_torch_is_broken_without_importing_it(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_importable", lambda module: True)
    monkeypatch.setattr(md, "version", lambda distribution: "1.99.0")
    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch", None)  # an import would fail: none happens
    found = discovery._ipex()
    assert isinstance(found[0], kernels.Broken), found
    assert found[0].error == (
        f"intel-extension-for-pytorch 1.99.0 is installed beside torch {torch.__version__}: "
        f"it loads only with torch 1.99.*"
    )


class _RefusingIpex:
    name, version, device = "ipex-cpu", "9.9.9", torch.device("cpu")

    def probe_e4m3(self) -> str:
        return "TypeError: only float8_e5m2 supported"


def test_an_ipex_that_refuses_e4m3_is_unavailable_with_the_ops_own_error(monkeypatch) -> None:
    monkeypatch.setattr(discovery, "_importable", lambda module: True)
    monkeypatch.setattr(md, "version", lambda distribution: torch.__version__)
    monkeypatch.setattr(kernels_intel, "IpexPagedImpl", _RefusingIpex)
    found = discovery._ipex()
    assert isinstance(found[0], kernels.Unavailable) and found[0].name == "ipex-cpu"
    assert found[0].reason.startswith("intel-extension-for-pytorch 9.9.9 on cpu refuses an FP8 E4M3 KV cache")
    assert "raised TypeError: only float8_e5m2 supported" in found[0].reason


@pytest.mark.parametrize("heads_first", [True, False], ids=["pages-KVH-block-D", "pages-block-KVH-D"])
def test_paged_read_back_follows_the_block_table(heads_first: bool) -> None:
    """The adapters read their pages back through one helper: checked against the reference's own read-back."""
    batch = kernels.Batch([5, 40], [1, 12], 4, 2, 64, 32, torch.float32, seed=3).build()
    reference = kernels.ReferenceImpl()
    k_cache, v_cache = reference.write(batch, *batch.calibrated_scales())  # pages [blocks, KVH, block, D]
    pages = (k_cache, v_cache) if heads_first else (k_cache.transpose(1, 2), v_cache.transpose(1, 2))
    for seq in range(2):
        want_k, want_v = reference.read_back((k_cache, v_cache), batch, seq)
        assert torch.equal(kernels_intel._paged_codes(pages[0], batch, seq, heads_first), want_k)
        assert torch.equal(kernels_intel._paged_codes(pages[1], batch, seq, heads_first), want_v)


def test_a_silent_reference_fallback_of_vllm_xpu_kernels_is_an_error() -> None:
    """vllm-xpu-kernels runs its PyTorch reference for a shape it has no kernel for, with a warning only."""
    logger = logging.getLogger("vllm_xpu_kernels.flash_attn_interface")
    with pytest.raises(RuntimeError, match="no compiled kernel for this shape"):
        with kernels_intel._refusing_reference_fallback():
            logger.warning("XPU kernel not compiled for this config, falling back to PyTorch reference attention.")
    with kernels_intel._refusing_reference_fallback():
        logger.warning("an unrelated warning")
