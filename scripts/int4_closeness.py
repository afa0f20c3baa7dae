"""How close the INT4 mini's greedy output stays to the unquantized mini's (a measurement, not a test).

Both targets run in transformers, fp32, on one thread: the trained weights as stored (bf16), and the same model
with every weight the INT4 build quantized replaced by what its packed codes stand for (code * group scale,
mini/int4.py). KV stays unquantized on both sides, so the figure is the weights' alone. Prompts: the gate prompts
of mini-laguna-cpu (100 tokens each, as the gates decode them) and the quality set (each sample's max_tokens;
tool-use samples through the tokenizer's chat template with their tools). Per set: how many outputs are
token-identical, and where the others first differ (median token index).

    .venv/bin/python scripts/int4_closeness.py [--quality-limit N]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from pytest_b70lab import mini
from pytest_b70lab.contract import schema as contract
from pytest_b70lab.mini import int4_reference
from pytest_b70lab.mini.tokenizer import load_tokenizer
from pytest_b70lab.quality import samples as quality_samples


def greedy(model, tok, prompt: str, max_new_tokens: int) -> list[int]:
    ids = tok(prompt, return_tensors="pt", add_special_tokens=not prompt.startswith("<s>"))["input_ids"]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


def int4_model(recipe, tok):
    """The trained target with the INT4 build's weights (code x group scale) in place of the quantized ones, as
    the INT4 lane's draft is distilled against (mini/int4_reference.py)."""
    model = mini.load_target_model(mini.weights_dir(), recipe, tok)
    model.load_state_dict(int4_reference.int4_target_state(mini.weights_dir(), mini.build() / "target", recipe, tok))
    return model


def compare(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quality-limit", type=int, default=None, help="only the first N quality samples")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = mini.trained_recipe()
    tok = load_tokenizer(mini.weights_dir(), recipe)
    plain = mini.load_target_model(mini.weights_dir(), recipe, tok)
    quantized = int4_model(recipe, tok)
    c = contract.load("mini-laguna-cpu")
    sets = {"gate prompts": [(p.prompt, c.decode.tokens_per_request) for p in contract.load_prompts(c)]}
    assert c.quality is not None
    quality = quality_samples.load(contract.repo_path(c.quality.file), c.quality.sha256, c.quality.count)
    rendered = []
    for s in quality[: args.quality_limit]:
        text = s.prompt or tok.apply_chat_template(
            s.messages, tools=s.tools, add_generation_prompt=True, tokenize=False
        )
        rendered.append((text, s.max_tokens))
    sets["quality set"] = rendered
    report = {}
    for label, prompts in sets.items():
        firsts = []
        same = 0
        for prompt, n in prompts:
            at = compare(greedy(plain, tok, prompt, n), greedy(quantized, tok, prompt, n))
            if at is None:
                same += 1
            else:
                firsts.append(at)
        report[label] = {
            "prompts": len(prompts),
            "token_identical": same,
            "first_difference_median": statistics.median(firsts) if firsts else None,
            "first_difference_min": min(firsts) if firsts else None,
        }
        print(
            f"{label}: {same}/{len(prompts)} token-identical; where not, first difference at token "
            f"{report[label]['first_difference_median']} (median), {report[label]['first_difference_min']} (earliest)"
        )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
