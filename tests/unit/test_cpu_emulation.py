"""The AVX2 emulation does what it says, in a fresh process as an engine's: vLLM loads its AVX2 op library,
torch's kernels run at AVX2, and vLLM's native CPU attention refuses an FP8 cache as on a real AVX2 CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_b70lab.engine import environment
from pytest_b70lab.evidence import host
from pytest_b70lab.in_engine import cpu_emulation

pytest.importorskip("vllm")

PROBE = """
import json
import pytest_b70lab.vllm_entry  # an engine process's first code
import torch
import vllm._custom_ops  # vLLM picks and loads its CPU op library here
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
from pytest_b70lab.in_engine import cpu_emulation

try:
    refusal = None
    _get_attn_isa(torch.float32, 32, 64, "fp8")
except NotImplementedError as e:
    refusal = str(e)
print(json.dumps({"library": cpu_emulation.loaded_op_library(), "applied": cpu_emulation.applied(),
                  "capability": torch.backends.cpu.get_cpu_capability(), "refusal": refusal}))
"""


def _probe(environ: dict[str, str]) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_avx2_emulation_loads_vllms_avx2_library_and_refuses_native_fp8(tmp_path) -> None:
    env = {
        **environment.engine_environment(tmp_path, 1, materialize=False),
        "B70LAB_EMULATE_CPU": "avx2",
        **cpu_emulation.EMULATION_ENVIRONMENT["avx2"],
    }
    seen = _probe(env)
    assert seen == {
        "library": "_C_AVX2",
        "applied": "avx2",
        "capability": "AVX2",
        "refusal": "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
    }


def test_without_the_emulation_the_cpu_is_what_it_is(tmp_path) -> None:
    env = {
        k: v
        for k, v in environment.engine_environment(tmp_path, 1, materialize=False).items()
        if k not in ("B70LAB_EMULATE_CPU", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    seen = _probe(env)
    identity = host.cpu_identity(environ={})
    assert seen["applied"] is None
    if identity["avx512"]:
        assert seen["library"] in ("_C", "_C_AVX512") and seen["refusal"] is None, seen
    else:
        assert seen["library"] == "_C_AVX2" and seen["refusal"], seen


def test_the_launch_sets_torchs_isa_and_keeps_compiled_code_apart(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("B70LAB_EMULATE_CPU", "avx2")
    env = environment.engine_environment(tmp_path, 1, materialize=False)
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "emulate-avx2"))
    monkeypatch.setenv("B70LAB_EMULATE_CPU", "avx9")
    with pytest.raises(cpu_emulation.EmulationError, match="known emulations are avx2"):
        environment.engine_environment(tmp_path, 1, materialize=False)
