"""Contracts: validated on load with errors that name the field and the file; canonical digests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract

SHIPPED = [
    "laguna-s-2.1-int4-fp8kv-b70",
    "mini-laguna-cpu",
    "mini-laguna-cpu-int4",
    "mini-laguna-cpu-path",
    "mini-laguna-cpu-tp4ep4",
]


def test_the_shipped_contracts_load() -> None:
    assert contract.available() == SHIPPED
    digests = {contract.load(name).digest for name in SHIPPED}
    assert len(digests) == len(SHIPPED)


def test_production_contract_holds_the_seed_values() -> None:
    c = contract.load("laguna-s-2.1-int4-fp8kv-b70")
    assert (c.target.hub_id, c.target.revision) == (
        "poolside/Laguna-S-2.1-INT4",
        "4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb",
    )
    assert (c.draft.hub_id, c.draft.revision) == (
        "poolside/Laguna-S-2.1-DFlash-INT4",
        "5e07c246915c86dc6920fead03d019989224f2ba",
    )
    assert (c.engine.tensor_parallel, c.engine.expert_parallel, c.engine.kv_cache_dtype) == (4, True, "fp8")
    assert c.engine.calculate_kv_scales is False
    assert (c.expect.target_kv_scale_count, c.expect.draft_unit_scale_layers) == (96, 6)
    assert c.expect.target_kv_scale_digest == "3e6df440976ab2ed5229e1a39179cbc99d573c615386f223eeabc9de5ea9ddc0"
    assert (c.speculative.verify_width, c.speculative.num_speculative_tokens) == (12, 11)
    assert (c.expect.compile_graphs, c.expect.compile_breaks) == (145, 144)
    assert c.expect.attention_backend == "FLASH_ATTN" and c.prompts.count == 13


def test_teacher_is_the_contract_without_speculation() -> None:
    c = contract.load("mini-laguna-cpu")
    t = c.teacher()
    assert t.kind == "teacher" and t.draft is None and t.speculative is None
    assert t.engine == c.engine and t.prompts == c.prompts and t.decode == c.decode
    assert t.digest != c.digest and t.teacher() is t
    assert t.digest == c.teacher().digest, "derivation is deterministic"


def test_the_teacher_expects_the_targets_graphs_alone() -> None:
    """On CPU each model's forward is one compiled graph: the teacher lacks the draft's. The recorded teacher
    bundle compiled exactly that many on every rank; elsewhere (XPU, piecewise) nothing is assumed."""
    from pytest_b70lab.evidence import record as evidence
    from pytest_b70lab.judge import topology

    c = contract.load("mini-laguna-cpu")
    assert (c.expect.compile_graphs, c.teacher().expect.compile_graphs) == (2, 1)
    recorded = evidence.read(Path(__file__).parents[2] / "fixtures/evidence/mini-laguna-cpu-teacher/start-1")
    for rank in range(c.engine.tensor_parallel):
        assert topology.compile_topology(recorded, rank, c.teacher()).passed
        assert not topology.compile_topology(
            recorded, rank, c.teacher().model_copy(update={"expect": c.expect})
        ).passed, "the candidate's count is not the target's alone"
    production = contract.load("laguna-s-2.1-int4-fp8kv-b70")
    assert production.teacher().expect.compile_graphs == production.expect.compile_graphs


def test_digest_ignores_toml_formatting_but_not_values(tmp_path: Path) -> None:
    src = contract.resolve_path("mini-laguna-cpu")
    text = src.read_text()
    reformatted = tmp_path / "a.toml"
    reformatted.write_text("# a comment\n" + text.replace(" = ", "="))
    assert contract.load(reformatted).digest == contract.load(src).digest
    changed = tmp_path / "b.toml"
    changed.write_text(text.replace("block_size = 32", "block_size = 64"))
    assert contract.load(changed).digest != contract.load(src).digest


def _mutated(tmp_path: Path, old: str, new: str) -> Path:
    text = contract.resolve_path("mini-laguna-cpu").read_text()
    assert old in text, old
    p = tmp_path / "bad.toml"
    p.write_text(text.replace(old, new, 1))
    return p


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("block_size = 32", 'block_size = "32"', "engine.block_size"),
        ("block_size = 32", "block_size = 32\nblock_sise = 32", "engine.block_sise: Extra inputs are not permitted"),
        ("enable_prefix_caching = false", "enable_prefix_caching = true", "engine.enable_prefix_caching"),
        ("max_num_seqs = 1", "max_num_seqs = 4", "engine.max_num_seqs"),
        ("verify_width = 12", "verify_width = 11", "verify_width 11 must be num_speculative_tokens + 1 (12)"),
        ('[draft]\nsource = "mini"\n', "", "draft and speculative go together"),
        ('target_kv_scale_digest = "', 'target_kv_scale_digest = "x', "expect.target_kv_scale_digest"),
        ("tokens_per_request = 100", "tokens_per_request = 1", "decode.tokens_per_request"),
        ("fresh_starts = 2", "fresh_starts = 1", "a candidate needs at least 2 fresh starts"),
        ('dtype = "float32"', 'dtype = "auto"', "engine.dtype"),
        (
            '[target]\nsource = "mini"\n',
            '[target]\nsource = "mini"\nif_missing = "mini-export"\n',
            "if_missing applies to a path model only",
        ),
        (
            "compile_breaks = 0",
            'compile_breaks = 0\nload_audit_exempt = { "*.weight_shape" = "" }',
            "expect.load_audit_exempt.*.weight_shape",
        ),
        (
            'kv_cache_dtype = "fp8"',
            'kv_cache_dtype = "auto"',
            '"auto" is only for the derived unquantized-KV reference',
        ),
        ("alpha = 0.05", "alpha = 0.5", "quality.alpha"),
        ("alpha = 0.05", "alpha = 0.05\nmargin = 0.1", "quality.margin: Extra inputs are not permitted"),
        (
            'unquantized_kv_target = { source = "mini" }',
            'unquantized_kv_target = { source = "path" }',
            "quality.unquantized_kv_target",
        ),
        ('tool_call_parser = "poolside_v1"', "tool_call_parser = 1", "chat.tool_call_parser"),
        (
            'file = "fixtures/prompts/mini-v3.jsonl"',
            'file = "fixtures/../../elsewhere/prompts.jsonl"',
            "prompts.file: Value error, 'fixtures/../../elsewhere/prompts.jsonl' climbs out of the repository",
        ),
        ('file = "fixtures/quality/mini-quality-v1.jsonl"', 'file = "../quality.jsonl"', "quality.file: Value error"),
        (
            '[target]\nsource = "mini"\n',
            '[target]\nsource = "path"\npath = "../models/target"\n',
            "target.path: Value error, '../models/target' climbs out of the repository with '..'",
        ),
    ],
)
def test_an_invalid_field_is_named(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = _mutated(tmp_path, old, new)
    with pytest.raises(contract.ContractError) as err:
        contract.load(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_an_absolute_model_path_stays_allowed(tmp_path: Path) -> None:
    """Models on other disks: absolute, shown as they are (only relative paths may not climb with '..')."""
    path = _mutated(
        tmp_path, '[target]\nsource = "mini"\n', '[target]\nsource = "path"\npath = "/models/../models/laguna/target"\n'
    )
    assert contract.load(path).target.path == "/models/../models/laguna/target"


def test_not_toml_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "x.toml"
    p.write_text("name = [unclosed")
    with pytest.raises(contract.ContractError, match="is not valid TOML"):
        contract.load(p)


def test_unknown_contract_name_lists_the_known_ones() -> None:
    with pytest.raises(contract.ContractError, match="known: laguna-s-2.1-int4-fp8kv-b70, mini-laguna-cpu"):
        contract.load("no-such-contract")


def test_a_changed_prompt_set_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = contract.load("mini-laguna-cpu")
    copy = tmp_path / "prompts.jsonl"
    shutil.copy(contract.prompts_path(c), copy)
    text = copy.read_text()
    copy.write_text(text.replace("e", "E", 1))  # one byte of the first prompt
    assert copy.read_text() != text
    pinned = contract.prompts_path(c).relative_to(Path(__file__).resolve().parents[2]).as_posix()
    p = _mutated(tmp_path, f'file = "{pinned}"', f'file = "{copy}"')
    with pytest.raises(contract.ContractError, match="the prompts changed"):
        contract.load(p)


def test_prompt_set_loads_with_unique_ids() -> None:
    c = contract.load("mini-laguna-cpu")
    prompts = contract.load_prompts(c)
    assert len(prompts) == c.prompts.count == len({p.id for p in prompts})


def test_the_tables_added_later_leave_older_digests_alone() -> None:
    """A contract without [chat] and [quality] hashes as it did before they existed: evidence recorded then
    still replays. The mini default has both, and they change its digest but not its teacher."""
    plain = contract.load("mini-laguna-cpu-path")
    assert "chat" not in plain.canonical() and "quality" not in plain.canonical()
    mini = contract.load("mini-laguna-cpu")
    assert mini.quality is not None and mini.chat is not None
    bare = contract.Contract.model_validate(
        {k: v for k, v in mini.canonical().items() if k not in ("chat", "quality")}, strict=False
    )
    assert bare.digest != mini.digest and bare.output_digest == mini.output_digest


def test_the_unquantized_kv_reference_is_the_teacher_without_the_kv_scheme() -> None:
    mini = contract.load("mini-laguna-cpu")
    ref = mini.unquantized_kv_reference()
    assert (ref.kind, ref.engine.kv_cache_dtype, ref.draft, ref.speculative) == ("reference", "auto", None, None)
    assert ref.engine.tensor_parallel == mini.engine.tensor_parallel and ref.prompts == mini.prompts
    with pytest.raises(contract.ContractError, match="names no quality.unquantized_kv_target"):
        contract.load("laguna-s-2.1-int4-fp8kv-b70").unquantized_kv_reference()


def test_the_paired_tolerance_falls_back_and_keeps_older_digests() -> None:
    """Without a paired_tolerance the paired figure is held to throughput_tolerance and the digest is the one
    recorded before the field existed; setting it is a change of contract."""
    mini = contract.load("laguna-s-2.1-int4-fp8kv-b70")  # sequential, one tolerance for both figures
    assert mini.reproduction.paired_tolerance is None
    assert mini.reproduction.paired == mini.reproduction.throughput_tolerance
    assert "paired_tolerance" not in mini.canonical()["reproduction"]
    data = mini.canonical()
    data["reproduction"]["paired_tolerance"] = 0.1
    tight = contract.Contract.model_validate(data, strict=False)
    assert tight.reproduction.paired == 0.1 and tight.digest != mini.digest
    assert tight.output_digest == mini.output_digest
    data["reproduction"]["paired_tolerance"] = 1.5
    with pytest.raises(ValueError, match="paired_tolerance"):
        contract.Contract.model_validate(data, strict=False)
