"""Write the mini's gate prompt set (fixtures/prompts/mini-v3.jsonl) from the curriculum's held-out split.

Held-out prompts of every family, so that the gates decode what the mini was trained to do (long accepted
draft runs) on text it never saw. Deterministic: rerunning writes the same bytes; the contracts pin the sha256.
    .venv/bin/python scripts/make_mini_prompts.py [OUT]
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from pytest_b70lab.mini import curriculum

# (family, held-out index, needle pairs): two code shapes, a tool call, a schema, prose and a needle.
PLAN = [("code", 0, 0), ("code", 5, 0), ("tool", 1, 0), ("json", 2, 0), ("prose", 3, 0), ("retrieval", 4, 40)]
CATEGORY = {"code": "code", "tool": "tool", "json": "structured", "prose": "prose", "retrieval": "retrieval"}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures/prompts/mini-v3.jsonl")
    lines = []
    for family, index, pairs in PLAN:
        s = curriculum.sample("heldout", 0, index, family, n_pairs=pairs or 20)
        # /v1/completions puts `<s>` in front itself: a chat prompt goes without its own.
        prompt = s.prompt.removeprefix(curriculum.BOS)
        name = s.meta.get("function") or s.meta.get("expected", {}).get("name") if family in ("code", "tool") else None
        lines.append(
            json.dumps(
                {"id": f"{family}-{name or index}".replace("_", "-"), "prompt": prompt, "category": CATEGORY[family]}
            )
        )
    out.write_text("\n".join(lines) + "\n")
    print(out, len(lines), "prompts, sha256", hashlib.sha256(out.read_bytes()).hexdigest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
