"""A checkpoint's tensor table: the checkpoint side of the load audit and of a contract's pinned scales, for
any checkpoint (a local folder, a Hugging Face hub snapshot, the generated mini).

A table is a plain JSON-able dict:

    {"format": 1,
     "source": str,                       # what was read: a folder, HUB_ID@REVISION, or the mini's manifest
     "files": {relpath: file_id},         # every regular file but hidden ones (.cache/, .git*): the identity
     "digest": str,                       # sha256 over the canonical `files` dict
     "tensors": {name: {"dtype": str, "shape": [int, ...],
                        "moments": {"sum": float, "sumsq": float, "numel": int},
                        "file": relpath}},
     "kv_scales": {engine attention layer: {"k_scale": float, "v_scale": float}},
     "kv_scale_count": int,               # scale tensors: two per calibrated layer
     "kv_scale_digest": str | None,       # digests.kv_scale_digest of the pairs; None without scales
     "quantization": dict | None,         # config.json's quantization_config
     "read": {"bytes": int, "seconds": float, "files_cached": int, "files_read": int}}

- file_id is the sha256 of the file's bytes. In a hub snapshot the hub already names its LFS blobs (the
  weights) by their sha256, and that name is used; any other file is hashed, the weights in the same pass
  that reads their tensors. A hub snapshot and a plain copy of it therefore have the same digest.
- Tensors come from the safetensors files vLLM loads: those the index file names, or every top-level
  `*.safetensors` when there is none. Moments are `digests.moments` of each tensor as stored, integer
  tensors included (pack-quantized `weight_packed` int32, `weight_shape`), so that they compare in their
  checkpoint form. Tensors above WHOLE_TENSOR_MAX elements are summed in row chunks (memory and speed).
- KV scales are found under the names vLLM's cache-scale mappers read (`<attn>.k_scale`,
  `<attn>.attn.k_scale`, the older compressed-tensors `<attn>.k_proj.output_scale`) and keyed by the engine
  layer `<attn>.attn`; each value is `float(t.item())` of the stored scalar, the number vLLM keeps.

Reading gigabytes is slow, so each file's part of the table is cached in `cache_dir/checkpoint-tables/`, keyed
by its hub blob name or by (resolved path, size, mtime, inode): finding an entry never re-reads the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..digests import add_moments, canonical_json, file_sha256, kv_scale_digest, moments, sha256_canonical
from ..errors import LabError

if TYPE_CHECKING:
    from _hashlib import HASH

    import torch

TABLE_FORMAT = 1
CACHE_FORMAT = 2  # 2: int32 (pack-quantized) tensors carry the moments of their 4-bit fields; 2-D ones shards
CACHE_SUBDIR = "checkpoint-tables"
INDEX_FILE = "model.safetensors.index.json"
# Up to this many elements a tensor's moments come from one call of `moments`, bit-identical to the engine
# side's; above it, from row chunks of about CHUNK_ELEMENTS, whose float64 copies (4 MiB) stay in cache and
# are reused by the allocator. Bigger pieces are slower, not just larger: measured here (one thread), 64 MiB
# bf16 tensors took ~870 MB per CPU-second in 2^19-element chunks, ~215 in 2^22 and ~130 whole. Chunked
# sums differ from whole ones by rounding only (~1e-16 relative; the load audit allows 1e-9).
WHOLE_TENSOR_MAX = 1 << 20
CHUNK_ELEMENTS = 1 << 19
# Files are read with torch on one thread (as the mini's manifest is built): the sums are then the same bits on
# every machine, and the many small reductions do not stall on a busy one (two threads on this 2-core
# machine, shared with an engine, read 5-10x slower than one).
_ONE_THREAD = threading.Lock()
_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
# (checkpoint name pattern -> the attention module), as vLLM's get_cache_scale_mapper renames them.
_KV_SCALE_NAMES = (
    re.compile(r"^(?P<attn>.+\.self_attn)(?:\.attn)?\.(?P<kv>[kv])_scale$"),
    re.compile(r"^(?P<attn>.+\.self_attn)\.(?P<kv>[kv])_proj\.output_scale$"),
)


class CheckpointError(LabError, RuntimeError):
    """A checkpoint that cannot give a tensor table; the message names the file and what is wrong."""


def engine_kv_scale(name: str) -> tuple[str, str] | None:
    """(engine attention layer, "k_scale" | "v_scale") for a checkpoint KV-scale tensor name, else None."""
    for pattern in _KV_SCALE_NAMES:
        if m := pattern.match(name):
            return f"{m['attn']}.attn", f"{m['kv']}_scale"
    return None


# --- one file -------------------------------------------------------------------------------------------


def _safetensors_layout(path: Path, size: int) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The raw header bytes (hashed as they are) and each tensor's byte range in the data section."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file (truncated?)")
        length = int.from_bytes(head, "little")
        if 8 + length > size:
            raise CheckpointError(f"{path}: the header claims {length} bytes, the file has {size} (truncated?)")
        header = f.read(length)
    try:
        entries = json.loads(header)
        ranges = {name: tuple(e["data_offsets"]) for name, e in entries.items() if name != "__metadata__"}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file (unreadable header: {e})") from None
    return head + header, ranges


class _SafetensorsFile(Protocol):
    """What is read of a safetensors `safe_open` handle (its stub leaves these methods untyped)."""

    def get_slice(self, name: str) -> Any: ...  # a lazy slice: get_shape() and row indexing

    def get_tensor(self, name: str) -> torch.Tensor: ...


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    import torch

    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


# The tensor-parallel sizes whose equal shards a table records the moments of (the load audit then names the
# rank whose shard differs). Routed experts are left out: expert parallelism keeps them whole on one rank each,
# and a MoE checkpoint has tens of thousands of them.
SHARD_COUNTS = (2, 4)
ROUTED_EXPERT = re.compile(r"\.experts\.\d+\.")


class ShardMoments:
    """Moments of a 2-D tensor's equal parts along each dimension, accumulated over row chunks:
    {"0": {"2": [moments of rows 0..n/2, rows n/2..n], "4": [...]}, "1": {...}} for each count of
    SHARD_COUNTS that divides the dimension."""

    def __init__(self, shape: list[int]):
        self.shape = shape
        self.parts: dict[tuple[int, int], list[list[dict[str, Any]]]] = {
            (dim, n): [[] for _ in range(n)] for dim in (0, 1) for n in SHARD_COUNTS if shape[dim] % n == 0
        }

    def add(self, chunk: torch.Tensor, first_row: int) -> None:
        rows = chunk.shape[0]
        for (dim, n), acc in self.parts.items():
            size = self.shape[dim] // n
            for k in range(n):
                if dim == 0:
                    lo, hi = max(first_row, k * size), min(first_row + rows, (k + 1) * size)
                    if lo < hi:
                        acc[k].append(moments(chunk[lo - first_row : hi - first_row]))
                else:
                    acc[k].append(moments(chunk[:, k * size : (k + 1) * size]))

    def result(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for (dim, n), acc in self.parts.items():
            out.setdefault(str(dim), {})[str(n)] = [add_moments(pieces) for pieces in acc]
        return out


def shard_moments(tensor: torch.Tensor) -> dict[str, dict[str, list[dict[str, Any]]]] | None:
    """ShardMoments of a whole tensor; None for a tensor that is not 2-D."""
    if tensor.dim() != 2:
        return None
    shards = ShardMoments(list(tensor.shape))
    shards.add(tensor, 0)
    return shards.result()


def _tensor_entry(f: _SafetensorsFile, name: str, hasher: HASH | None) -> tuple[dict[str, Any], float | None]:
    """dtype, shape and moments of one tensor (and its value when it is a scalar, and the moments of its
    tensor-parallel shards when it is a 2-D tensor other than a routed expert's), feeding its bytes to `hasher`
    in file order."""
    shape = list(f.get_slice(name).get_shape())
    numel = math.prod(shape)
    chunks: Iterable[torch.Tensor]
    if numel <= WHOLE_TENSOR_MAX:
        chunks = [f.get_tensor(name)]
    else:
        rows = max(1, CHUNK_ELEMENTS // (numel // shape[0]))
        whole = f.get_slice(name)
        chunks = (whole[start : start + rows] for start in range(0, shape[0], rows))
    parts: list[dict[str, float]] = []
    value: float | None = None
    shards = ShardMoments(shape) if len(shape) == 2 and not ROUTED_EXPERT.search(name) else None
    first_row = 0
    for chunk in chunks:
        # safetensors maps tensors at their file offsets, rarely 64-byte aligned; the float64 cast in
        # `moments` runs several times faster on an aligned copy (same values, so the same moments).
        chunk = chunk.clone()
        if hasher is not None:
            hasher.update(_tensor_bytes(chunk))
        parts.append(moments(chunk))
        if shards is not None:
            shards.add(chunk, first_row)
            first_row += chunk.shape[0]
        if numel == 1:
            value = float(chunk.item())
    total = parts[0] if len(parts) == 1 else add_moments(parts)
    dtype = str(chunk.dtype).removeprefix("torch.")
    entry: dict[str, Any] = {"dtype": dtype, "shape": shape, "moments": total}
    if shards is not None and (found := shards.result()):
        entry["shards"] = found
    return entry, value


@contextmanager
def _torch_on_one_thread() -> Iterator[None]:
    import torch

    with _ONE_THREAD:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def _read_safetensors(path: Path, known_id: str | None) -> dict[str, Any]:
    """Every tensor of one safetensors file and the values of its KV scales, and (unless the hub named it
    already) the file's sha256, hashed from the same bytes: the file is read once."""
    from safetensors import safe_open

    size = path.stat().st_size
    header, ranges = _safetensors_layout(path, size)
    in_file_order = sorted(ranges, key=lambda n: ranges[n])
    ends = [0] + [ranges[n][1] for n in in_file_order]
    contiguous = all(ranges[n][0] == ends[i] for i, n in enumerate(in_file_order)) and len(header) + ends[-1] == size
    hasher = hashlib.sha256(header) if known_id is None and contiguous else None
    tensors: dict[str, Any] = {}
    kv_values: dict[str, float] = {}
    name = None
    try:
        with _torch_on_one_thread(), safe_open(str(path), framework="pt") as f:
            for name in in_file_order:
                tensors[name], value = _tensor_entry(f, name, hasher)
                if engine_kv_scale(name) is not None:
                    if value is None:
                        raise CheckpointError(
                            f"{path}: KV scale {name} has shape {tensors[name]['shape']}; only "
                            f"scalar (per-tensor) KV scales can be pinned and audited"
                        )
                    kv_values[name] = value
    except CheckpointError:
        raise
    except Exception as e:  # safetensors and torch raise their own types; all mean "this file is bad"
        where = f" at tensor {name}" if name else ""
        raise CheckpointError(f"{path}: not a readable safetensors file{where} ({type(e).__name__}: {e})") from None
    if known_id is not None:
        file_id = known_id
    else:
        file_id = hasher.hexdigest() if hasher is not None else file_sha256(path)
    return {"file_id": file_id, "tensors": tensors, "kv_scale_values": kv_values}


def _hub_blob(path: Path) -> str | None:
    """The blob name of a file in a Hugging Face cache snapshot (snapshots/<commit>/f -> ../../blobs/<name>)."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    if target.parent.name == "blobs" and (target.parent.parent / "snapshots").is_dir():
        return target.name
    return None


class _EntryCache:
    """Per-file table parts as JSON files, written atomically; a file lock keeps two pytest-xdist workers from
    both reading the same gigabytes. An unreadable or foreign entry counts as absent and is rewritten."""

    def __init__(self, cache_dir: Path | None):
        self.root = Path(cache_dir) / CACHE_SUBDIR if cache_dir is not None else None

    def get(self, key: str, want_tensors: bool, compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """(entry, whether it came from the cache)."""
        if self.root is None:
            return compute(), False
        path = self.root / f"{key}.json"
        if (entry := self._load(path, key, want_tensors)) is not None:
            return entry, True
        from filelock import FileLock

        lock = FileLock(str(path) + ".lock")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError:
            return compute(), False  # a cache that cannot be written costs time, never the answer
        try:
            if (entry := self._load(path, key, want_tensors)) is not None:
                return entry, True
            entry = {"format": CACHE_FORMAT, "key": key, **compute()}
            self._store(path, entry)
        finally:
            lock.release()
        return entry, False

    @staticmethod
    def _load(path: Path, key: str, want_tensors: bool) -> dict[str, Any] | None:
        try:
            entry = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        if not (
            isinstance(entry, dict)
            and entry.get("format") == CACHE_FORMAT
            and entry.get("key") == key
            and isinstance(entry.get("file_id"), str)
            and isinstance(entry.get("size"), int)
        ):
            return None
        if want_tensors:
            tensors, kv_values = entry.get("tensors"), entry.get("kv_scale_values")
            if not (
                isinstance(tensors, dict)
                and isinstance(kv_values, dict)
                and all(isinstance(t, dict) and isinstance(t.get("moments"), dict) for t in tensors.values())
                and all(isinstance(v, float) for v in kv_values.values())
                and all(engine_kv_scale(n) is not None for n in kv_values)
            ):
                return None
        return entry

    @staticmethod
    def _store(path: Path, entry: dict[str, Any]) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(canonical_json(entry))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:
            pass


def _file_entry(path: Path, want_tensors: bool, cache: _EntryCache) -> tuple[dict[str, Any], str]:
    """One file's part of the table and how it was had: "read", "cached" or "named" (its hub blob name is
    its sha256 and nothing else was needed)."""
    blob = _hub_blob(path)
    real = path.resolve()
    try:
        before = real.stat()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e})") from None
    named_id = blob if blob is not None and _SHA256_NAME.match(blob) else None
    if named_id is not None and not want_tensors:
        return {"file_id": named_id, "size": before.st_size}, "named"
    if blob is not None:
        key = f"blob-{blob}"
    else:
        key = "file-" + sha256_canonical([str(real), before.st_size, before.st_mtime_ns, before.st_ino])

    def compute() -> dict[str, Any]:
        try:
            part = _read_safetensors(real, named_id) if want_tensors else {"file_id": file_sha256(real)}
            after = real.stat()
        except OSError as e:
            raise CheckpointError(f"{path}: cannot be read ({e})") from None
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise CheckpointError(f"{path} changed while it was being read; read it again once it is complete")
        return {"size": before.st_size, **part}

    entry, cached = cache.get(key, want_tensors, compute)
    return entry, "cached" if cached else "read"


# --- a folder ---------------------------------------------------------------------------------------------


def _folder_files(folder: Path) -> list[str]:
    """Every regular file under `folder` (following links to files), hidden names and caches left out."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(root) / name
            if path.is_symlink() and not path.exists():
                raise CheckpointError(f"{path} is a link to a missing file (an interrupted download?)")
            if path.is_file():
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None


def _weight_files(folder: Path, files: list[str]) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files vLLM loads, and the index's {tensor: file} when there is one."""
    top = [rel for rel in files if "/" not in rel and rel.endswith(".safetensors")]
    if INDEX_FILE not in files:
        if not top:
            raise CheckpointError(f"{folder}: no *.safetensors file (only safetensors checkpoints are read)")
        return top, None
    index = _read_json(folder / INDEX_FILE)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{folder / INDEX_FILE}: no weight_map")
    named = sorted(set(weight_map.values()))
    if missing := [rel for rel in named if rel not in top]:
        raise CheckpointError(
            f"{folder / INDEX_FILE} names {', '.join(missing)}, not in the folder (an incomplete download?)"
        )
    return named, weight_map


def _engine_kv_scales(values: dict[str, float], folder: Path) -> dict[str, dict[str, float]]:
    scales: dict[str, dict[str, float]] = {}
    origin: dict[tuple[str, str], str] = {}
    for name, value in sorted(values.items()):
        found = engine_kv_scale(name)
        assert found is not None  # only KV-scale names are recorded (and a cached entry holding others is refused)
        layer, kind = found
        if (layer, kind) in origin:
            raise CheckpointError(f"{folder}: two {kind}s for {layer}: {origin[layer, kind]} and {name}")
        origin[layer, kind] = name
        scales.setdefault(layer, {})[kind] = value
    if incomplete := sorted(layer for layer, pair in scales.items() if len(pair) != 2):
        raise CheckpointError(f"{folder}: {', '.join(incomplete)} have a k_scale or a v_scale, not both")
    return scales


def _quantization(folder: Path) -> dict[str, Any] | None:
    config_path = folder / "config.json"
    if not config_path.is_file():
        return None
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: not a JSON object")
    return config.get("quantization_config")


def read_table(folder: Path, cache_dir: Path | None = None, *, source: str | None = None) -> dict[str, Any]:
    """The tensor table of a checkpoint folder (see the module docstring), each file read at most once per
    content when `cache_dir` is given."""
    import safetensors.torch  # noqa: F401  (imports torch: not part of the read time)

    started = time.perf_counter()
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint folder {folder} does not exist"
            if not folder.exists()
            else f"checkpoint {folder} is not a folder"
        )
    files_list = _folder_files(folder)
    weights, weight_map = _weight_files(folder, files_list)
    cache = _EntryCache(cache_dir)
    read = {"bytes": 0, "seconds": 0.0, "files_cached": 0, "files_read": 0}
    files: dict[str, str] = {}
    tensors: dict[str, dict[str, Any]] = {}
    kv_values: dict[str, float] = {}
    for rel in files_list:
        entry, how = _file_entry(folder / rel, rel in weights, cache)
        files[rel] = entry["file_id"]
        if how == "read":
            read["files_read"] += 1
            read["bytes"] += entry["size"]
        elif how == "cached":
            read["files_cached"] += 1
        if rel not in weights:
            continue
        for name, tensor in entry["tensors"].items():
            if name in tensors:
                raise CheckpointError(f"{folder}: tensor {name} is in both {tensors[name]['file']} and {rel}")
            tensors[name] = {**tensor, "file": rel}
        kv_values.update(entry["kv_scale_values"])
    for name, rel in sorted((weight_map or {}).items()):
        if tensors.get(name, {}).get("file") != rel:
            raise CheckpointError(f"{folder / INDEX_FILE} puts {name} in {rel}, which does not hold it")
    kv_scales = _engine_kv_scales(kv_values, folder)
    read["seconds"] = time.perf_counter() - started
    return {
        "format": TABLE_FORMAT,
        "source": source or str(folder),
        "files": files,
        "digest": sha256_canonical(files),
        "tensors": dict(sorted(tensors.items())),
        "kv_scales": kv_scales,
        "kv_scale_count": 2 * len(kv_scales),
        "kv_scale_digest": kv_scale_digest({layer: (s["k_scale"], s["v_scale"]) for layer, s in kv_scales.items()})
        if kv_scales
        else None,
        "quantization": _quantization(folder),
        "read": read,
    }


def table_contradictions(table: dict[str, Any], part: str) -> list[str]:
    """A saved table's derived fields against their recomputation (its digest from its file list, the KV
    scale count and digest from its scales): a copy that disagrees with itself is judged by no gate."""
    out: list[str] = []
    files, kv_scales = table.get("files"), table.get("kv_scales")
    if not isinstance(files, dict) or not isinstance(kv_scales, dict):
        return [
            f"{part}: no file list or KV scale table (files: {type(files).__name__}, kv_scales: "
            f"{type(kv_scales).__name__})"
        ]
    if table.get("digest") != sha256_canonical(files):
        out.append(
            f"{part}.digest {str(table.get('digest'))[:16]}... is not the digest of its file list "
            f"({sha256_canonical(files)[:16]}...)"
        )
    if table.get("kv_scale_count") != 2 * len(kv_scales):
        out.append(f"{part}.kv_scale_count is {table.get('kv_scale_count')!r}, its scales are {2 * len(kv_scales)}")
    try:
        want = (
            kv_scale_digest({layer: (s["k_scale"], s["v_scale"]) for layer, s in kv_scales.items()})
            if kv_scales
            else None
        )
    except (KeyError, TypeError) as e:
        return [*out, f"{part}.kv_scales: a layer without a k_scale and v_scale ({e!r})"]
    if table.get("kv_scale_digest") != want:
        out.append(
            f"{part}.kv_scale_digest {str(table.get('kv_scale_digest'))[:16]}... is not the digest of its "
            f"scales ({str(want)[:16]}...)"
        )
    return out


# --- other producers and places ---------------------------------------------------------------------------


def table_from_mini_manifest(manifest: dict[str, Any], part: str) -> dict[str, Any]:
    """The same table for the mini's target or draft, from its manifest (nothing is read). The manifest does
    not record config.json, so `quantization` is None here; `read_table` on the folder gives it."""
    if part not in ("target", "draft"):
        raise ValueError(f"part must be 'target' or 'draft', not {part!r}")
    try:
        section = manifest[part]
        prefix = section.get("path", part) + "/"
        files = {rel[len(prefix) :]: sha for rel, sha in sorted(manifest["files"].items()) if rel.startswith(prefix)}
        tensors = {
            name: {
                **{k: t[k] for k in ("dtype", "shape", "moments", "shards") if k in t},
                "file": "model.safetensors",
            }  # the mini writes one weights file per part
            for name, t in sorted(section["tensors"].items())
        }
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"the mini manifest has no usable {part} section ({e!r}); rebuild with `b70lab mini build --force`"
        ) from None
    kv_scales = {layer: dict(pair) for layer, pair in sorted(section.get("kv_scales", {}).items())}
    return {
        "format": TABLE_FORMAT,
        "source": f"mini {str(manifest.get('recipe_digest', ''))[:16]} {part}",
        "files": files,
        "digest": sha256_canonical(files),
        "tensors": tensors,
        "kv_scales": kv_scales,
        "kv_scale_count": section.get("kv_scale_count", 2 * len(kv_scales)),
        "kv_scale_digest": section.get("kv_scale_digest"),
        "quantization": None,
        "read": {"bytes": 0, "seconds": 0.0, "files_cached": 0, "files_read": 0},
    }


def hub_snapshot(hub_id: str, revision: str) -> Path:
    """The folder of a hub model already in the local Hugging Face cache (nothing is downloaded: the gates
    run where there is no network, and a download is a step of its own)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, IncompleteSnapshotError, LocalEntryNotFoundError

    # Read at call time, so that HF_HUB_CACHE set after huggingface_hub was imported still counts.
    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    advice = (
        f"download it with `hf download {hub_id} --revision {revision}` (or set HF_HUB_CACHE to the "
        f"cache that holds it), or point the contract at a local folder"
    )
    try:
        return Path(snapshot_download(repo_id=hub_id, revision=revision, cache_dir=cache, local_files_only=True))
    except IncompleteSnapshotError as e:
        raise CheckpointError(
            f"{hub_id}@{revision} is only partly in the Hugging Face cache at {cache} ({e}); " + advice
        ) from None
    except LocalEntryNotFoundError:
        raise CheckpointError(f"{hub_id}@{revision} is not in the Hugging Face cache at {cache}; " + advice) from None
    except HFValidationError as e:
        raise CheckpointError(f"{hub_id!r} is not a Hugging Face model id ({e})") from None


def locate(spec: str) -> Path:
    """A checkpoint given as a folder, or as HUB_ID@REVISION (a snapshot in the local Hugging Face cache)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    hub_id, at, revision = spec.rpartition("@")
    if at and hub_id and revision and not path.exists():
        return hub_snapshot(hub_id, revision)
    raise CheckpointError(f"no checkpoint folder at {spec} (a hub model is given as HUB_ID@REVISION)")
