"""Distilling the mini's DFlash draft from the trained target: its own hidden states, its greedy continuations.

The draft learns what the target *does*, not what the corpus says: rollouts are the target's greedy
continuations with EOS ignored (as the gates request them), and each training block is anchored inside a
rollout, where every next token is the target's argmax. That is what vLLM's verification accepts.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..digests import file_sha256
from . import curriculum
from .recipe import (
    DRAFT_INT4_RECIPE,
    DRAFT_INT4_WEIGHTS,
    DRAFT_WEIGHTS,
    LOG_FILE,
    RECIPE_FILE,
    TARGET_WEIGHTS,
    TRAINED_RECIPE,
    MiniRecipe,
    draft_config,
)
from .tokenizer import load_tokenizer
from .training import Log, TargetTraining, encode, new_target, optimizer_step, pick_device, schedule, write_recipe


@dataclass(frozen=True)
class DraftTraining:
    steps: int = 3000
    batch: int = 32
    blocks: int = 16  # anchors per sequence and step
    rollouts: int = 4096
    rollout_tokens: int = 160
    rollout_max_pairs: int = 60  # needle tasks in the rollouts stay short: their answers are a few tokens
    eval_rollouts: int = 64  # held-out rollouts the per-position acceptance is measured on
    lr: float = 1e-3
    warmup: int = 100
    init_std: float = 0.02
    seed: int = 0
    time_budget_s: float | None = None
    log_every: int = 100

    def __post_init__(self) -> None:
        if self.rollout_tokens < 2 * 12 or self.rollouts < self.batch or self.eval_rollouts < 1:
            raise ValueError(
                "draft training needs rollout_tokens >= two blocks (24), rollouts >= batch and "
                f"eval_rollouts >= 1 (got {self})"
            )


def load_target(out: Path, recipe: MiniRecipe, device: str, weights: Path | None = None):
    """The target the draft learns from: out's trained target, or `weights` (the INT4 target's, dequantized:
    mini/int4_reference.py) in its place."""
    import torch
    from safetensors.torch import load_file

    tok = load_tokenizer(out, recipe)
    model = new_target(recipe, tok, TargetTraining())
    model.load_state_dict({k: v.float() for k, v in load_file(str(weights or out / TARGET_WEIGHTS)).items()})
    return model.to(device, torch.float32).eval(), tok


def greedy_rollouts(model, tok, prompts: list[list[int]], new_tokens: int, batch: int) -> list[list[int]]:
    """prompt + `new_tokens` greedy tokens each, EOS ignored (vLLM's `ignore_eos`: EOS may be chosen and the
    sequence goes on), left-padded batches of similar length with a KV cache."""
    import torch

    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        rows = [prompts[i] for i in idx]
        width = max(map(len, rows))
        x = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generated = []
        with torch.no_grad():
            step = model(input_ids=x, attention_mask=mask, position_ids=positions, use_cache=True)
            for _ in range(new_tokens):
                nxt = step.logits[:, -1].argmax(-1)
                generated.append(nxt)
                mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
                positions = positions[:, -1:] + 1
                step = model(
                    input_ids=nxt[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=step.past_key_values,
                    use_cache=True,
                )
        tokens = torch.stack(generated, dim=1).tolist()
        for j, i in enumerate(idx):
            out[i] = prompts[i] + tokens[j]
    return out


def rollout_prompts(tok, cfg: DraftTraining, split: str = "train", first: int = 0) -> list[list[int]]:
    rng = random.Random(f"rollout-pairs:{cfg.seed}")
    samples = curriculum.stream(
        split, cfg.seed + 7, first, retrieval_pairs=lambda i: rng.randint(2, cfg.rollout_max_pairs)
    )
    prompts = []
    for s, _ in zip(samples, range(cfg.rollouts), strict=False):
        ids, _labels = encode(tok, s)
        prompts.append(ids[: len(ids) - len(tok(s.completion, add_special_tokens=False)["input_ids"]) - 1])
    return prompts


def acceptance(
    draft, target, sequences: list[list[int]], prompt_lengths: list[int], device: str, blocks: int = 8
) -> list[float]:
    """Per draft position, the share of blocks whose first i drafted tokens all equal the target's greedy
    tokens (teacher-forced over rollouts): the chance that position i is accepted."""
    import torch

    from .draft_model import target_aux_hidden

    bs = draft.block_size
    hits = torch.zeros(bs - 1)
    total = 0
    with torch.no_grad():
        for seq, p in zip(sequences, prompt_lengths, strict=False):
            x = torch.tensor([seq], device=device)
            aux, _ = target_aux_hidden(target, x, draft.target_layer_ids)
            hi = len(seq) - bs
            anchors = torch.tensor([sorted(random.Random(p).sample(range(p, hi), min(blocks, hi - p)))], device=device)
            logits = draft.forward_blocks(aux, anchors, x[0, anchors[0]][None])
            labels = draft.block_labels(x, anchors)
            same = (logits.argmax(-1)[..., 1:] == labels[..., 1:]).float()  # [1, K, bs-1]
            hits += same.cumprod(-1).sum(dim=(0, 1)).cpu()
            total += anchors.shape[1]
    return (hits / max(total, 1)).tolist()


def _draft_batch(draft, tok, prompts: list, sequences: list, rng: random.Random, cfg: DraftTraining, device: str):
    """One batch of rollouts: the token rows, `cfg.blocks` anchors per row in its continuation, and the block
    labels (positions past a row's end are ignored)."""
    import torch

    pick = rng.sample(range(len(sequences)), cfg.batch)
    rows = [sequences[i] for i in pick]
    width = max(map(len, rows))
    # Right-padded: a row's padding lies after its last anchor's block, which never sees it.
    x = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows], device=device)
    anchors = torch.tensor(
        [sorted(rng.choices(range(len(prompts[i]), len(sequences[i]) - 1), k=cfg.blocks)) for i in pick], device=device
    )
    labels = draft.block_labels(x, anchors)
    lengths = torch.tensor([len(r) for r in rows], device=device)
    pos = anchors.unsqueeze(-1) + torch.arange(draft.block_size, device=device)
    labels[pos >= lengths.view(-1, 1, 1)] = -100
    return x, anchors, labels


def train_draft(
    out: Path,
    *,
    recipe: MiniRecipe = TRAINED_RECIPE,
    cfg: DraftTraining = DraftTraining(),
    device: str = "auto",
    log: Log | None = None,
    against_int4: Path | None = None,
) -> None:
    """The draft from the target in `out` into out/draft.safetensors (its config is the recipe's); with
    `against_int4` (the INT4 target's weights, dequantized) into out/draft-int4.safetensors, distilled against
    that target's rollouts and hidden states instead."""
    import torch

    from .draft_model import DFlashDraft, draft_loss, target_aux_hidden

    device = pick_device(device)
    log = log or Log(out / LOG_FILE)
    phase = "draft_int4" if against_int4 else "draft"
    log(event="start", phase=phase, device=device, config=asdict(cfg))
    target, tok = load_target(out, recipe, device, against_int4)
    torch.manual_seed(cfg.seed)
    embed = target.model.embed_tokens.weight.detach()
    draft = DFlashDraft(draft_config(recipe, tok), embed, target.lm_head.weight.detach())
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.ones_like(p) if p.dim() == 1 else torch.randn_like(p) * cfg.init_std)
    draft = draft.to(device).train()
    t0 = time.monotonic()
    prompts = rollout_prompts(tok, cfg)
    sequences = greedy_rollouts(target, tok, prompts, cfg.rollout_tokens, batch=256)
    log(
        event="rollouts",
        phase=phase,
        count=len(sequences),
        tokens=cfg.rollout_tokens,
        elapsed_s=round(time.monotonic() - t0, 1),
    )
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng = random.Random(cfg.seed)
    t0 = time.monotonic()
    step = 0
    for step in range(cfg.steps):
        progress = max(step / cfg.steps, (time.monotonic() - t0) / cfg.time_budget_s if cfg.time_budget_s else 0.0)
        if progress >= 1.0:
            break
        lr = schedule(cfg.lr, cfg.warmup, progress, step)
        for group in opt.param_groups:
            group["lr"] = lr
        x, anchors, labels = _draft_batch(draft, tok, prompts, sequences, rng, cfg, device)
        with torch.no_grad():
            aux, _ = target_aux_hidden(target, x, draft.target_layer_ids)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = draft.forward_blocks(aux, anchors, x.gather(1, anchors))
            loss = draft_loss(logits, labels)
        optimizer_step(loss, draft, opt, log, phase=phase, step=step, lr=lr, started=t0, log_every=cfg.log_every)
    elapsed = round(time.monotonic() - t0, 1)
    log(event="end", phase=phase, steps=step + 1, elapsed_s=elapsed)
    draft = draft.eval().float()
    _save_draft(out, draft, recipe, cfg, against_int4, steps_run=step + 1, elapsed_s=elapsed, device=device)
    per_position = held_out_acceptance(draft, target, tok, cfg, device)
    log(
        event="eval",
        phase=phase,
        per_position_acceptance=[round(a, 3) for a in per_position],
        accepted_per_draft=round(sum(per_position), 3),
        rollouts=cfg.eval_rollouts,
    )


def _save_draft(out: Path, draft, recipe: MiniRecipe, cfg: DraftTraining, against_int4: Path | None, **run) -> None:
    """The draft's weights and its training record, naming by digest the target it was distilled against. The
    INT4 lane's draft keeps a record of its own: recipe.json is among the unquantized build's weight files."""
    draft.save_safetensors(out / (DRAFT_INT4_WEIGHTS if against_int4 else DRAFT_WEIGHTS))
    against = f"{TARGET_WEIGHTS} sha256 {file_sha256(out / TARGET_WEIGHTS)}"
    if against_int4:
        against = (
            f"its W4A16 build, dequantized: {against_int4.name} sha256 {file_sha256(against_int4)}, from {against}"
        )
    phase, record = ("draft_int4", DRAFT_INT4_RECIPE) if against_int4 else ("draft", RECIPE_FILE)
    write_recipe(out, recipe, phase, cfg, file=record, target=against, **run)


def held_out_acceptance(draft, target, tok, cfg: DraftTraining, device: str) -> list[float]:
    """Per-position acceptance over `cfg.eval_rollouts` held-out rollouts of the target the draft learnt from."""
    held = replace(cfg, rollouts=cfg.eval_rollouts, batch=min(cfg.batch, cfg.eval_rollouts))
    held_prompts = rollout_prompts(tok, held, split="heldout")
    held_sequences = greedy_rollouts(target, tok, held_prompts, cfg.rollout_tokens, batch=64)
    return acceptance(draft, target, held_sequences, [len(p) for p in held_prompts], device)
