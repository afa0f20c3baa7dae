"""The mini's tokenizer, loaded one way everywhere (build, training, distillation, the prompt-set scripts)."""

from __future__ import annotations

from pathlib import Path

from . import curriculum
from .recipe import TOKENIZER_FILE, MiniRecipe


def load_tokenizer(folder: Path, recipe: MiniRecipe):
    """The tokenizer of a weights folder (its tokenizer.json) as transformers, and so vLLM, load it, chat
    template included."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / TOKENIZER_FILE),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<|mask|>",
        model_max_length=recipe.target.max_position_embeddings,
    )
    tok.chat_template = curriculum.CHAT_TEMPLATE
    return tok
