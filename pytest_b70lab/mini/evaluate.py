"""Scoring the mini on held-out curriculum samples: what a completion must do to count as right.

The scorers are pure functions of (sample, generated text), shared by the training log (transformers on the
training device) and the measurement through vLLM (scripts/eval_mini.py), so both count the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import curriculum

# The poolside_v1 grammar, as vLLM's parser reads it (used here only where vLLM is absent: the training log).
_CALL = re.compile(r"<tool_call>\s*([^\n<]+?)\s*\n?\s*(<arg_key>.*?)?</tool_call>", re.DOTALL)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    calls = []
    for m in _CALL.finditer(text):
        arguments: dict[str, Any] = {}
        for key, value in _ARG.findall(m.group(2) or ""):
            try:
                arguments[key.strip()] = json.loads(value)
            except json.JSONDecodeError:
                arguments[key.strip()] = value
        calls.append({"name": m.group(1).strip(), "arguments": arguments})
    return calls


def tool_call_ok(sample: curriculum.Sample, calls: list[dict[str, Any]]) -> bool:
    """One call, of the right tool, with arguments that validate against that tool's schema."""
    import jsonschema

    if len(calls) != 1 or calls[0]["name"] != sample.meta["expected"]["name"]:
        return False
    tool = next(t["function"] for t in sample.meta["tools"] if t["function"]["name"] == calls[0]["name"])
    try:
        jsonschema.validate(calls[0]["arguments"], tool["parameters"])
    except jsonschema.ValidationError:
        return False
    return True


def json_ok(sample: curriculum.Sample, text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text.strip()), sample.meta["schema"])
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def retrieval_ok(sample: curriculum.Sample, text: str) -> bool:
    return text.strip().split()[:1] == [sample.meta["expected"]]


CHECK_TIMEOUT_S = 10.0


def code_ok(sample: curriculum.Sample, text: str) -> bool:
    """The prompt plus the generated body, run against the sample's checks in the quality gate's sandbox
    (generated code is untrusted, whoever generated it: the same isolation, limits and teardown). Where the
    machine gives no OS layer this refuses (sandbox.Unisolated) unless $B70LAB_ALLOW_UNISOLATED_CODE=1."""
    from ..isolation import sandbox

    sandbox.require_isolation()
    body = text.split("\n\n", 1)[0]
    program = (
        sample.prompt
        + body
        + "\n\nimport json, sys\n"
        + "".join(
            f"assert {sample.meta['function']}(*{check['args']!r}) == {check['expected']!r}\n"
            for check in sample.meta["checks"]
        )
    )
    return sandbox.run_python(program, timeout_s=CHECK_TIMEOUT_S).passed


def score(sample: curriculum.Sample, text: str) -> bool:
    if sample.family == "code":
        return code_ok(sample, text)
    if sample.family == "json":
        return json_ok(sample, text)
    if sample.family == "tool":
        return tool_call_ok(sample, parse_tool_calls(text))
    if sample.family == "retrieval":
        return retrieval_ok(sample, text)
    raise ValueError(f"no scorer for family {sample.family!r}")


def generate(model, tok, prompts: list[str], max_new_tokens: int, batch: int = 32) -> list[str]:
    """Greedy completions with transformers (left-padded batches), cut at the first `</s>`."""
    import torch

    device = next(model.parameters()).device
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        ids = [tok(p, add_special_tokens=not p.startswith(curriculum.BOS))["input_ids"] for p in chunk]
        width = max(map(len, ids))
        x = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in ids], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids], device=device)
        with torch.no_grad():
            g = model.generate(
                input_ids=x,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        for row in g[:, width:].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id)]
            out.append(tok.decode(row, skip_special_tokens=False).replace("<pad>", ""))
    return out


def held_out(model, tok, *, seed: int, n: int, longest_pairs: int) -> dict[str, Any]:
    """Accuracy per family on `n` held-out samples each (retrieval at `longest_pairs`), plus unseen shapes."""
    results: dict[str, Any] = {}
    plan = [
        ("code", "heldout", 128),
        ("tool", "heldout", 192),
        ("json", "heldout", 256),
        ("retrieval", "heldout", 8),
        ("code", "unseen", 128),
    ]
    for family, split, max_new in plan:
        samples = [curriculum.sample(split, seed, i, family, n_pairs=longest_pairs) for i in range(n)]
        texts = generate(model, tok, [s.prompt for s in samples], max_new, batch=8 if family == "retrieval" else 32)
        ok = [score(s, t) for s, t in zip(samples, texts, strict=False)]
        results[f"{family}/{split}"] = {"correct": sum(ok), "of": n, "example": texts[0][:160]}
    return results
