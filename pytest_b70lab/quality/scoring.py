"""From an engine start's recorded quality answers to per-sample scores (the part of gate 8 that runs
generated code, in the sandbox; everything else is pure)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from . import checks
from .judge import Key
from .samples import QualitySample


def answers_of(records: list[Any]) -> dict[Key, checks.Answer]:
    """The evidence's quality records (evidence.QualityRecord) as engine-free answers, by (sample, variant)."""
    return {
        (r.sample_id, r.variant): checks.Answer(
            text=r.text, tool_calls=list(r.tool_calls), error=r.error, finish_reason=r.finish_reason
        )
        for r in records
    }


def limits_of(quality: Any) -> checks.RepetitionLimits:
    return checks.RepetitionLimits(
        ngram=quality.repetition_ngram, max_rate=quality.max_repetition_rate, max_span=quality.max_repeated_span
    )


def score_all(
    samples: list[QualitySample],
    answers: dict[Key, checks.Answer],
    limits: checks.RepetitionLimits,
    run: Callable[[str], Any] | None = None,
) -> dict[Key, checks.Score]:
    """Scores of every answered (sample, variant); an unanswered one is left out (the judge fails it)."""
    if run is None:
        from ..isolation.sandbox import run_python

        run = run_python
    return {
        (s.id, v): checks.score(s, answers[(s.id, v)], run=run, limits=limits)
        for s in samples
        for v in s.variants
        if (s.id, v) in answers
    }


def answer_text(answer: checks.Answer) -> str:
    """What a baseline keeps of an answer for a reader: the text, and the parsed tool calls in canonical JSON
    (the same whether the answer came live from the engine or back from an evidence file)."""
    return answer.text + (json.dumps(answer.tool_calls, sort_keys=True) if answer.tool_calls else "")


def texts_of(answers: dict[Key, checks.Answer]) -> dict[Key, str]:
    return {k: answer_text(a) for k, a in answers.items()}
