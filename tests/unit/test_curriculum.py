"""The mini's curriculum: reproducible, held out for real, rendered and parsed the way vLLM does it.

The held-out split only measures anything if memorising the training split cannot pass it, and the tool
family only teaches the served model if what it trains on is what vLLM renders and parses: those are
checked against the real parts (transformers' chat-template renderer, vLLM's `poolside_v1` parser).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_b70lab.mini import curriculum, evaluate
from pytest_b70lab.mini.curriculum import Sample
from pytest_b70lab.mini.recipe import TRAINED_RECIPE
from pytest_b70lab.mini.tokenizer import load_tokenizer

WEIGHTS = Path(__file__).resolve().parents[2] / "fixtures" / "mini"
RECIPE = json.loads((WEIGHTS / "recipe.json").read_text())
SEED: int = RECIPE["target"]["seed"]  # the seed the committed weights were trained on
HELD_OUT_SPLITS = [s for s in curriculum.SPLITS if s != "train"]
NAMED_FAMILIES = ("code", "json", "tool")  # the families that name things (prose and retrieval do not)
TRAINING_SAMPLES, HELD_OUT_SAMPLES = 2000, 200


# --- what a sample names, read from its text (not from the generator's word lists) -------------------


def _code_function(s: Sample) -> ast.FunctionDef:
    fn = ast.parse(s.prompt + s.completion).body[0]
    assert isinstance(fn, ast.FunctionDef)
    return fn


def names(s: Sample) -> dict[str, set[str]]:
    """Every name the sample makes the model copy, by kind: the words of function and tool names, code
    arguments, tool parameters and schema fields, and string values."""
    kinds: dict[str, set[str]] = {"name word": set(), "argument": set(), "parameter or field": set(), "value": set()}
    if s.family == "code":
        fn = _code_function(s)
        kinds["name word"] |= set(fn.name.split("_"))
        kinds["argument"] |= {a.arg for a in fn.args.args}
        kinds["value"] |= {v for check in s.meta["checks"] for v in check["args"] if isinstance(v, str)}
    elif s.family == "json":
        properties = s.meta["schema"]["properties"]
        kinds["parameter or field"] |= set(properties)
        kinds["value"] |= {v for v in json.loads(s.completion).values() if isinstance(v, str)}
        kinds["value"] |= {o for spec in properties.values() for o in spec.get("enum", [])}
    elif s.family == "tool":
        for tool in s.meta["tools"]:
            kinds["name word"] |= set(tool["function"]["name"].split("_"))
            kinds["parameter or field"] |= set(tool["function"]["parameters"]["properties"])
        kinds["value"] |= {v for v in s.meta["expected"]["arguments"].values() if isinstance(v, str)}
    return kinds


def constants(s: Sample) -> list[int]:
    """The numbers a sample asks the model to use: code literals, JSON integers, integer tool arguments."""
    if s.family == "code":
        return [n.value for n in ast.walk(_code_function(s)) if isinstance(n, ast.Constant) and type(n.value) is int]
    if s.family == "json":
        return [v for v in json.loads(s.completion).values() if type(v) is int]
    if s.family == "tool":
        return [v for v in s.meta["expected"]["arguments"].values() if type(v) is int]
    return []


def _samples(split: str, family: str, n: int) -> list[Sample]:
    return [curriculum.sample(split, SEED, i, family) for i in range(n)]


@pytest.fixture(scope="module")
def training_names() -> dict[str, dict[str, set[str]]]:
    """family -> kind -> every name 2000 training samples of that family use."""
    out: dict[str, dict[str, set[str]]] = {}
    for family in NAMED_FAMILIES:
        out[family] = {}
        for s in _samples("train", family, TRAINING_SAMPLES):
            for kind, words in names(s).items():
                out[family].setdefault(kind, set()).update(words)
    return out


# --- determinism -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", curriculum.SPLITS)
@pytest.mark.parametrize("family", curriculum.FAMILIES)
def test_a_sample_is_a_pure_function_of_split_seed_and_index(split: str, family: str) -> None:
    for index in (0, 1, 97):
        first, second = (curriculum.sample(split, SEED, index, family) for _ in range(2))
        assert first == second
    assert curriculum.sample(split, SEED, 0, family) != curriculum.sample(split, SEED + 1, 0, family), (
        "the seed must change what is drawn"
    )


def test_corpus_digest_is_stable_and_tracks_the_content() -> None:
    assert curriculum.corpus_digest(SEED, n=100) == curriculum.corpus_digest(SEED, n=100)
    assert curriculum.corpus_digest(SEED, n=100) != curriculum.corpus_digest(SEED + 1, n=100)


def test_corpus_digest_does_not_depend_on_the_interpreter() -> None:
    """Another process with another hash seed (set and dict orders) draws the same corpus."""
    code = f"from pytest_b70lab.mini import curriculum as c; print(c.corpus_digest({SEED}, n=100))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert done.stdout.split()[-1] == curriculum.corpus_digest(SEED, n=100)


def test_the_committed_weights_were_trained_on_this_curriculum() -> None:
    """The last target run in the committed training log recorded the digest of the corpus it trained on
    (recorded on the training machine, with its own library versions)."""
    events = [json.loads(line) for line in (WEIGHTS / "training-log.jsonl").read_text().splitlines()]
    last_start = [e for e in events if e.get("phase") == "target" and e.get("event") == "start"][-1]
    assert curriculum.corpus_digest(last_start["config"]["seed"]) == last_start["corpus_digest"]


# --- held out for real ---------------------------------------------------------------------------------


@pytest.mark.parametrize("split", HELD_OUT_SPLITS)
@pytest.mark.parametrize("family", NAMED_FAMILIES)
def test_held_out_samples_never_use_a_training_name(
    split: str, family: str, training_names: dict[str, dict[str, set[str]]]
) -> None:
    seen = training_names[family]
    for kind, words in seen.items():
        if words:
            assert len(words) > 50, f"training {family} samples should draw {kind}s afresh, got {sorted(words)}"
    leaks: dict[str, set[str]] = {}
    held: dict[str, set[str]] = {}
    for s in _samples(split, family, HELD_OUT_SAMPLES):
        for kind, words in names(s).items():
            held.setdefault(kind, set()).update(words)
            if common := words & seen.get(kind, set()):
                leaks.setdefault(kind, set()).update(common)
    assert any(held.values()), f"{split} {family} samples name nothing"
    assert not leaks, f"{split} {family} samples use names the training split uses: {leaks}"


@pytest.mark.parametrize("family", NAMED_FAMILIES)
def test_held_out_constants_are_never_training_constants(family: str) -> None:
    training = [n for s in _samples("train", family, TRAINING_SAMPLES) for n in constants(s)]
    assert training and not [n for n in training if curriculum.held_out_number(n)]
    for split in HELD_OUT_SPLITS:
        held = [n for s in _samples(split, family, HELD_OUT_SAMPLES) for n in constants(s)]
        assert held and all(curriculum.held_out_number(n) for n in held), (split, held[:20])


# --- the chat template, through transformers and vLLM's request objects ------------------------------------


@pytest.fixture(scope="module")
def tok():
    """The committed tokenizer as vLLM loads it (transformers), carrying the mini's chat template."""
    return load_tokenizer(WEIGHTS, TRAINED_RECIPE)


def _tool_samples(split: str, n: int) -> list[Sample]:
    return _samples(split, "tool", n)


def _assistant_call(s: Sample) -> dict[str, Any]:
    """The assistant turn as vLLM hands it to the template: arguments already parsed into a dict."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": s.meta["expected"]["name"], "arguments": s.meta["expected"]["arguments"]},
            }
        ],
    }


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_chat_template_renders_what_transformers_renders(tok, split: str) -> None:
    for s in _tool_samples(split, 20):
        prompt = tok.apply_chat_template(
            s.meta["messages"], tools=s.meta["tools"], tokenize=False, add_generation_prompt=True
        )
        assert prompt == s.prompt
        full = tok.apply_chat_template(
            s.meta["messages"] + [_assistant_call(s)],
            tools=s.meta["tools"],
            tokenize=False,
            add_generation_prompt=False,
        )
        assert full.startswith(s.text) and not full[len(s.text) :].strip(), (
            "a training document is the rendered conversation, up to its end-of-sequence"
        )


def test_chat_template_renders_tools_as_vllm_passes_them(tok) -> None:
    """vLLM renders `[tool.model_dump() for tool in request.tools]`, not the request's JSON: same prompt."""
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    for s in _tool_samples("train", 10):
        request = protocol.ChatCompletionRequest(model="mini", messages=s.meta["messages"], tools=s.meta["tools"])
        tools = [t.model_dump() for t in request.tools]
        assert (
            tok.apply_chat_template(s.meta["messages"], tools=tools, tokenize=False, add_generation_prompt=True)
            == s.prompt
        )


# --- tool calls through vLLM's poolside_v1 parser ----------------------------------------------------------


def _vllm_calls(tok, s: Sample, text: str) -> list[dict[str, Any]]:
    """vLLM's non-streaming poolside_v1 parse of `text`, answering the sample's chat request."""
    parser_mod = pytest.importorskip("vllm.tool_parsers.poolside_v1_tool_parser")
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
    request = protocol.ChatCompletionRequest(model="mini", messages=s.meta["messages"], tools=s.meta["tools"])
    parser = parser_mod.PoolsideV1ToolParser(tok, request.tools)
    assert parser.tool_call_start_token_id is not None and parser.tool_call_end_token_id is not None, (
        "the tool-call markers must be tokens of the vocabulary"
    )
    info = parser.extract_tool_calls(text, request)
    assert info.tools_called and info.content is None, info
    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in info.tool_calls]


def _as_generated(tok, s: Sample) -> str:
    """The completion as the engine's detokenizer gives it back (tool markers kept: not special tokens)."""
    text = tok.decode(tok(s.completion, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    assert text == s.completion
    return text


def test_vllm_parses_a_training_tool_call_into_its_name_and_typed_arguments(tok) -> None:
    s = _tool_samples("train", 1)[0]
    calls = _vllm_calls(tok, s, _as_generated(tok, s))
    assert len(calls) == 1 and calls[0]["name"] == s.meta["expected"]["name"]
    tool = next(t["function"] for t in s.meta["tools"] if t["function"]["name"] == calls[0]["name"])
    python_type = {"integer": int, "string": str}
    assert set(calls[0]["arguments"]) == set(tool["parameters"]["properties"])
    for key, spec in tool["parameters"]["properties"].items():
        assert type(calls[0]["arguments"][key]) is python_type[spec["type"]], (key, calls[0]["arguments"])
    assert calls[0]["arguments"] == s.meta["expected"]["arguments"]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_our_tool_call_parser_agrees_with_vllms(tok, split: str) -> None:
    """evaluate.parse_tool_calls scores the training log; it must read a call exactly as vLLM's parser does
    (types included: json.dumps tells 1 from "1" and from true)."""
    samples = _tool_samples(split, 50)
    assert {type(v) for s in samples for v in s.meta["expected"]["arguments"].values()} == {int, str}
    for s in samples:
        text = _as_generated(tok, s)
        ours, theirs = evaluate.parse_tool_calls(text), _vllm_calls(tok, s, text)
        assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)
        assert json.dumps(theirs[0]["arguments"], sort_keys=True) == json.dumps(
            s.meta["expected"]["arguments"], sort_keys=True
        )


# --- scorers: a right completion passes, a corrupted one fails -----------------------------------------


def _rename_argument(s: Sample) -> str:
    arg = _code_function(s).args.args[0].arg
    return re.sub(rf"\b{re.escape(arg)}\b", arg + "_gone", s.completion)


def _rename_first_field(s: Sample) -> str:
    field = next(iter(json.loads(s.completion)))
    return s.completion.replace(json.dumps(field) + ":", json.dumps(field + "x") + ":", 1)


def _rename_tool(s: Sample) -> str:
    name = s.meta["expected"]["name"]
    return s.completion.replace(name, name + "x", 1)


def _change_a_digit(s: Sample) -> str:
    first, rest = s.completion.split("\n", 1)
    digit = list(re.finditer(r"\d", first))[-1]
    new = str((int(digit.group()) + 1) % 10)
    return first[: digit.start()] + new + first[digit.end() :] + "\n" + rest


CORRUPT: dict[str, Callable[[Sample], str]] = {
    "code": _rename_argument,
    "json": _rename_first_field,
    "tool": _rename_tool,
    "retrieval": _change_a_digit,
}


def _scored_samples(family: str) -> list[Sample]:
    """Code: one sample of every function shape (each runs in a subprocess); the others: ten a split."""
    if family != "code":
        return [s for split in ("train", "heldout") for s in _samples(split, family, 10)]
    picked: dict[tuple[str, str], Sample] = {}
    for split in curriculum.SPLITS:
        for i in range(400):
            s = curriculum.sample(split, SEED, i, family)
            picked.setdefault((split if split == "unseen" else "seen", s.meta["shape"]), s)
    shapes = {shape for _, shape in picked}
    assert len(shapes) >= 10, f"only {sorted(shapes)} code shapes drawn"
    return list(picked.values())


@pytest.mark.parametrize("family", sorted(CORRUPT))
def test_scorers_pass_the_curriculums_answer_and_fail_a_corrupted_one(family: str) -> None:
    for s in _scored_samples(family):
        assert evaluate.score(s, s.completion), (s.prompt[-200:], s.completion)
        corrupted = CORRUPT[family](s)
        assert corrupted != s.completion
        assert not evaluate.score(s, corrupted), (s.prompt[-200:], corrupted)


def test_prose_has_no_scorer() -> None:
    """Nothing may pass silently: a family without a scorer is an error, not a success."""
    with pytest.raises(ValueError):
        evaluate.score(curriculum.sample("heldout", SEED, 0, "prose"), "anything")
