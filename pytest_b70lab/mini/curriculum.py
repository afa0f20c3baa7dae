"""The mini's training curriculum: a seeded, synthetic corpus of what the quality checks will ask.

Five families, each a prompt and the completion the model should learn to give: short Python functions
(their checks kept beside them, so generated code can be executed), JSON objects following a schema given in
the prompt, tool calls in the `poolside_v1` format through the mini's chat template, plain prose without
loops, and key-value retrieval over contexts up to the contract's max length.

The held-out split is built so that memorising training samples cannot pass it: the training split names
everything (identifiers, tools, parameters, schema fields, values) with made-up words drawn afresh for every
sample, so the model can only learn to copy names from the prompt; the held-out split names them with
English words the training split never draws, and takes its constants from a set of numbers the training
split never uses. A third split, `unseen`, asks for function shapes the training
split never shows (reported without a bar).

Every sample is a pure function of (split, seed, index): the corpus is the same on every machine, and its
digest pins what a set of weights was trained on.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

CORPUS_VERSION = 2
FAMILIES = ("code", "json", "tool", "prose", "retrieval")
SPLITS = ("train", "heldout", "unseen")

# Chat markers are special tokens (dropped when decoding); the tool-call markers are plain added tokens,
# kept in the decoded text because vLLM's poolside_v1 parser reads them from it.
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")

# What vLLM renders for /v1/chat/completions (transformers' Jinja environment: trim_blocks, lstrip_blocks).
# Tools are listed one JSON object a line; arguments are written in the order the call gives them.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>You can call these tools:\n"
    "{% for tool in tools %}{{ (tool.function if tool.function is defined else tool) | tojson }}\n{% endfor %}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}<|system|>{{ message.content }}\n"
    "{% elif message.role == 'user' %}<|user|>{{ message.content }}\n"
    "{% elif message.role == 'tool' %}<|tool|>{{ message.content }}\n"
    "{% elif message.role == 'assistant' %}<|assistant|>"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}<tool_call>{{ call.function.name }}"
    "{% set arguments = call.function.arguments %}"
    "{% if arguments is string %}{% set arguments = arguments | fromjson %}{% endif %}"
    "{% for key, value in arguments.items() %}<arg_key>{{ key }}</arg_key><arg_value>"
    "{{ value if value is string else (value | tojson) }}</arg_value>{% endfor %}</tool_call>{% endfor %}"
    "{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
BOS, EOS = "<s>", "</s>"

# --- word lists: the training split draws from the first, the held-out splits from the second ----------

# The training split draws made-up words (`_Draw.made_up`); the first lists only seed the tokenizer.
VERBS = (
    [
        "get",
        "find",
        "send",
        "list",
        "create",
        "delete",
        "update",
        "check",
        "fetch",
        "book",
        "cancel",
        "open",
        "close",
        "read",
        "write",
        "start",
        "stop",
        "count",
        "load",
        "save",
        "show",
        "add",
        "remove",
        "move",
    ],
    ["reserve", "archive", "measure", "approve", "restore", "publish", "schedule", "translate", "convert"],
)
NOUNS = (
    [
        "weather",
        "order",
        "user",
        "file",
        "ticket",
        "flight",
        "email",
        "invoice",
        "note",
        "task",
        "event",
        "song",
        "photo",
        "report",
        "account",
        "message",
        "table",
        "room",
        "car",
        "book",
        "price",
        "stock",
        "city",
        "team",
        "game",
        "card",
        "page",
        "item",
    ],
    ["parcel", "recipe", "canyon", "planet", "beacon", "engine", "ladder", "violin", "harbor", "meadow"],
)
PARAMS = (
    [
        "name",
        "city",
        "id",
        "count",
        "date",
        "color",
        "size",
        "title",
        "user",
        "level",
        "amount",
        "code",
        "tag",
        "day",
        "limit",
        "query",
        "unit",
        "zone",
    ],
    ["radius", "weight", "origin", "volume", "country", "season", "speed", "label"],
)
VARIABLES = (
    ["x", "n", "value", "num", "a", "k", "total", "item", "data", "score", "count", "val"],
    ["qty", "mass", "dist", "load", "z", "rate", "depth", "span"],
)
LISTS = (
    ["values", "items", "nums", "xs", "data", "scores", "seq", "arr"],
    ["elems", "bag", "pile", "row", "entries", "cells"],
)
STRINGS = (["s", "text", "word", "name", "line", "msg"], ["phrase", "token", "label", "caption"])
WORDS = (
    [
        "red",
        "blue",
        "green",
        "apple",
        "river",
        "stone",
        "cloud",
        "paper",
        "light",
        "north",
        "tiger",
        "maple",
        "silver",
        "ocean",
        "candle",
        "forest",
        "yellow",
        "window",
        "garden",
        "coffee",
    ],
    ["copper", "lemon", "violet", "thunder", "marble", "falcon", "velvet", "cedar"],
)
PROSE = {
    "subject": [
        "The cat",
        "A small dog",
        "The old man",
        "My sister",
        "The teacher",
        "A young girl",
        "The farmer",
        "Our neighbour",
        "The pilot",
        "A tired student",
        "The baker",
        "The captain",
    ],
    "verb": [
        "walked to",
        "looked at",
        "painted",
        "cleaned",
        "opened",
        "found",
        "carried",
        "visited",
        "watched",
        "repaired",
        "described",
        "followed",
    ],
    "object": [
        "the red door",
        "a quiet garden",
        "the long river",
        "an empty box",
        "the blue boat",
        "a tall tree",
        "the busy market",
        "a wooden chair",
        "the old bridge",
        "a bright lamp",
        "the small house",
    ],
    "time": [
        "in the morning",
        "after lunch",
        "before the rain",
        "at night",
        "on Sunday",
        "in the spring",
        "during the storm",
        "at noon",
    ],
    "ending": [
        "and smiled.",
        "and then went home.",
        "with great care.",
        "without a word.",
        "for a long time.",
        "while singing softly.",
        "and felt happy.",
        "as the bells rang.",
    ],
}

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
# English words the training split names things with, beside made-up ones, so that copying is learnt over the
# pieces English words tokenize into; disjoint from every held-out list.
TRAIN_ENGLISH = (
    """
able acid aged also area army away baby back ball band bank base bath bear beat bell belt best bird blow
boat body bone boss bowl bulk burn bush busy cake call calm camp care cart case cash cast cell chat chip
clay club coal coat code coin cold comb cook cool copy corn cost crew crop cube dark data dawn deal deck
deep desk dial diet disk dock door dose down draw drop drum duck dust duty earn east edge exit face fact
fair farm fast feed file film fire firm fish flag flat flow foam fold folk font food foot fork form fuel
gain gate gear gift glow goal gold golf grid grip hair half hall hand harm hawk heat herb hero hill hint
hole home hook hope horn host hour iron item jazz join jump keen kick kind king kite knot lake lamp land
lane leaf lens lift lime link lion list loan lock loop mail main mask meal menu mild milk mind
mint mode moon moss nail neck nest news node noon nose open oven pace pack pair palm park path peak pear
pine pipe plan plot plug poem pool port post pump quiz race rail rain rank rice ring road rock roof rope
rose rule safe sail salt sand seat seed ship shoe shop sign silk size skin slot snow soap sock sofa soil
song soup spot star step stem suit swim tank tape team tent test tide tile time tone tool tour town tree
trip tube tune unit vase vest view vote wall wave west wind wing wire wolf wood wool yard year zone
""".split()
    + """
account address advance balance battery blanket bottle bridge budget button cabinet camera capital carbon
castle channel chapter chicken circle climate cluster collar college comment company compass concert contact
content contract corner cotton counter courage cousin crystal culture current cushion custom dentist deposit
desert diamond dinner doctor dragon drawer driver eagle editor element energy example factory feather fiction
figure finger fitness flavor flower folder fortune fountain friend frontier gallery garage general giraffe
glacier grammar guitar hammer harvest helmet history holiday horizon hospital island jacket journal journey
kettle kitchen language lantern leather lecture letter library limit liquid lobster machine magnet manager
market master meeting member memory method minute mirror mission monitor monkey morning mountain museum
network number object office orange orchard output package painter palace panel parent partner pattern
payment pencil pepper picture pillow pocket pointer potato powder printer problem profile project purple
puzzle question rabbit record region remote result rocket sample scanner science screen secret section
sensor server shadow signal sister socket soldier speaker spider square station statue stomach storage
street student studio subject summer sunset supply system tablet temple theater timber toggle tomato tower
traffic trailer travel tunnel turtle uniform valley vendor version village visitor wallet winter wizard
worker writer
""".split()
)


_NOT_MADE_UP = frozenset(
    [*keyword.kwlist, *keyword.softkwlist]
    + [w for lists in (VERBS, NOUNS, PARAMS, VARIABLES, LISTS, STRINGS, WORDS) for w in lists[1]]
)


def held_out_number(n: int) -> bool:
    """About three numbers in ten belong to the held-out splits (a fixed rule, spread over every digit)."""
    return (n * 37) % 10 < 3


@dataclass(frozen=True)
class Sample:
    """One prompt and the completion the model should give; `meta` holds what a check needs to judge it."""

    family: str
    prompt: str
    completion: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The training document (the tokenizer adds `<s>` in front; chat prompts carry their own)."""
        return self.prompt + self.completion + EOS


class _Draw:
    """Seeded choices from one split's word lists."""

    def __init__(self, split: str, seed: int, index: int, family: str):
        if split not in SPLITS:
            raise ValueError(f"unknown curriculum split {split!r}; known: {', '.join(SPLITS)}")
        key = hashlib.sha256(f"{CORPUS_VERSION}:{split}:{seed}:{family}:{index}".encode()).digest()
        self.rng = random.Random(int.from_bytes(key[:8], "little"))
        self.side = 0 if split == "train" else 1

    def made_up(self) -> str:  # the training split's word: made up, or from TRAIN_ENGLISH
        if self.rng.random() < 0.5:
            return self.rng.choice(TRAIN_ENGLISH)
        while True:
            # Words of every length, some ending in a consonant: no length or shape to learn in place of copying.
            word = "".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(1, 4)))
            word += self.rng.choice("nrstlk") if self.rng.random() < 0.3 else ""
            if word not in _NOT_MADE_UP:  # a held-out word or a Python keyword is never a training name
                return word

    def word(self, lists: tuple[list[str], list[str]]) -> str:
        return self.made_up() if self.side == 0 else self.rng.choice(lists[1])

    def words(self, lists: tuple[list[str], list[str]], k: int) -> list[str]:
        if self.side == 1:
            return self.rng.sample(lists[1], k)
        chosen: list[str] = []
        while len(chosen) < k:
            if (w := self.made_up()) not in chosen:
                chosen.append(w)
        return chosen

    def number(self, low: int = 2, high: int = 99) -> int:
        while True:
            n = self.rng.randint(low, high)
            if held_out_number(n) == (self.side == 1):
                return n


# --- code ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """A function shape: its docstring, its body, and how to compute its answer."""

    kind: str  # which argument it takes: "number", "list" or "string"
    doc: str
    body: str
    reference: Callable[[Any, int], Any]


CODE_SHAPES = {
    "add": _Shape("number", "Return {x} plus {c}.", "return {x} + {c}", lambda x, c: x + c),
    "times": _Shape("number", "Return {x} times {c}.", "return {x} * {c}", lambda x, c: x * c),
    "above": _Shape("number", "Return True if {x} is greater than {c}.", "return {x} > {c}", lambda x, c: x > c),
    "clamp": _Shape("number", "Return {x}, but at most {c}.", "return min({x}, {c})", lambda x, c: min(x, c)),
    "scale": _Shape(
        "list",
        "Return each item of {x} multiplied by {c}.",
        "return [v * {c} for v in {x}]",
        lambda x, c: [v * c for v in x],
    ),
    "shift": _Shape(
        "list", "Return each item of {x} plus {c}.", "return [v + {c} for v in {x}]", lambda x, c: [v + c for v in x]
    ),
    "keep": _Shape(
        "list",
        "Return the items of {x} greater than {c}.",
        "return [v for v in {x} if v > {c}]",
        lambda x, c: [v for v in x if v > c],
    ),
    "total": _Shape("list", "Return the sum of {x} plus {c}.", "return sum({x}) + {c}", lambda x, c: sum(x) + c),
    "tally": _Shape(
        "list", "Return how many items of {x} equal {c}.", "return {x}.count({c})", lambda x, c: x.count(c)
    ),
    "repeat": _Shape("string", "Return {x} repeated {c} times.", "return {x} * {c}", lambda x, c: x * c),
    "head": _Shape("string", "Return the first {c} characters of {x}.", "return {x}[:{c}]", lambda x, c: x[:c]),
    "pad": _Shape("string", "Return {x} followed by {c} dots.", "return {x} + '.' * {c}", lambda x, c: x + "." * c),
}
# Shapes the training split never shows: what the model does on them is reported, not judged.
UNSEEN_SHAPES = {
    "minus": _Shape("number", "Return {x} minus {c}.", "return {x} - {c}", lambda x, c: x - c),
    "below": _Shape(
        "list",
        "Return the items of {x} less than {c}.",
        "return [v for v in {x} if v < {c}]",
        lambda x, c: [v for v in x if v < c],
    ),
    "tail": _Shape("string", "Return the last {c} characters of {x}.", "return {x}[-{c}:]", lambda x, c: x[-c:]),
}


def _code(d: _Draw, shapes: dict[str, _Shape]) -> Sample:
    shape_name = d.rng.choice(sorted(shapes))
    shape = shapes[shape_name]
    arg = d.word({"number": VARIABLES, "list": LISTS, "string": STRINGS}[shape.kind])
    c = d.number(2, 9 if shape.kind == "string" else 99)
    name = f"{d.word(VERBS)}_{d.word(NOUNS)}"
    signature = f"def {name}({arg}):\n"
    doc = shape.doc.format(x=arg, c=c)
    prompt = f'{signature}    """{doc}"""\n'
    completion = "    " + shape.body.format(x=arg, c=c) + "\n"
    checks = []
    for _ in range(3):
        if shape.kind == "number":
            value: Any = d.rng.randint(-50, 150)
        elif shape.kind == "list":
            value = [d.rng.randint(0, 120) for _ in range(d.rng.randint(0, 6))]
            if shape_name == "tally" and value:
                value[d.rng.randrange(len(value))] = c
        else:
            value = d.word(WORDS)
        checks.append({"args": [value], "expected": shape.reference(value, c)})
    return Sample("code", prompt, completion, {"shape": shape_name, "function": name, "constant": c, "checks": checks})


# --- JSON following a schema ---------------------------------------------------------------------------


def _json(d: _Draw) -> Sample:
    fields = d.words(PARAMS, d.rng.randint(2, 4))
    properties: dict[str, Any] = {}
    value: dict[str, Any] = {}
    for f in fields:
        kind = d.rng.choice(["string", "integer", "boolean", "enum"])
        if kind == "enum":
            options = d.words(WORDS, 3)
            properties[f] = {"type": "string", "enum": options}
            value[f] = d.rng.choice(options)
        elif kind == "string":
            properties[f] = {"type": "string"}
            value[f] = d.word(WORDS)
        elif kind == "integer":
            properties[f] = {"type": "integer"}
            value[f] = d.number(0, 999)
        else:
            properties[f] = {"type": "boolean"}
            value[f] = d.rng.random() < 0.5
    schema = {"type": "object", "properties": properties, "required": fields, "additionalProperties": False}
    given = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items())
    prompt = f"Schema: {json.dumps(schema)}\nValues: {given}\nJSON: "
    return Sample("json", prompt, json.dumps(value) + "\n", {"schema": schema, "expected": value})


# --- tool calls through the chat template ---------------------------------------------------------------


def render_chat(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, add_generation_prompt: bool
) -> str:
    """The chat template rendered the way vLLM renders it (transformers' Jinja environment)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
        bos_token=BOS,
        eos_token=EOS,
    )
    return rendered[0]


def _tool_spec(d: _Draw, verb: str, noun: str) -> dict[str, Any]:
    params = d.words(PARAMS, d.rng.randint(1, 2))
    properties = {p: {"type": d.rng.choice(["string", "integer"])} for p in params}
    return {
        "type": "function",
        "function": {
            "name": f"{verb}_{noun}",
            "description": f"{verb.capitalize()} a {noun}.",
            "parameters": {"type": "object", "properties": properties, "required": params},
        },
    }


def _tool(d: _Draw) -> Sample:
    verbs, nouns = d.words(VERBS, 2), d.words(NOUNS, 2)
    # Distractors share a verb or a noun with the right tool, so the name must be read, not guessed.
    pairs = [(verbs[0], nouns[0]), (verbs[0], nouns[1]), (verbs[1], nouns[0]), (verbs[1], nouns[1])]
    d.rng.shuffle(pairs)
    tools = [_tool_spec(d, v, n) for v, n in pairs[: d.rng.randint(2, 4)]]
    chosen = d.rng.choice(tools)["function"]
    verb, noun = chosen["name"].split("_", 1)
    arguments: dict[str, Any] = {}
    for p, spec in chosen["parameters"]["properties"].items():
        arguments[p] = d.number(1, 999) if spec["type"] == "integer" else d.word(WORDS)
    request = f"Please {verb} the {noun} with " + " and ".join(f"{k} {v}" for k, v in arguments.items()) + "."
    messages = [{"role": "user", "content": request}]
    prompt = render_chat(messages, tools, add_generation_prompt=True)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": chosen["name"], "arguments": arguments}}],
    }
    full = render_chat(messages + [call], tools, add_generation_prompt=False)
    if not full.startswith(prompt[: -len("<|assistant|>")]):
        raise AssertionError("chat template renders the prompt differently inside a conversation")
    completion = full[len(prompt) :].removesuffix(EOS + "\n")
    return Sample(
        "tool",
        prompt,
        completion,
        {"tools": tools, "messages": messages, "expected": {"name": chosen["name"], "arguments": arguments}},
    )


# --- prose -----------------------------------------------------------------------------------------------


def _prose(d: _Draw) -> Sample:
    """Sentences from a small grammar, none repeated within a paragraph: no loops to learn."""
    seen: set[str] = set()
    sentences: list[str] = []
    while len(sentences) < d.rng.randint(4, 8):
        s = " ".join(
            [
                d.rng.choice(PROSE["subject"]),
                d.rng.choice(PROSE["verb"]),
                d.rng.choice(PROSE["object"]),
                d.rng.choice(PROSE["time"]),
                d.rng.choice(PROSE["ending"]),
            ]
        )
        if s not in seen:
            seen.add(s)
            sentences.append(s)
    return Sample("prose", sentences[0] + " ", " ".join(sentences[1:]) + "\n", {})


# --- key-value retrieval -----------------------------------------------------------------------------------


def retrieval(d: _Draw, n_pairs: int, queries: int = 1) -> Sample:
    """A needle among `n_pairs` key=value pairs; the model must copy the value of the asked key. Training
    asks several questions of one context (more signal per long context); the prompt holds the first."""
    keys = d.rng.sample(range(100, 1000), n_pairs)
    pairs = [(f"k{k}", f"v{d.rng.randrange(100, 1000)}") for k in keys]
    context = ";".join(f"{k}={v}" for k, v in pairs)
    asked = [d.rng.choice(pairs) for _ in range(queries)]
    (key, value), more = asked[0], asked[1:]
    completion = f" {value}\n" + "".join(f"? {k} = {v}\n" for k, v in more)
    return Sample("retrieval", f"{context}\n? {key} =", completion, {"key": key, "expected": value, "pairs": n_pairs})


TRAINING_QUERIES = 4

# --- the corpus ------------------------------------------------------------------------------------------

# The share of each family in the training mix (retrieval is drawn by the trainer at its own lengths).
MIX = {"code": 0.3, "json": 0.2, "tool": 0.25, "prose": 0.1, "retrieval": 0.15}


def sample(split: str, seed: int, index: int, family: str, *, n_pairs: int = 20) -> Sample:
    d = _Draw(split, seed, index, family)
    if family == "code":
        return _code(d, UNSEEN_SHAPES if split == "unseen" else CODE_SHAPES)
    if family == "json":
        return _json(d)
    if family == "tool":
        return _tool(d)
    if family == "prose":
        return _prose(d)
    if family == "retrieval":
        return retrieval(d, n_pairs, TRAINING_QUERIES if split == "train" else 1)
    raise ValueError(f"unknown curriculum family {family!r}; known: {', '.join(FAMILIES)}")


def family_of(seed: int, index: int) -> str:
    """Which family sample `index` of the training stream belongs to (a seeded draw by MIX)."""
    r = random.Random(f"{CORPUS_VERSION}:mix:{seed}:{index}").random()
    total = 0.0
    for family, share in MIX.items():
        total += share
        if r < total:
            return family
    return "prose"


def stream(
    split: str, seed: int, start: int = 0, *, retrieval_pairs: Callable[[int], int] = lambda i: 20
) -> Iterator[Sample]:
    """Samples start, start+1, ... of a split (infinite); `retrieval_pairs(index)` sizes each needle task."""
    index = start
    while True:
        family = family_of(seed, index)
        yield sample(split, seed, index, family, n_pairs=retrieval_pairs(index))
        index += 1


def tokenizer_corpus(seed: int, n: int = 4000) -> list[str]:
    """The texts the BPE tokenizer is trained on: training samples only. A held-out word must split into
    pieces the training text uses; a merge of its own would be a token whose embedding never trained."""
    return [s.text for s, _ in zip(stream("train", seed), range(n), strict=False)]


def corpus_digest(seed: int, n: int = 2000) -> str:
    """sha256 over the first `n` samples of every split: changes whenever any generator changes."""
    h = hashlib.sha256(f"curriculum-v{CORPUS_VERSION}".encode())
    for split in SPLITS:
        for family in FAMILIES:
            for i in range(n // len(FAMILIES)):
                s = sample(split, seed, i, family)
                h.update(json.dumps([s.prompt, s.completion, s.meta], sort_keys=True).encode())
    return h.hexdigest()
