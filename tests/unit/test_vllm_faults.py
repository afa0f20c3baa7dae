"""The fault hook is inert unless B70LAB_FAULT names a fault, and a misspelt fault is an error, not a
silently healthy engine (the fault matrix itself is tests/faults/)."""

from __future__ import annotations

import pytest

from pytest_b70lab import vllm_faults


def test_unset_means_no_fault(monkeypatch) -> None:
    monkeypatch.delenv(vllm_faults.ENV, raising=False)
    assert vllm_faults.parse(None) is None and vllm_faults.parse("") is None
    monkeypatch.setattr(vllm_faults, "_installed", None)
    vllm_faults.register()
    assert vllm_faults._installed is None


@pytest.mark.parametrize("spec, fault", [
    ("collective-stall:1", vllm_faults.Fault("collective-stall", 1, None)),
    ("die-decode:1:30", vllm_faults.Fault("die-decode", 1, 30)),
    ("raise-loading:1", vllm_faults.Fault("raise-loading", 1, None)),
    ("raise-kv-cache:0", vllm_faults.Fault("raise-kv-cache", 0, None)),
    ("engine-core-exit:7", vllm_faults.Fault("engine-core-exit", None, 7)),
    ("stream-cut", vllm_faults.Fault("stream-cut", None, None)),
])
def test_a_fault_names_its_rank_and_moment(spec: str, fault) -> None:
    assert vllm_faults.parse(spec) == fault


@pytest.mark.parametrize("spec, message", [("die-loadin:1", "unknown fault 'die-loadin'"),
                                           ("die-loading", "die-loading needs a rank"),
                                           ("raise-kv-cache", "raise-kv-cache needs a rank")])
def test_a_misspelt_fault_is_an_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        vllm_faults.parse(spec)
