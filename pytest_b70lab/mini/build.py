"""The embedded default model: the trained tiny Laguna target and its distilled DFlash draft, served.

No weights can be downloaded where the gates run in CI, so the project trains its own (`b70lab mini train`,
mini/train.py and mini/distil.py) and commits them under fixtures/mini/: the curriculum tokenizer, the target
(dense + sigmoid-routed MoE layers with a fixed correction bias, gated attention) and the draft, in bf16,
with recipe.json and the training log. A build assembles the served folders from those files: configs, the
tokenizer with the mini's chat template, FP8 KV scales from a calibration pass over curriculum text (stored
the way compressed-tensors checkpoints carry them), and the draft without KV calibration. A build is
byte-identical to the last one from the same weights and libraries.

Output folder (keyed by the recipe digest):
    target/     the served checkpoint: weights + k_scale/v_scale + a `kv_cache_scheme` quantization_config
    reference/  the same weights as a plain transformers checkpoint (no quantization config, no scales)
    draft/      the DFlash draft (no quantization config: its cache layers run FP8 at scale 1.0)
    manifest.json
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

# kv_scale_digest and file_sha256 moved to digests; re-exported for the modules that still import them from here.
from ..digests import file_sha256, kv_scale_digest, sha256_canonical
from ..errors import LabError
from .recipe import (
    DRAFT_INT4_RECIPE,
    DRAFT_INT4_WEIGHTS,
    DRAFT_WEIGHTS,
    INT4_DRAFT_FILES,
    WEIGHT_FILES,
    DraftRecipe,
    MiniRecipe,
    TargetRecipe,
    draft_config,
    library_versions,
    target_config,
)
from .tokenizer import load_tokenizer

BUILDER_VERSION = 4
FP8_E4M3_MAX = 448.0
MANIFEST = "manifest.json"
WEIGHTS = "fixtures/mini"  # in the lab's repository (pytest_b70lab.contract.project), beside the contracts


class MiniModelError(LabError, RuntimeError):
    """A mini model folder is missing, incomplete or not what its manifest says."""


def calibration_texts() -> list[str]:
    """Curriculum text of every family (one needle task near the contract's length): the activations the
    KV scales must cover. Training samples: what the model was fitted to, not what the checks hold out."""
    from . import curriculum

    texts = [
        curriculum.sample("train", 99, i, family, n_pairs=150 if i == 0 else 12).text
        for family in curriculum.FAMILIES
        for i in range(2)
    ]
    return [t.removeprefix(curriculum.BOS) for t in texts]  # the tokenizer puts `<s>` in front


def weights_dir() -> Path:
    """Where the trained weights are read from: fixtures/mini, or B70LAB_MINI_WEIGHTS (a retrain's output)."""
    from ..contract import project

    return Path(os.environ.get("B70LAB_MINI_WEIGHTS") or project.find(WEIGHTS))


def _file_digests(folder: Path, names: tuple[str, ...], what: str, remake: str) -> dict[str, str]:
    """sha256 of each named file in `folder`; a missing one is a clear error naming `what` and how to remake it."""
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise MiniModelError(
            f"{what} incomplete in {folder}: missing {', '.join(missing)} "
            f"(a fresh clone has them under fixtures/mini/; `{remake}` makes new ones)"
        )
    return {name: file_sha256(folder / name) for name in names}


def weight_digests(folder: Path | None = None) -> dict[str, str]:
    return _file_digests(folder or weights_dir(), WEIGHT_FILES, "the mini's trained weights are", "b70lab mini train")


def _lists_as_tuples(fields: dict[str, Any]) -> dict[str, Any]:
    """recipe.json's lists back to the recipes' tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}


def trained_recipe(folder: Path | None = None) -> MiniRecipe:
    """The architecture the committed weights were trained with (recipe.json)."""
    folder = folder or weights_dir()
    try:
        arch = json.loads((folder / "recipe.json").read_text())["architecture"]
        return MiniRecipe(
            vocab_size=arch["vocab_size"],
            target=TargetRecipe(**_lists_as_tuples(arch["target"])),
            draft=DraftRecipe(**_lists_as_tuples(arch["draft"])),
            k_scale_headroom=arch.get("k_scale_headroom", math.sqrt(2.0)),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MiniModelError(f"{folder / 'recipe.json'} does not describe the mini's architecture ({e})") from e


def recipe_digest(
    recipe: MiniRecipe | None = None, versions: dict[str, str] | None = None, weights: dict[str, str] | None = None
) -> str:
    """Identity of a build: the trained weights, the recipe, the builder and the libraries whose numerics
    shape the bytes."""
    payload = {
        "recipe": asdict(recipe or trained_recipe()),
        "builder": BUILDER_VERSION,
        "versions": versions if versions is not None else library_versions(),
        "weights": weights if weights is not None else weight_digests(),
    }
    return sha256_canonical(payload)


def engine_attention_layer(index: int) -> str:
    """The name vLLM gives layer `index`'s attention module (draft layers continue the numbering)."""
    return f"model.layers.{index}.self_attn.attn"


def default_cache_root() -> Path:
    if os.environ.get("B70LAB_CACHE_DIR"):
        return Path(os.environ["B70LAB_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "b70lab"


# --- building blocks ---------------------------------------------------------------------------------


def load_target_model(folder: Path, recipe: MiniRecipe, tok):
    """The trained target in fp32 (its bf16 weights upcast: the fp32 engine holds the same values)."""
    import torch
    from safetensors.torch import load_file
    from transformers import LagunaForCausalLM

    model = LagunaForCausalLM(target_config(recipe, tok))
    state = {k: v.to(torch.float32) for k, v in load_file(str(folder / "target.safetensors")).items()}
    problems = model.load_state_dict(state, strict=False)
    if problems.missing_keys or problems.unexpected_keys:
        raise MiniModelError(
            f"{folder / 'target.safetensors'} does not fit the recipe's target: missing "
            f"{problems.missing_keys[:5]}, unexpected {problems.unexpected_keys[:5]}"
        )
    return model.eval()


def calibrate_kv_scales(model, tok, recipe: MiniRecipe) -> dict[int, tuple[float, float]]:
    """Per-layer static scales from the absolute maxima of K (after k_norm) and V over calibration text,
    rounded to bf16 as they are stored."""
    import torch

    amax = {i: [0.0, 0.0] for i in range(recipe.num_layers)}

    def tracker(i: int, slot: int):
        def hook(_module, _inputs, output):
            amax[i][slot] = max(amax[i][slot], float(output.detach().abs().max()))

        return hook

    handles = []
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.self_attn.k_norm.register_forward_hook(tracker(i, 0)))
        handles.append(layer.self_attn.v_proj.register_forward_hook(tracker(i, 1)))
    try:
        with torch.no_grad():
            for text in calibration_texts():
                model(**tok(text, return_tensors="pt"))
    finally:
        for h in handles:
            h.remove()

    def stored(x: float) -> float:
        return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())

    return {
        i: (stored(k * recipe.k_scale_headroom / FP8_E4M3_MAX), stored(v / FP8_E4M3_MAX)) for i, (k, v) in amax.items()
    }


KV_CACHE_SCHEME = {
    "num_bits": 8,
    "type": "float",
    "strategy": "tensor",
    "dynamic": False,
    "symmetric": True,
    "group_size": None,
    "block_structure": None,
    "actorder": None,
    "observer": "minmax",
    "observer_kwargs": {},
}


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _save_safetensors(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})


def write_target(reference_dir: Path, target_dir: Path, tok, scales: dict[int, tuple[float, float]]) -> None:
    import torch
    from safetensors.torch import load_file

    target_dir.mkdir(parents=True)
    tensors = load_file(str(reference_dir / "model.safetensors"))
    for i, (k, v) in scales.items():
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor([k], dtype=torch.bfloat16)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([v], dtype=torch.bfloat16)
    _save_safetensors(tensors, target_dir / "model.safetensors")
    config = json.loads((reference_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "quantization_status": "compressed",
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": KV_CACHE_SCHEME,
        "global_compression_ratio": None,
    }
    _write_json(target_dir / "config.json", config)
    for extra in ("generation_config.json",):
        if (reference_dir / extra).exists():
            shutil.copy(reference_dir / extra, target_dir / extra)
    tok.save_pretrained(str(target_dir))


def write_draft(recipe: MiniRecipe, weights: Path, draft_dir: Path, tok, file: str = DRAFT_WEIGHTS) -> None:
    """The distilled draft (`file` in `weights`) as vLLM's DFlashLagunaForCausalLM loads it: no `model.` prefix,
    pre-fused qkv_proj, embedding and lm_head shared from the target (not stored). The names and shapes are
    checked against the training-side draft, which the parity test holds to vLLM's."""
    import torch

    from .draft_model import DFlashDraft

    draft_cfg = draft_config(recipe, tok)
    hidden = draft_cfg["hidden_size"]
    shell = DFlashDraft(
        draft_cfg, torch.zeros(draft_cfg["vocab_size"], hidden), torch.zeros(draft_cfg["vocab_size"], hidden)
    )
    try:
        shell.load_state_dict_from_safetensors(weights / file)
    except (OSError, ValueError) as e:
        raise MiniModelError(f"the committed draft {weights / file} does not fit the recipe: {e}") from e
    draft_dir.mkdir(parents=True)
    _write_json(draft_dir / "config.json", draft_cfg)
    tok.save_pretrained(str(draft_dir))
    shutil.copyfile(weights / file, draft_dir / "model.safetensors")


def tensor_digests(path: Path, shards: bool = False) -> dict[str, dict[str, Any]]:
    """sha256 of every tensor's bytes, with dtype and shape, the digests of its float32 and bfloat16 casts
    (an engine may hold a bf16 checkpoint tensor in fp32), and its float64 moments (sum, sum of squares),
    which a load audit can compare through sharding, fusion and kernel repacking; with `shards`, those of its
    equal tensor-parallel shards too (checkpoint.shard_moments), which let the audit name the rank that differs
    (the INT4 build; the plain build's manifest keeps the form its recorded runs were judged against)."""
    import torch
    from safetensors import safe_open

    from ..digests import moments  # the same definition the engine side reports
    from ..evidence.checkpoint import ROUTED_EXPERT, shard_moments

    def sha(t) -> str:
        return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            entry: dict[str, Any] = {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "sha256": sha(t),
            }
            if t.is_floating_point():
                entry["sha256_as"] = {"float32": sha(t.to(torch.float32)), "bfloat16": sha(t.to(torch.bfloat16))}
            if t.is_floating_point() or t.dtype == torch.int32:  # INT4 builds: packed words and weight_shape
                entry["moments"] = moments(t)
                if shards and not ROUTED_EXPERT.search(name) and (parts := shard_moments(t)):
                    entry["shards"] = parts
            out[name] = entry
    return out


def _files_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): file_sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def _build_into(
    out: Path, recipe: MiniRecipe, key: str, versions: dict[str, str], weights: Path, weight_files: dict[str, str]
) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions in one fixed order: the calibrated scales are the same everywhere
    try:
        tok = load_tokenizer(weights, recipe)
        model = load_target_model(weights, recipe, tok)
        scales = calibrate_kv_scales(model, tok, recipe)
        reference_dir = out / "reference"
        model.to(torch.bfloat16).save_pretrained(str(reference_dir), safe_serialization=True)
        tok.save_pretrained(str(reference_dir))
        write_target(reference_dir, out / "target", tok, scales)
        write_draft(recipe, weights, out / "draft", tok)
    finally:
        torch.set_num_threads(threads)
    training = json.loads((weights / "recipe.json").read_text())

    named_scales = {engine_attention_layer(i): s for i, s in scales.items()}
    n = recipe.num_layers
    files = _files_digest(out)
    manifest = {
        "format": 1,
        "recipe": asdict(recipe),
        "recipe_digest": key,
        "builder_version": BUILDER_VERSION,
        "versions": versions,
        "weights": {
            "files": weight_files,
            "corpus_digest": training.get("corpus_digest"),
            "trained_with": training.get("versions"),
        },
        "files": files,
        "model_digest": sha256_canonical(files),
        "target": {
            "path": "target",
            "num_layers": n,
            "kv_scales": {name: {"k_scale": k, "v_scale": v} for name, (k, v) in sorted(named_scales.items())},
            "kv_scale_count": 2 * n,
            "kv_scale_digest": kv_scale_digest(named_scales),
            "tensors": tensor_digests(out / "target" / "model.safetensors"),
        },
        "draft": {
            "path": "draft",
            "cache_layers": [engine_attention_layer(n + i) for i in range(recipe.draft.layers)],
            "kv_calibrated": False,
            "num_speculative_tokens": recipe.draft.block_size - 1,
            "tensors": tensor_digests(out / "draft" / "model.safetensors"),
        },
        "reference": {"path": "reference"},
    }
    _write_json(out / MANIFEST, manifest)


def load_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise MiniModelError(f"{folder} is not a mini model folder: no {MANIFEST} (build one with `b70lab mini build`)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MiniModelError(f"{path} is corrupted ({e}); rebuild with `b70lab mini build --force`") from e
    if not isinstance(manifest, dict) or manifest.get("format") != 1 or "files" not in manifest:
        raise MiniModelError(f"{path} is not a format-1 mini manifest; rebuild with `b70lab mini build --force`")
    return manifest


def verify(folder: Path) -> dict[str, Any]:
    """The manifest, after checking that every file it lists is present with its recorded sha256."""
    folder = Path(folder)
    manifest = load_manifest(folder)
    problems = []
    for rel, expected in sorted(manifest["files"].items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"missing {rel}")
        elif (seen := file_sha256(path)) != expected:
            problems.append(f"{rel}: sha256 {seen[:12]}..., manifest says {expected[:12]}...")
    if problems:
        raise MiniModelError(
            f"mini model at {folder} does not match its manifest: "
            + "; ".join(problems)
            + ". Rebuild with `b70lab mini build --force`."
        )
    return manifest


def folder_for(root: Path | str | None = None, recipe: MiniRecipe | None = None) -> Path:
    """Where `build` puts (or finds) the model for these weights, this recipe and these library versions."""
    root = (Path(root) if root is not None else default_cache_root() / "mini").resolve()
    return root / f"mini-laguna-{recipe_digest(recipe)[:16]}"


def build(root: Path | str | None = None, *, force: bool = False, recipe: MiniRecipe | None = None) -> Path:
    """Build (or reuse) the served mini from the trained weights under `root` and return its folder."""
    weights = weights_dir()
    weight_files = weight_digests(weights)
    recipe = recipe or trained_recipe(weights)
    versions = library_versions()
    key = recipe_digest(recipe, versions, weight_files)
    out = folder_for(root, recipe)
    out.parent.mkdir(parents=True, exist_ok=True)
    return _built_once(out, force, lambda staging: _build_into(staging, recipe, key, versions, weights, weight_files))


def _built_once(out: Path, force: bool, make: Callable[[Path], None]) -> Path:
    """`out` as `make` writes it into a staging folder beside it, renamed into place; a verified `out` is reused
    unless `force`. One builder at a time (a lock beside it), so parallel sessions build once."""
    from filelock import FileLock

    root = out.parent
    with FileLock(str(root / f".{out.name}.lock")):
        if out.exists() and not force:
            verify(out)
            return out
        staging = root / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            make(staging)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


# --- the INT4 build -----------------------------------------------------------------------------------

# 2: the manifest's tensor moments taken on one thread (identical whatever the thread count); 3: the draft is
# the one distilled against the INT4 target (draft-int4.safetensors), not the unquantized build's
INT4_BUILDER_VERSION = 3
INT4_PREFIX = "mini-laguna-int4-"
# vLLM splits these layers' input dimension over the tensor-parallel ranks (RowParallelLinear), and each rank
# needs whole INT4 groups. The routed experts are not among them: the INT4 mini is served with expert
# parallelism, which keeps every expert whole on one rank.
ROW_PARALLEL = ("o_proj", "down_proj")
INT4_MAX_TENSOR_PARALLEL = 4  # the widest tensor-parallel layout the mini's contracts use


# The draft's attention projections stay in float: vLLM 0.32's Laguna DFlash precomputes the context K/V from
# `qkv_proj.weight` while it loads (laguna_dflash._build_context_kv_buffers), which a quantized layer does not
# have ("'QKVParallelLinear' object has no attribute 'weight'"; notes/2026-12-04-int4-mini-and-the-portable-path.md).
DRAFT_IGNORE = ("re:.*self_attn\\.qkv_proj$",)


def _int4_scheme(tensors: dict, ignore: tuple[str, ...]) -> Any:
    import dataclasses

    from ..evidence.checkpoint import ROUTED_EXPERT
    from . import int4

    row_parallel = {name: t for name, t in tensors.items() if not ROUTED_EXPERT.search(name)}
    scheme = int4.scheme_for(row_parallel, ROW_PARALLEL, INT4_MAX_TENSOR_PARALLEL)
    return dataclasses.replace(scheme, ignore=(*scheme.ignore, *ignore))


def _write_int4_part(
    source: Path, dest: Path, kv_cache_scheme: dict[str, Any] | None, ignore: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One checkpoint folder (target or draft) with its linears quantized; returns what was quantized how."""
    from safetensors.torch import load_file

    from . import int4

    tensors = load_file(str(source / "model.safetensors"))
    scheme = _int4_scheme(tensors, ignore)
    packed, layers = int4.quantize_state(tensors, scheme)
    dest.mkdir(parents=True)
    _save_safetensors(packed, dest / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = int4.quantization_config(scheme, kv_cache_scheme)
    _write_json(dest / "config.json", config)
    for path in sorted(source.iterdir()):  # tokenizer and generation config, as the source has them
        if path.is_file() and path.name not in ("config.json", "model.safetensors"):
            shutil.copyfile(path, dest / path.name)
    return {
        "format": "pack-quantized",
        "num_bits": int4.NUM_BITS,
        "symmetric": True,
        "group_size": scheme.group_size,
        "group_size_overrides": dict(sorted(scheme.overrides.items())),
        "ignore": list(scheme.ignore),
        "quantized_layers": len(layers),
    }


def int4_draft_digests(weights: Path | None = None) -> dict[str, str]:
    """The INT4 lane's own draft: its weights and the record of what it was distilled against."""
    return _file_digests(
        weights or weights_dir(),
        INT4_DRAFT_FILES,
        "the INT4 lane's draft is",
        "b70lab mini train draft --against-int4",
    )


def int4_distilled_against(weights: Path | None = None) -> str:
    """What the INT4 lane's draft was distilled against, as its training record says."""
    path = (weights or weights_dir()) / DRAFT_INT4_RECIPE
    try:
        return str(json.loads(path.read_text())["history"][-1]["target"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise MiniModelError(f"{path} does not say what the INT4 draft was distilled against ({e})") from e


def int4_key(
    source_manifest: dict[str, Any], versions: dict[str, str] | None = None, draft: dict[str, str] | None = None
) -> str:
    import compressed_tensors

    return sha256_canonical(
        {
            "quantized_from": source_manifest["model_digest"],
            "builder": INT4_BUILDER_VERSION,
            "versions": versions if versions is not None else library_versions(),
            "compressed_tensors": compressed_tensors.__version__,
            "draft": draft if draft is not None else int4_draft_digests(),
        }
    )


def _build_int4_into(out: Path, source: Path, source_manifest: dict[str, Any], key: str) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tensor moments too: a parallel float64 sum differs in its last bits by threads
    try:
        target_scheme = _write_int4_part(source / "target", out / "target", KV_CACHE_SCHEME)
        weights = weights_dir()
        recipe = trained_recipe(weights)
        own_draft = out.parent / f"{out.name}.draft-float"  # the INT4 lane's draft, served unquantized first
        shutil.rmtree(own_draft, ignore_errors=True)
        try:
            write_draft(recipe, weights, own_draft, load_tokenizer(weights, recipe), DRAFT_INT4_WEIGHTS)
            draft_scheme = _write_int4_part(own_draft, out / "draft", None, DRAFT_IGNORE)
        finally:
            shutil.rmtree(own_draft, ignore_errors=True)
        tensors = {part: tensor_digests(out / part / "model.safetensors", shards=True) for part in ("target", "draft")}
    finally:
        torch.set_num_threads(threads)
    files = _files_digest(out)
    target, draft = source_manifest["target"], source_manifest["draft"]
    manifest = {
        "format": 1,
        "recipe": source_manifest["recipe"],
        "recipe_digest": key,
        "builder_version": INT4_BUILDER_VERSION,
        "versions": source_manifest["versions"],
        "weights": source_manifest["weights"],
        "quantized_from": {
            "folder": source.name,
            "model_digest": source_manifest["model_digest"],
            "recipe_digest": source_manifest["recipe_digest"],
        },
        "files": files,
        "model_digest": sha256_canonical(files),
        "target": {
            **{k: target[k] for k in ("path", "num_layers", "kv_scales", "kv_scale_count", "kv_scale_digest")},
            "int4": target_scheme,
            "tensors": tensors["target"],
        },
        "draft": {
            **{k: draft[k] for k in ("path", "cache_layers", "kv_calibrated", "num_speculative_tokens")},
            "weights": int4_draft_digests(weights),
            "distilled_against": int4_distilled_against(weights),
            "int4": draft_scheme,
            "tensors": tensors["draft"],
        },
    }
    _write_json(out / MANIFEST, manifest)


def build_int4(root: Path | str | None = None, *, force: bool = False, recipe: MiniRecipe | None = None) -> Path:
    """Build (or reuse) the W4A16 mini: the unquantized build's target, and the draft distilled against that
    target's INT4 form (draft-int4.safetensors), with every linear but the lm_head and the router in
    compressed-tensors pack-quantized INT4 (mini/int4.py); the same KV scales."""
    source = build(root, force=force, recipe=recipe)
    source_manifest = verify(source)
    key = int4_key(source_manifest)
    out = source.parent / f"{INT4_PREFIX}{key[:16]}"
    return _built_once(out, force, lambda staging: _build_int4_into(staging, source, source_manifest, key))


EXPORT_MARK = ".b70lab-export.json"
EXPORTED_PARTS = ("target", "draft")


def _is_export_of(out_dir: Path, mark: dict[str, Any]) -> bool:
    """`out_dir` already holds exactly these files with these contents."""
    try:
        if json.loads((out_dir / EXPORT_MARK).read_text()) != mark:
            return False
    except (OSError, ValueError):
        return False
    present = {
        p.relative_to(out_dir).as_posix()
        for part in EXPORTED_PARTS
        if (out_dir / part).is_dir()
        for p in (out_dir / part).rglob("*")
        if p.is_file()
    }
    return present == set(mark["files"]) and all(
        file_sha256(out_dir / rel) == sha for rel, sha in mark["files"].items()
    )


def export_plain(mini_folder: Path, out_dir: Path) -> Path:
    """Plain copies of the mini's target and draft (config, tokenizer, weights; no manifest) in out_dir/target
    and out_dir/draft: the mini as any local checkpoint folder looks, so that models given as folders run
    with known answers. Idempotent; the new export is staged beside out_dir and renamed into place, so
    out_dir never holds half of one. Only a new, empty or previously exported out_dir is written."""
    from filelock import FileLock

    manifest = verify(Path(mini_folder))
    out_dir = Path(out_dir).resolve()
    mark = {
        "recipe_digest": manifest["recipe_digest"],
        "files": {rel: sha for rel, sha in sorted(manifest["files"].items()) if rel.split("/", 1)[0] in EXPORTED_PARTS},
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f".{out_dir.name}.lock")):
        if _is_export_of(out_dir, mark):
            return out_dir
        if out_dir.exists() and (
            not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / EXPORT_MARK).is_file())
        ):
            raise MiniModelError(f"{out_dir} exists and is not a b70lab mini export; export into a new or empty folder")
        staging = out_dir.parent / f".{out_dir.name}.exporting-{os.getpid()}"
        previous = out_dir.parent / f".{out_dir.name}.previous-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for rel in mark["files"]:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(mini_folder) / rel, staging / rel)
            _write_json(staging / EXPORT_MARK, mark)
            if out_dir.exists() and any(out_dir.iterdir()):
                os.replace(out_dir, previous)
            os.replace(staging, out_dir)  # onto a missing or empty folder
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(previous, ignore_errors=True)
    return out_dir
