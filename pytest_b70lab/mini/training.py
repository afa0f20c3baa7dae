"""What target training and draft distillation share: the target's training settings and its fresh model, the
tokenized samples, the learning-rate schedule, the log, the device, and recipe.json's history. Its own module
so that distil.py needs nothing of train.py (train.py's command runs distil.py, never the other way)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import curriculum
from .recipe import RECIPE_FILE, MiniRecipe, library_versions, target_config

IGNORE = -100


@dataclass(frozen=True)
class TargetTraining:
    steps: int = 6000
    batch: int = 16
    seqlen: int = 2048
    lr: float = 1e-3
    warmup: int = 200
    init_std: float = 0.02
    router_bias_std: float = 0.3  # fixed (never trained): a dropped bias must still change the output
    seed: int = 0
    time_budget_s: float | None = None
    log_every: int = 100

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.seqlen < 64:
            raise ValueError(f"target training needs steps >= 1, batch >= 1, seqlen >= 64 (got {self})")


def encode(tok, sample: curriculum.Sample) -> tuple[list[int], list[int]]:
    """Prompt and completion tokenized apart, as the engine sees them (it tokenizes the prompt alone and
    generates the rest), `<s>` in front unless the prompt carries it; a retrieval context is not a target."""
    prompt = tok(sample.prompt, add_special_tokens=False)["input_ids"]
    if not sample.prompt.startswith(curriculum.BOS):
        prompt = [tok.bos_token_id] + prompt
    completion = tok(sample.completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompt_labels = [IGNORE] * len(prompt) if sample.family == "retrieval" else list(prompt)
    return prompt + completion, prompt_labels + completion


def new_target(recipe: MiniRecipe, tok, cfg: TargetTraining):
    import torch
    from transformers import LagunaForCausalLM

    torch.manual_seed(cfg.seed)
    config = target_config(recipe, tok)
    config.initializer_range = cfg.init_std
    model = LagunaForCausalLM(config)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(cfg.router_bias_std * torch.randn(p.shape, generator=g))
    return model


def schedule(cfg_lr: float, warmup: int, progress: float, step: int) -> float:
    return cfg_lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def optimizer_step(
    loss, module, opt, log: Log, *, phase: str, step: int, lr: float, started: float, log_every: int
) -> None:
    """Backward, clip the gradient norm at 1, step and clear; a `step` record every `log_every` steps."""
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % log_every == 0:
        log(
            event="step",
            phase=phase,
            step=step,
            loss=round(loss.item(), 4),
            lr=round(lr, 6),
            elapsed_s=round(time.monotonic() - started, 1),
        )


class Log:
    """One JSON object a line, echoed to stdout for whoever watches the run."""

    def __init__(self, path: Path | None, echo: Callable[[str], None] | None = print):
        self.path, self.echo = path, echo

    def __call__(self, **record: Any) -> None:  # noqa: D102
        line = json.dumps(record, sort_keys=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")
        if self.echo:
            self.echo(line)


def pick_device(device: str = "auto") -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def write_recipe(out: Path, recipe: MiniRecipe, phase: str, cfg: Any, file: str = RECIPE_FILE, **run: Any) -> None:
    """recipe.json (or `file`): the architecture, each phase's latest settings, and the history of every
    training run into this folder (a continued run adds to it), each with the digest of the corpus it saw."""
    path = out / file
    data = json.loads(path.read_text()) if path.exists() else {}
    digest = curriculum.corpus_digest(cfg.seed)
    data.update(
        architecture=asdict(recipe),
        corpus_version=curriculum.CORPUS_VERSION,
        corpus_digest=digest,
        versions=library_versions(),
    )
    data[phase] = asdict(cfg)
    data.setdefault("history", []).append({"phase": phase, "corpus_digest": digest, **asdict(cfg), **run})
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
