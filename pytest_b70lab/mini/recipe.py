"""What the mini is: its architecture (the recipes), the files its trained weights come in, and the two
model configs built from them. A recipe's fields, with BUILDER_VERSION, name the served folder (build.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import LabError

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<unk>", "<|mask|>")
# The trained weights' files (fixtures/mini in the lab's repository, or a training run's folder).
TOKENIZER_FILE = "tokenizer.json"
TARGET_WEIGHTS = "target.safetensors"
DRAFT_WEIGHTS = "draft.safetensors"
# The draft distilled against the INT4 target (mini/int4_reference.py), which the W4A16 build serves.
DRAFT_INT4_WEIGHTS = "draft-int4.safetensors"
DRAFT_INT4_RECIPE = "draft-int4.json"  # its training record: settings, versions, what it was distilled against
INT4_DRAFT_FILES = (DRAFT_INT4_WEIGHTS, DRAFT_INT4_RECIPE)
RECIPE_FILE = "recipe.json"
LOG_FILE = "training-log.jsonl"
WEIGHT_FILES = (TOKENIZER_FILE, TARGET_WEIGHTS, DRAFT_WEIGHTS, RECIPE_FILE)


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
    vocab_size: int = 1024
    target: TargetRecipe = field(default_factory=TargetRecipe)
    draft: DraftRecipe = field(default_factory=DraftRecipe)
    # K is stored after RoPE, which rotates pairs: |k_rot| <= sqrt(2) * amax(k before RoPE).
    k_scale_headroom: float = math.sqrt(2.0)

    @property
    def num_layers(self) -> int:
        return len(self.target.heads_per_layer)


# Letters are never merged (train_tokenizer): the vocabulary is the byte alphabet, the markers, and the
# whitespace and punctuation runs of the curriculum seen at least twice, which this size leaves room for.
TRAINED_RECIPE = MiniRecipe(vocab_size=288)


class EngineLibrariesMissing(LabError, RuntimeError):
    """The mini is named by the versions of the libraries that build it: without them (a plugin installed
    without the engine) it cannot even be found."""


def library_versions() -> dict[str, str]:
    """The installed versions, read from the distributions' metadata: importing torch only to name the mini would
    cost a replay seconds, and a test that replays twice in one process (pytester) would load torch's C library
    twice, which crashes."""
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError as e:
            raise EngineLibrariesMissing(
                f"the embedded default's mini is found by the versions of torch, transformers, tokenizers and "
                f"safetensors, and {name} is not installed in this environment: install the engine (the `cpu` "
                "extra, from the lock: `make setup`, or `pip install --no-deps -r requirements/lock.txt`)"
            ) from e
    return versions


def target_config(recipe: MiniRecipe, tok):
    from transformers import LagunaConfig

    t = recipe.target
    n = recipe.num_layers
    cfg = LagunaConfig(
        vocab_size=len(tok),
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=n,
        num_attention_heads=t.heads_per_layer[0],
        num_attention_heads_per_layer=list(t.heads_per_layer),
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        max_position_embeddings=t.max_position_embeddings,
        num_experts=t.num_experts,
        num_experts_per_tok=t.num_experts_per_tok,
        moe_intermediate_size=t.moe_intermediate_size,
        shared_expert_intermediate_size=t.shared_expert_intermediate_size,
        mlp_layer_types=list(t.mlp_layer_types),
        layer_types=["full_attention"] * n,
        gating=True,
        moe_routed_scaling_factor=1.0,
        initializer_range=t.init_std,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cfg.architectures = ["LagunaForCausalLM"]
    return cfg


def draft_config(recipe: MiniRecipe, tok) -> dict[str, Any]:
    """The DFlash draft's config.json: the target's config with the draft's layers and `dflash_config`."""
    d = recipe.draft
    target = target_config(recipe, tok).to_dict()
    draft_cfg = dict(target)
    draft_cfg.update(
        architectures=["DFlashLagunaForCausalLM"],
        num_hidden_layers=d.layers,
        num_attention_heads=d.heads,
        num_attention_heads_per_layer=[d.heads] * d.layers,
        num_key_value_heads=d.num_key_value_heads,
        head_dim=d.head_dim,
        intermediate_size=d.intermediate_size,
        mlp_layer_types=["dense"] * d.layers,
        layer_types=["full_attention"] * d.layers,
        draft_vocab_size=target["vocab_size"],
        block_size=d.block_size,
        dflash_config={"target_layer_ids": list(d.target_layer_ids), "mask_token_id": tok.mask_token_id},
        rope_parameters=target["rope_parameters"],
    )
    draft_cfg.pop("quantization_config", None)
    return draft_cfg
