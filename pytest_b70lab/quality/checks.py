"""What one quality answer must do to count as right: pure functions of (sample, recorded answer).

Every family turns an answer into a `Score` (passed or not, why, and the figures behind it), so that the
judgement against the baseline (`judge.py`) is the same for all of them: paired pass/fail per sample.
Only coding runs anything, in the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .samples import QualitySample


@dataclass(frozen=True)
class Answer:
    """What the engine answered to one quality request (the evidence's quality record, engine-free)."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "arguments" (JSON text)}]
    error: str | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class Score:
    passed: bool
    detail: str
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RepetitionLimits:
    ngram: int = 4
    max_rate: float = 0.5  # share of repeated word n-grams in one answer
    max_span: int = 16  # longest word sequence that occurs twice


def _validate(instance: Any, schema: dict[str, Any]) -> str | None:
    """None when `instance` validates against `schema`, else jsonschema's own message (first error)."""
    import jsonschema

    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as e:
        return e.message
    return None


def coding(sample: QualitySample, answer: Answer, run: Callable[[str], Any]) -> Score:
    """The prompt, the generated body and the sample's test, run by `run` (the sandbox)."""
    body = answer.text
    for stop in sample.stop:  # a server honours `stop`; recorded text from elsewhere may not have been cut
        body = body.split(stop, 1)[0]
    program = f"{sample.prompt}{body}\n\n{sample.test}\n\ncheck({sample.entry_point})\n"
    result = run(program)
    return Score(bool(result.passed), str(result.reason), {"seconds": round(float(result.seconds), 3)})


def structured(sample: QualitySample, answer: Answer) -> Score:
    text = answer.text.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return Score(False, f"not JSON ({e.msg} at character {e.pos}): {text[:80]!r}")
    problem = _validate(value, sample.schema_ or {})
    return Score(problem is None, problem or "valid")


def tool_use(sample: QualitySample, answer: Answer) -> Score:
    """One call, of the expected tool, with arguments that validate against that tool's parameters."""
    calls = answer.tool_calls
    if len(calls) != 1:
        return Score(False, f"{len(calls)} tool calls parsed (want 1); text {answer.text[:80]!r}")
    name = calls[0].get("name")
    if name != sample.expected_tool:
        return Score(False, f"called {name!r}, want {sample.expected_tool!r}")
    tool = next((t.get("function", t) for t in sample.tools or [] if t.get("function", t).get("name") == name), None)
    try:
        arguments = json.loads(calls[0].get("arguments") or "{}")
    except json.JSONDecodeError as e:
        return Score(False, f"arguments are not JSON ({e.msg}): {calls[0].get('arguments')!r:.80}")
    problem = _validate(arguments, (tool or {}).get("parameters") or {})
    return Score(problem is None, problem or f"{name}({', '.join(arguments)})")


def repetition_rate(words: list[str], n: int) -> float:
    """Share of word n-grams that repeat an earlier one (0 for answers shorter than n words)."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def longest_repeated_span(words: list[str]) -> int:
    """Length of the longest word sequence that occurs at least twice (occurrences may overlap).

    Quadratic dynamic programme over one row at a time: answers are at most a few hundred words, and no
    library ships a longest-repeated-substring over tokens."""
    best = 0
    previous = [0] * (len(words) + 1)
    for i in range(1, len(words) + 1):
        current = [0] * (len(words) + 1)
        for j in range(i + 1, len(words) + 1):
            if words[i - 1] == words[j - 1]:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def repetition(sample: QualitySample, answer: Answer, limits: RepetitionLimits) -> Score:
    words = answer.text.split()
    rate, span = repetition_rate(words, limits.ngram), longest_repeated_span(words)
    figures = {"words": float(len(words)), "ngram_repetition_rate": round(rate, 4), "longest_repeated_span": span}
    if len(words) < limits.ngram:
        return Score(False, f"{len(words)} words: too short to judge", figures)
    problems = (
        [f"{limits.ngram}-gram repetition {rate:.2f} > {limits.max_rate}"] if rate > limits.max_rate else []
    ) + ([f"a {span}-word span repeats (limit {limits.max_span})"] if span > limits.max_span else [])
    return Score(not problems, "; ".join(problems) or f"rate {rate:.2f}, longest repeat {span} words", figures)


def long_context(sample: QualitySample, answer: Answer) -> Score:
    got = [w.rstrip(".,;:!") for w in answer.text.strip().split()[:1]]  # "v123." is the value v123
    ok = got == [sample.expected]
    return Score(ok, f"answered {got[0] if got else '(nothing)'!r}, want {sample.expected!r}")


def score(
    sample: QualitySample, answer: Answer, *, run: Callable[[str], Any], limits: RepetitionLimits = RepetitionLimits()
) -> Score:
    """A request that failed is a failed sample (the engine's error is the reason), never a skipped one."""
    if answer.error:
        return Score(False, f"request failed: {answer.error}")
    if sample.family == "coding":
        return coding(sample, answer, run)
    if sample.family == "structured":
        return structured(sample, answer)
    if sample.family == "tool_use":
        return tool_use(sample, answer)
    if sample.family == "repetition":
        return repetition(sample, answer, limits)
    return long_context(sample, answer)
