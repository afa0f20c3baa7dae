"""The INT4 target as the trainer sees it: the trained target with every linear the W4A16 build quantizes
replaced by what its packed codes stand for, in transformers' naming.

A draft distilled for the INT4 lane must learn what the INT4 target does (its greedy continuations and its
hidden states), not what the unquantized target does: past EOS the two continue differently, and a draft
distilled against the unquantized target was accepted 0.89 tokens per draft by the INT4 target in vLLM
(notes/2026-12-04-int4-mini-and-the-portable-path.md). The numbers come from the build's own scheme and quantizer
(`mini/int4.py`), and a unit test holds them to the packed build as compressed-tensors unpacks it, so the trainer
and vLLM's portable INT4 path hold the same weights. The result is written in fp32: code x bf16 scale needs up to 11
significant bits, more than bf16 holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .recipe import MiniRecipe


def quantized_served_target(served_target: Path) -> dict[str, torch.Tensor]:
    """The served target's weights that the INT4 build quantizes, as their codes stand for them: served name ->
    weight (fp32). The same scheme (`build._int4_scheme`) and the same codes (`int4.fake_quantize` shares
    `int4.quantize`'s arithmetic); only the packing is skipped."""
    from safetensors.torch import load_file

    from . import int4
    from .build import _int4_scheme

    tensors = load_file(str(served_target / "model.safetensors"))
    scheme = _int4_scheme(tensors, ())
    return {
        name: int4.fake_quantize(tensor, scheme.group_for(name.removesuffix(".weight")), tensor.dtype)
        for name, tensor in sorted(tensors.items())
        if int4.quantized_linear(name, tensor, scheme)
    }


def _trainer_slot(state: dict[str, torch.Tensor], served: str) -> torch.Tensor:
    """Where transformers' LagunaForCausalLM keeps one served linear weight (a view into `state`): the served
    checkpoint names experts one by one, transformers stacks them per layer (gate_up_proj [E, 2I, H], gate rows
    first; down_proj [E, H, I]) and calls the shared expert `shared_experts`."""
    layer = served.removesuffix(".weight")
    stem, _, rest = layer.partition(".experts.")
    if not rest:
        name = served if served in state else served.replace(".shared_expert.", ".shared_experts.")
        if name not in state:
            raise KeyError(f"{served}: no such weight in the trainer's target")
        return state[name]
    expert, proj = rest.split(".")
    e = int(expert)
    if proj == "down_proj":
        return state[f"{stem}.experts.down_proj"][e]
    stacked = state[f"{stem}.experts.gate_up_proj"]
    half = stacked.shape[1] // 2
    return stacked[e, :half] if proj == "gate_proj" else stacked[e, half:]


def int4_target_state(weights: Path, served_target: Path, recipe: MiniRecipe, tok) -> dict[str, torch.Tensor]:
    """The trained target's state dict (fp32, transformers' names) with the INT4 build's weights in place of
    the quantized ones. Each replaced weight is first checked to be the plain build's: a layout the mapping
    gets wrong fails here, not as a quietly different model."""
    import torch
    from safetensors.torch import load_file

    from .build import MiniModelError, load_target_model

    state = {k: v.clone() for k, v in load_target_model(weights, recipe, tok).state_dict().items()}
    plain = load_file(str(served_target / "model.safetensors"))
    for served, weight in sorted(quantized_served_target(served_target).items()):
        slot = _trainer_slot(state, served)
        if not torch.equal(slot, plain[served].float()):
            raise MiniModelError(f"{served}: the trainer keeps another tensor where this weight was expected")
        slot.copy_(weight)
    return state


def write_int4_target(out: Path) -> Path:
    """out: the INT4 target's weights for `b70lab mini train draft --against-int4 out` (safetensors, fp32)."""
    from safetensors.torch import save_file

    from .build import build, trained_recipe, weights_dir
    from .tokenizer import load_tokenizer

    recipe = trained_recipe()
    tok = load_tokenizer(weights_dir(), recipe)
    state = int4_target_state(weights_dir(), build() / "target", recipe, tok)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sorted(state.items())}, str(out), metadata={"format": "pt"})
    return out
