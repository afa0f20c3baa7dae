"""Training the mini: a curriculum tokenizer, the Laguna target, and (in draft.py's loop) the DFlash draft.

Runs on CPU (a CI smoke test trains a few steps) or CUDA where present. A retrain need not be byte-identical
to the committed weights: those are the artifact; this reproduces them in kind. Progress is measured against
whichever comes first of the step count and an optional time budget, so a run sized for a lent GPU's
ten-minute window ends on schedule with its learning rate annealed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..digests import file_sha256
from . import curriculum
from .recipe import LOG_FILE, SPECIAL_TOKENS, TARGET_WEIGHTS, TOKENIZER_FILE, TRAINED_RECIPE, MiniRecipe
from .tokenizer import load_tokenizer
from .training import (
    IGNORE,
    Log,
    TargetTraining,
    encode,
    new_target,
    optimizer_step,
    pick_device,
    schedule,
    write_recipe,
)

# --- tokenizer -----------------------------------------------------------------------------------------


def train_tokenizer(recipe: MiniRecipe, seed: int):
    """Byte-level BPE on the curriculum that never merges letters: digits and letters are one a token, the
    chat markers special tokens and the tool-call markers plain added tokens (kept when decoding).

    A name must be spelled in the same pieces wherever it appears (in a request, in a schema, in the call
    the model writes), and each piece must be one the model copies all the time. With GPT-2's
    space-prefixed words "planet" was one token after a space and "plan"+"et" after a quote; with words
    merged at all, held-out names split into rare pieces ("w e i ght", "count r y") that the model cut or
    changed: two trained minis copied 21-26 of 50 held-out tool calls right
    (notes/2026-11-30-trained-mini.md). Letters one a token cost ~2.2x the tokens of a sample; only
    whitespace and punctuation runs are merged."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated"),
            pre_tokenizers.Split(Regex(r"\p{L}"), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = list(SPECIAL_TOKENS) + list(curriculum.CHAT_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size - len(curriculum.TOOL_TOKENS),
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(curriculum.tokenizer_corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in curriculum.TOOL_TOKENS])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


# --- data ----------------------------------------------------------------------------------------------


def tokens_per_pair(tok) -> float:
    probe = curriculum.retrieval(curriculum._Draw("train", 0, 0, "retrieval"), 50)
    return len(tok(probe.prompt)["input_ids"]) / 50


def retrieval_sizes(tok, seqlen: int, seed: int) -> Callable[[int], int]:
    """Needle tasks sized log-uniformly from 2 pairs to the longest that fits `seqlen`: every length gets
    practice, short ones (which teach the skill) most."""
    most = max(2, int((seqlen - 24) / tokens_per_pair(tok)) - 1)

    def size(index: int) -> int:
        r = random.Random(f"pairs:{seed}:{index}").random()
        return max(2, min(most, int(round(2 * (most / 2) ** r))))

    return size


SAMPLES_PER_BATCH = 4096  # batch k packs samples from index k * SAMPLES_PER_BATCH on: batches are independent


def batch(tok, cfg: TargetTraining, k: int, sizes: Callable[[int], int]) -> tuple[list[list[int]], list[list[int]]]:
    """Rows of `seqlen` tokens packed with whole documents; the remainder of a row is padding (no loss)."""
    rows: list[list[int]] = []
    labels: list[list[int]] = []
    samples = curriculum.stream("train", cfg.seed, k * SAMPLES_PER_BATCH, retrieval_pairs=sizes)
    pending: tuple[list[int], list[int]] | None = None
    while len(rows) < cfg.batch:
        ids: list[int] = []
        lab: list[int] = []
        while True:
            doc = pending or encode(tok, next(samples))
            pending = None
            if len(doc[0]) > cfg.seqlen:
                continue
            if len(ids) + len(doc[0]) > cfg.seqlen:
                pending = doc
                break
            ids += doc[0]
            lab += doc[1]
        pad = cfg.seqlen - len(ids)
        rows.append(ids + [tok.pad_token_id] * pad)
        labels.append(lab + [IGNORE] * pad)
    return rows, labels


def batches(tok, cfg: TargetTraining, start: int, device: str) -> Iterator[tuple[Any, Any]]:
    """Batches start, start+1, ... built on a few background threads (tokenizing is the slow part)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    sizes = retrieval_sizes(tok, cfg.seqlen, cfg.seed)
    with ThreadPoolExecutor(max_workers=4) as pool:
        ahead = 8
        futures = {k: pool.submit(batch, tok, cfg, k, sizes) for k in range(start, start + ahead)}
        k = start
        while True:
            rows, labels = futures.pop(k).result()
            futures[k + ahead] = pool.submit(batch, tok, cfg, k + ahead, sizes)
            yield (torch.tensor(rows, device=device), torch.tensor(labels, device=device))
            k += 1


# --- the target ------------------------------------------------------------------------------------------


def _target_steps(model, opt, data, cfg: TargetTraining, device: str, log: Log, t0: float) -> int:
    """The optimiser loop, within the step count and the time budget; the index of the last step run."""
    import torch

    step = 0
    for step in range(cfg.steps):
        elapsed = time.monotonic() - t0
        progress = max(step / cfg.steps, elapsed / cfg.time_budget_s if cfg.time_budget_s else 0.0)
        if progress >= 1.0:
            break
        lr = schedule(cfg.lr, cfg.warmup, progress, step)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = next(data)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=x, labels=y).loss
        optimizer_step(loss, model, opt, log, phase="target", step=step, lr=lr, started=t0, log_every=cfg.log_every)
    return step


def train_target(
    out: Path,
    *,
    recipe: MiniRecipe = TRAINED_RECIPE,
    cfg: TargetTraining | None = None,
    device: str = "auto",
    log: Log | None = None,
    init: Path | None = None,
    evaluate_n: int = 0,
):
    """Tokenizer and target from nothing into `out` (tokenizer.json, target.safetensors, recipe.json, log)."""
    import torch

    cfg = cfg or TargetTraining()
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(device)
    log = log or Log(out / LOG_FILE)
    if init is None or not (out / TOKENIZER_FILE).is_file():
        train_tokenizer(recipe, cfg.seed).save(str(out / TOKENIZER_FILE))
    # else: continuing from `init`, whose token ids are those of the tokenizer already in `out`
    tok = load_tokenizer(out, recipe)
    if len(tok) != recipe.vocab_size:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, the recipe asks for {recipe.vocab_size}")
    model = new_target(recipe, tok, cfg)
    init_from = None
    if init is not None:  # continue from saved weights (a fresh optimizer: warm-up again)
        from safetensors.torch import load_file

        init_from = f"{init.name} sha256 {file_sha256(init)}"

        model.load_state_dict({k: v.float() for k, v in load_file(str(init)).items()})
    model = model.to(device).train()
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    log(
        event="start",
        phase="target",
        device=device,
        config=asdict(cfg),
        params=sum(p.numel() for p in model.parameters()),
        tokens_per_pair=round(tokens_per_pair(tok), 2),
        corpus_digest=curriculum.corpus_digest(cfg.seed),
    )
    t0 = time.monotonic()
    step = _target_steps(model, opt, batches(tok, cfg, 0, device), cfg, device, log, t0)
    elapsed = round(time.monotonic() - t0, 1)
    log(event="end", phase="target", steps=step + 1, elapsed_s=elapsed)
    model = model.eval()
    save_weights(model.state_dict(), out / TARGET_WEIGHTS)
    write_recipe(out, recipe, "target", cfg, steps_run=step + 1, elapsed_s=elapsed, device=device, init=init_from)
    if evaluate_n:
        from .evaluate import held_out

        longest = int((cfg.seqlen - 24) / tokens_per_pair(tok)) - 1
        log(
            event="eval",
            phase="target",
            longest_pairs=longest,
            results=held_out(model, tok, seed=cfg.seed, n=evaluate_n, longest_pairs=longest),
        )
    return model.to("cpu", torch.float32), tok


def save_weights(state: dict[str, Any], path: Path) -> None:
    """bf16, sorted names: the committed form (half the bytes of fp32, what the served checkpoint holds)."""
    import torch
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to(torch.bfloat16).contiguous() if v.is_floating_point() else v.contiguous()
        for k, v in sorted(state.items())
    }
    save_file(tensors, str(path), metadata={"format": "pt"})


# --- command line (also `b70lab mini train`); runs where only torch + transformers are installed -------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="b70lab mini train",
        description=(
            "Train the mini's tokenizer and target (and distil its DFlash draft) into OUT: the files "
            "`b70lab mini build` assembles the served model from."
        ),
    )
    parser.add_argument("phase", choices=["target", "draft", "all"], help="what to train")
    parser.add_argument("--out", type=Path, required=True, help="folder for the weights, recipe and log")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--time-budget", type=float, help="seconds: anneal and stop by then")
    parser.add_argument("--lr", type=float, help="peak learning rate of the target")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seqlen", type=int)
    parser.add_argument("--draft-steps", type=int)
    parser.add_argument("--draft-time-budget", type=float, help="seconds for the draft's training")
    parser.add_argument("--rollouts", type=int, help="target rollouts the draft learns from")
    parser.add_argument("--init", type=Path, help="target weights to continue from")
    parser.add_argument(
        "--against-int4",
        type=Path,
        metavar="WEIGHTS",
        help="distil the draft against the INT4 target whose dequantized weights WEIGHTS holds "
        "(`b70lab mini int4-target WEIGHTS`) into draft-int4.safetensors",
    )
    parser.add_argument("--eval", type=int, default=0, help="held-out samples a family to score at the end")
    args = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in {
            "steps": args.steps,
            "time_budget_s": args.time_budget,
            "batch": args.batch,
            "seqlen": args.seqlen,
            "lr": args.lr,
        }.items()
        if v is not None
    }
    if args.phase in ("target", "all"):
        train_target(
            args.out,
            cfg=replace(TargetTraining(), **overrides),
            device=args.device,
            init=args.init,
            evaluate_n=args.eval,
        )
    if args.phase in ("draft", "all"):
        from .distil import DraftTraining, train_draft

        draft_overrides = {
            k: v
            for k, v in {
                "steps": args.draft_steps,
                "time_budget_s": args.draft_time_budget,
                "rollouts": args.rollouts,
            }.items()
            if v is not None
        }
        train_draft(
            args.out,
            cfg=replace(DraftTraining(), **draft_overrides),
            device=args.device,
            against_int4=args.against_int4,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
