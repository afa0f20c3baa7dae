"""The embedded default model: a tiny Laguna target and Laguna-DFlash draft, generated offline.

No weights can be downloaded where the gates run in CI, so the project builds its own: a byte-level BPE
tokenizer, a seeded Laguna (dense + sigmoid-routed MoE layers with a correction bias, gated attention),
FP8 KV scales from a real calibration pass stored the way compressed-tensors checkpoints carry them, and a
DFlash draft without KV calibration. Every tensor comes from a generator seeded by (seed, tensor name), so
the result does not depend on module construction order, and a build is byte-identical to the last one.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# kv_scale_digest and file_sha256 moved to digests; re-exported for the modules that still import them from here.
from ..digests import file_sha256, kv_scale_digest, sha256_canonical

BUILDER_VERSION = 3
FP8_E4M3_MAX = 448.0
MANIFEST = "manifest.json"
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<unk>", "<|mask|>")


class MiniModelError(RuntimeError):
    """A mini model folder is missing, incomplete or not what its manifest says."""


@dataclass(frozen=True)
class TargetRecipe:
    hidden_size: int = 256
    intermediate_size: int = 512
    heads_per_layer: tuple[int, ...] = (8, 16, 16, 8)
    num_key_value_heads: int = 4
    head_dim: int = 64  # the CPU FP8 attention path needs head_dim % 32 == 0
    mlp_layer_types: tuple[str, ...] = ("dense", "sparse", "sparse", "sparse")
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    max_position_embeddings: int = 4096
    init_std: float = 0.1
    # Large enough that a bias left at zero changes which experts are chosen (and so the output).
    router_bias_std: float = 0.3
    seed: int = 1234


@dataclass(frozen=True)
class DraftRecipe:
    layers: int = 2
    heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 512
    target_layer_ids: tuple[int, ...] = (1, 3)
    block_size: int = 12  # DFlash verification width: num_speculative_tokens = block_size - 1
    init_std: float = 0.1
    seed: int = 4321


@dataclass(frozen=True)
class MiniRecipe:
    vocab_size: int = 512
    target: TargetRecipe = field(default_factory=TargetRecipe)
    draft: DraftRecipe = field(default_factory=DraftRecipe)
    # K is stored after RoPE, which rotates pairs: |k_rot| <= sqrt(2) * amax(k before RoPE).
    k_scale_headroom: float = math.sqrt(2.0)

    @property
    def num_layers(self) -> int:
        return len(self.target.heads_per_layer)


TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
for i in range(10):
    print(i, fibonacci(i))
import json
class Model(object):
    def __init__(self, layers=4, hidden=256):
        self.layers = layers
        self.hidden = hidden
{"name": "laguna", "layers": 4, "experts": [1, 2, 3], "ok": true}
Hello world! This is a tiny corpus used to train a byte level BPE tokenizer for testing.
The deployment runs a mixture of experts model with an FP8 key value cache and speculative decoding.
Promotion gates check that the engine loads the calibrated scales and produces identical tokens.
"""

CALIBRATION_TEXTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "The quick brown fox jumps over the lazy dog.",
    "Promotion gates check that the engine loads the calibrated scales.",
    "for i in range(10):\n    print(i)",
    '{"name": "laguna", "experts": [1, 2, 3]}',
)


def library_versions() -> dict[str, str]:
    import safetensors
    import tokenizers
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}


def recipe_digest(recipe: MiniRecipe, versions: dict[str, str] | None = None) -> str:
    """Identity of a build: the recipe, the builder and the libraries whose numerics shape the bytes."""
    payload = {"recipe": asdict(recipe), "builder": BUILDER_VERSION,
               "versions": versions if versions is not None else library_versions()}
    return sha256_canonical(payload)


def engine_attention_layer(index: int) -> str:
    """The name vLLM gives layer `index`'s attention module (draft layers continue the numbering)."""
    return f"model.layers.{index}.self_attn.attn"


def default_cache_root() -> Path:
    if os.environ.get("B70LAB_CACHE_DIR"):
        return Path(os.environ["B70LAB_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "b70lab"


# --- building blocks ---------------------------------------------------------------------------------

def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _normal(shape, std: float, seed: int, name: str, mean: float = 0.0):
    import torch

    return mean + std * torch.randn(*shape, generator=_generator(seed, name), dtype=torch.float32)


def build_tokenizer(recipe: MiniRecipe):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, min_frequency=1,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAINING_TEXT] * 20, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<|mask|>",
                                   model_max_length=recipe.target.max_position_embeddings)


def target_config(recipe: MiniRecipe, tok):
    from transformers import LagunaConfig

    t = recipe.target
    n = recipe.num_layers
    cfg = LagunaConfig(
        vocab_size=len(tok), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=n, num_attention_heads=t.heads_per_layer[0],
        num_attention_heads_per_layer=list(t.heads_per_layer), num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim, max_position_embeddings=t.max_position_embeddings, num_experts=t.num_experts,
        num_experts_per_tok=t.num_experts_per_tok, moe_intermediate_size=t.moe_intermediate_size,
        shared_expert_intermediate_size=t.shared_expert_intermediate_size,
        mlp_layer_types=list(t.mlp_layer_types), layer_types=["full_attention"] * n, gating=True,
        moe_routed_scaling_factor=1.0, initializer_range=t.init_std, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    cfg.architectures = ["LagunaForCausalLM"]
    return cfg


def build_target_model(recipe: MiniRecipe, tok):
    """A Laguna whose every parameter is drawn from its own named generator."""
    import torch
    from transformers import LagunaForCausalLM

    t = recipe.target
    model = LagunaForCausalLM(target_config(recipe, tok))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                value = _normal(p.shape, t.router_bias_std, t.seed, name)
            elif p.dim() >= 2:
                value = _normal(p.shape, t.init_std, t.seed, name)
            elif name.endswith("norm.weight"):
                value = _normal(p.shape, 0.1, t.seed, name, mean=1.0)
            else:
                raise MiniModelError(f"mini recipe has no rule for parameter {name} {tuple(p.shape)}")
            p.copy_(value)
        # Spread the K/V ranges so that every layer calibrates to its own scales.
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.k_norm.weight.mul_(0.6 + 0.4 * i)
            layer.self_attn.v_proj.weight.mul_(1.6 - 0.3 * i)
    # Weights are stored in bf16: the fp32 engine and the fp32 reference both upcast the same values.
    return model.to(torch.bfloat16).to(torch.float32).eval()


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
            for text in CALIBRATION_TEXTS:
                model(**tok(text, return_tensors="pt"))
    finally:
        for h in handles:
            h.remove()

    def stored(x: float) -> float:
        return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())

    return {i: (stored(k * recipe.k_scale_headroom / FP8_E4M3_MAX), stored(v / FP8_E4M3_MAX))
            for i, (k, v) in amax.items()}


KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True,
                   "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                   "observer_kwargs": {}}


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
        "quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
        "config_groups": {}, "ignore": [], "kv_cache_scheme": KV_CACHE_SCHEME,
        "global_compression_ratio": None,
    }
    _write_json(target_dir / "config.json", config)
    for extra in ("generation_config.json",):
        if (reference_dir / extra).exists():
            shutil.copy(reference_dir / extra, target_dir / extra)
    tok.save_pretrained(str(target_dir))


def write_draft(recipe: MiniRecipe, target_dir: Path, draft_dir: Path, tok) -> None:
    """DFlash draft as vLLM's DFlashLagunaForCausalLM loads it: no `model.` prefix, pre-fused qkv_proj,
    embedding and lm_head shared from the target (not stored)."""
    import torch

    d = recipe.draft
    tcfg = json.loads((target_dir / "config.json").read_text())
    hidden = tcfg["hidden_size"]
    draft_cfg = target_config(recipe, tok).to_dict()
    draft_cfg.update(
        architectures=["DFlashLagunaForCausalLM"], num_hidden_layers=d.layers, num_attention_heads=d.heads,
        num_attention_heads_per_layer=[d.heads] * d.layers, num_key_value_heads=d.num_key_value_heads,
        head_dim=d.head_dim, intermediate_size=d.intermediate_size, mlp_layer_types=["dense"] * d.layers,
        layer_types=["full_attention"] * d.layers, draft_vocab_size=tcfg["vocab_size"], block_size=d.block_size,
        dflash_config={"target_layer_ids": list(d.target_layer_ids), "mask_token_id": tok.mask_token_id},
        rope_parameters=tcfg["rope_parameters"],
    )
    draft_cfg.pop("quantization_config", None)
    draft_dir.mkdir(parents=True)
    _write_json(draft_dir / "config.json", draft_cfg)
    tok.save_pretrained(str(draft_dir))

    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(d.layers):
        p = f"layers.{i}."
        shapes[p + "self_attn.qkv_proj.weight"] = ((d.heads + 2 * d.num_key_value_heads) * d.head_dim, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, d.heads * d.head_dim)
        shapes[p + "self_attn.g_proj.weight"] = (d.heads, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (d.intermediate_size, hidden)
        shapes[p + "mlp.up_proj.weight"] = (d.intermediate_size, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, d.intermediate_size)
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            shapes[p + norm + ".weight"] = (d.head_dim,)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[p + norm + ".weight"] = (hidden,)
    shapes["fc.weight"] = (hidden, hidden * len(d.target_layer_ids))
    for j in range(len(d.target_layer_ids)):
        shapes[f"aux_hidden_norms.{j}.weight"] = (hidden,)
    shapes["hidden_norm.weight"] = (hidden,)
    shapes["norm.weight"] = (hidden,)
    tensors = {
        name: (_normal(shape, 0.1, d.seed, name, mean=1.0) if len(shape) == 1
               else _normal(shape, d.init_std, d.seed, name)).to(torch.bfloat16)
        for name, shape in shapes.items()
    }
    _save_safetensors(tensors, draft_dir / "model.safetensors")


def tensor_digests(path: Path) -> dict[str, dict[str, Any]]:
    """sha256 of every tensor's bytes, with dtype and shape, the digests of its float32 and bfloat16 casts
    (an engine may hold a bf16 checkpoint tensor in fp32), and its float64 moments (sum, sum of squares),
    which a load audit can compare through sharding, fusion and kernel repacking."""
    import torch
    from safetensors import safe_open

    from ..digests import moments  # the same definition the engine side reports

    def sha(t) -> str:
        return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            entry: dict[str, Any] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                     "sha256": sha(t)}
            if t.is_floating_point():
                entry["sha256_as"] = {"float32": sha(t.to(torch.float32)), "bfloat16": sha(t.to(torch.bfloat16))}
                entry["moments"] = moments(t)
            out[name] = entry
    return out


def _files_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): file_sha256(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


def _build_into(out: Path, recipe: MiniRecipe, key: str, versions: dict[str, str]) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions in one fixed order: the calibrated scales are the same everywhere
    try:
        tok = build_tokenizer(recipe)
        model = build_target_model(recipe, tok)
        scales = calibrate_kv_scales(model, tok, recipe)
        reference_dir = out / "reference"
        model.to(torch.bfloat16).save_pretrained(str(reference_dir), safe_serialization=True)
        tok.save_pretrained(str(reference_dir))
        write_target(reference_dir, out / "target", tok, scales)
        write_draft(recipe, out / "target", out / "draft", tok)
    finally:
        torch.set_num_threads(threads)

    named_scales = {engine_attention_layer(i): s for i, s in scales.items()}
    n = recipe.num_layers
    files = _files_digest(out)
    manifest = {
        "format": 1,
        "recipe": asdict(recipe),
        "recipe_digest": key,
        "builder_version": BUILDER_VERSION,
        "versions": versions,
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
        raise MiniModelError(f"{folder} is not a mini model folder: no {MANIFEST} "
                             f"(build one with `b70lab mini build`)")
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
        raise MiniModelError(f"mini model at {folder} does not match its manifest: " + "; ".join(problems)
                             + ". Rebuild with `b70lab mini build --force`.")
    return manifest


def folder_for(root: Path | str | None = None, recipe: MiniRecipe | None = None) -> Path:
    """Where `build` puts (or finds) the model for this recipe and these library versions."""
    root = (Path(root) if root is not None else default_cache_root() / "mini").resolve()
    return root / f"mini-laguna-{recipe_digest(recipe or MiniRecipe())[:16]}"


def build(root: Path | str | None = None, *, force: bool = False, recipe: MiniRecipe | None = None) -> Path:
    """Build (or reuse) the mini model under `root` and return its folder."""
    from filelock import FileLock

    recipe = recipe or MiniRecipe()
    versions = library_versions()
    key = recipe_digest(recipe, versions)
    out = folder_for(root, recipe)
    root = out.parent
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{out.name}.lock")):
        if out.exists() and not force:
            verify(out)
            return out
        staging = root / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            _build_into(staging, recipe, key, versions)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


EXPORT_MARK = ".b70lab-export.json"
EXPORTED_PARTS = ("target", "draft")


def _is_export_of(out_dir: Path, mark: dict[str, Any]) -> bool:
    """`out_dir` already holds exactly these files with these contents."""
    try:
        if json.loads((out_dir / EXPORT_MARK).read_text()) != mark:
            return False
    except (OSError, ValueError):
        return False
    present = {p.relative_to(out_dir).as_posix() for part in EXPORTED_PARTS if (out_dir / part).is_dir()
               for p in (out_dir / part).rglob("*") if p.is_file()}
    return present == set(mark["files"]) and all(file_sha256(out_dir / rel) == sha
                                                 for rel, sha in mark["files"].items())


def export_plain(mini_folder: Path, out_dir: Path) -> Path:
    """Plain copies of the mini's target and draft (config, tokenizer, weights; no manifest) in out_dir/target
    and out_dir/draft: the mini as any local checkpoint folder looks, so that models given as folders run
    with known answers. Idempotent; the new export is staged beside out_dir and renamed into place, so
    out_dir never holds half of one. Only a new, empty or previously exported out_dir is written."""
    from filelock import FileLock

    manifest = verify(Path(mini_folder))
    out_dir = Path(out_dir).resolve()
    mark = {"recipe_digest": manifest["recipe_digest"],
            "files": {rel: sha for rel, sha in sorted(manifest["files"].items())
                      if rel.split("/", 1)[0] in EXPORTED_PARTS}}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f".{out_dir.name}.lock")):
        if _is_export_of(out_dir, mark):
            return out_dir
        if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir())
                                                          and not (out_dir / EXPORT_MARK).is_file())):
            raise MiniModelError(f"{out_dir} exists and is not a b70lab mini export; export into a new or "
                                 f"empty folder")
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
