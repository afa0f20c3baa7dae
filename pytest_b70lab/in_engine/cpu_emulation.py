"""Run an engine as on an AVX2-only CPU, on a CPU that has AVX-512: so that both FP8 paths run on any machine.

Machines of the lab's kind differ in CPU (notes/2026-12-01-fp8-kv-without-avx512.md). vLLM picks its op
library by `torch.cpu._is_avx512_supported()` (`vllm/platforms/cpu.py`, `import_kernels`: `_C_AVX2` without
it), and its CPU attention refuses an FP8 cache by the same test and `torch.cpu._is_amx_tile_supported()`.
torch's own kernels follow `ATEN_CPU_CAPABILITY`, oneDNN's `ONEDNN_MAX_CPU_ISA`, Inductor's generated code
`ATEN_CPU_CAPABILITY` too: those are read when torch loads, so the launcher sets them in the engine's
environment (`engine.environment.engine_environment`). What is read in-process is answered here, before vLLM imports its
ops: from the engine entry module at import (the first code of every engine process, spawned ones included)
and again from the vLLM plugin (`fixes.register`); the pytest plugin applies it to the test process too,
so that `B70LAB_EMULATE_CPU=avx2 make test` runs the whole suite as an AVX2-only machine would.

`B70LAB_EMULATE_CPU=avx2` turns it on. Runs inside vLLM's processes: imports only the standard library and
torch.
"""

from __future__ import annotations

import os
import re
import sys

ENV_EMULATE = "B70LAB_EMULATE_CPU"
EMULATIONS = ("avx2",)
# What the launcher adds to the engine's environment under the emulation (read by torch at load).
EMULATION_ENVIRONMENT = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
# torch.cpu's capability answers an AVX2-only x86 CPU gives: none of these instruction sets.
_ABSENT_ON_AVX2 = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_avx512_vnni_supported",
    "_is_avx512_fp16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
    "_init_amx",
)
_applied: str | None = None
OP_LIBRARY = re.compile(r"/vllm/(?P<name>_C(?:_AVX2|_AVX512)?)\.[\w.]*so$")


class EmulationError(ValueError):
    """B70LAB_EMULATE_CPU names an emulation this package does not have."""


def requested(environ=os.environ) -> str | None:
    value = (environ.get(ENV_EMULATE) or "").strip().lower()
    if value in ("", "none", "off", "0"):
        return None
    if value not in EMULATIONS:
        raise EmulationError(
            f"{ENV_EMULATE}={value!r}: known emulations are {', '.join(EMULATIONS)} (or unset for the CPU as it is)"
        )
    return value


def _answers_no() -> bool:
    return False


def apply_from_environment() -> str | None:
    """Make torch.cpu answer as the requested CPU would; returns the emulation applied (idempotent)."""
    global _applied
    emulation = requested()
    if emulation is None or _applied == emulation:
        return _applied
    if "torch" not in sys.modules:  # not yet loaded: it will read these (an engine's launcher sets them anyway)
        for name, value in EMULATION_ENVIRONMENT[emulation].items():
            os.environ.setdefault(name, value)
    import torch

    for name in _ABSENT_ON_AVX2:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, _answers_no)
    _applied = emulation
    return _applied


def applied() -> str | None:
    return _applied


def loaded_op_library() -> str | None:
    """Which of vLLM's CPU op libraries this process mapped (`_C`, `_C_AVX512`, `_C_AVX2`): vLLM imports them
    under the one module name `_C`, so only the process's own memory map says which file it was."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            names = {m.group("name") for line in maps if (m := OP_LIBRARY.search(line.strip()))}
    except OSError:
        return None
    return ",".join(sorted(names)) or None
