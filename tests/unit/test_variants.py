"""Variants of the embedded default's contract, as the sweep derives them: each a full contract, validated by
the contract rules, named by what it changes, and judged against the right teacher."""

from __future__ import annotations

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.contract import variants

BASE = "mini-laguna-cpu"


@pytest.fixture(scope="module")
def base() -> contract.Contract:
    return contract.load(BASE)


def test_a_depth_grid_moves_the_verify_width_and_keeps_the_base_teacher(base) -> None:
    found = variants.grid(base, ["speculative.num_speculative_tokens=3,7,11"])
    # The base (depth 11) comes first, as itself: the grid's 11 is the base, measured once.
    assert [v.name for v in found] == [BASE, f"{BASE}-num-speculative-tokens-3", f"{BASE}-num-speculative-tokens-7"]
    assert found[0].contract is base
    assert [(v.contract.speculative.num_speculative_tokens, v.contract.speculative.verify_width) for v in found] == [
        (11, 12),
        (3, 4),
        (7, 8),
    ]
    assert len({v.contract.digest for v in found}) == 3
    # Speculation changes speed, not the target's output: one teacher judges them all.
    assert all(v.shares_teacher(base) for v in found)
    assert all(v.contract.kind == "candidate" and v.contract.engine == base.engine for v in found)


def test_a_page_size_variant_needs_a_teacher_of_its_own(base) -> None:
    _, page64 = variants.grid(base, ["engine.block_size=64"])
    assert page64.contract.engine.block_size == 64 and not page64.shares_teacher(base)
    assert page64.contract.teacher().engine.block_size == 64


def test_two_fields_make_a_grid_with_the_last_varying_fastest(base) -> None:
    found = variants.grid(base, ["engine.block_size=32,64", "speculative.num_speculative_tokens=3,7"])
    assert [(v.contract.engine.block_size, v.contract.speculative.num_speculative_tokens) for v in found] == [
        (32, 11),
        (32, 3),
        (32, 7),
        (64, 3),
        (64, 7),
    ]


def test_the_named_variants_are_the_teacher_and_the_unquantized_reference(base) -> None:
    same, target_only, unquantized = variants.grid(base, [], extra=variants.NAMED)
    assert same.contract is base
    assert target_only.contract.digest == base.teacher().digest and target_only.contract.draft is None
    assert unquantized.contract.digest == base.unquantized_kv_reference().digest
    assert (unquantized.contract.kind, unquantized.contract.engine.kv_cache_dtype) == ("reference", "auto")
    assert not target_only.shares_teacher(base) and not unquantized.shares_teacher(base)
    assert "no teacher" in target_only.judged_against(base) and "no FP8" in unquantized.judged_against(base)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "speculative.num_speculative_token=3",
            "contract mini-laguna-cpu has no field "
            "speculative.num_speculative_token (it has method, "
            "num_speculative_tokens, verify_width)",
        ),
        ("engin.block_size=64", "has no table engin (it has "),
        (
            "speculative.num_speculative_tokens=0",
            "speculative.num_speculative_tokens: Input should be greater than or equal to 1",
        ),
        ("engine.kv_cache_dtype=auto", '"auto" is only for the derived unquantized-KV reference'),
        ("prompts.count=3", "a variant keeps the base's prompts"),
        ("engine.block_size", "expected FIELD=V1,V2"),
        ("speculative.num_speculative_tokens=3,3", "are the same contract"),
    ],
)
def test_a_variant_the_rules_refuse_is_named_before_anything_starts(base, spec, message) -> None:
    with pytest.raises(variants.VariantError) as e:
        variants.grid(base, [spec])
    assert message in str(e.value), str(e.value)


def test_values_are_read_as_toml_and_bare_words_as_strings() -> None:
    assert variants.parse_vary('a.b=3, 0.5,true,"x",fp8') == ("a.b", [3, 0.5, True, "x", "fp8"])


def test_a_variant_name_is_a_valid_contract_name(base) -> None:
    _, v = variants.grid(base, ["reproduction.throughput_tolerance=0.5"])
    assert v.name == f"{BASE}-throughput-tolerance-0.5" and v.contract.name == v.name
    assert v.shares_teacher(base)  # a gate tolerance is not part of what the teacher produced


def test_the_command_line_lists_the_sweep_s_variants_and_refuses_a_bad_one_in_one_line(capsys) -> None:
    from pytest_b70lab import cli

    assert (
        cli.main(
            ["contract", "vary", BASE, "--vary", "speculative.num_speculative_tokens=3,7", "--named", "target-only"]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        BASE,
        f"{BASE}-num-speculative-tokens-3",
        f"{BASE}-num-speculative-tokens-7",
        "target-only",
    ]
    assert "judged against the base's teacher (mini-laguna-cpu-teacher)" in lines[1]
    # The contract allows page 48; this machine's engine does not (the capability preflight, per variant).
    assert cli.main(["contract", "vary", BASE, "--vary", "engine.block_size=48"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"{BASE}-block-size-48 ") and out[2].startswith(
        "  refused on this machine: page size: "
    ), out
    # What the contract rules forbid is one error line, before anything else.
    assert cli.main(["contract", "vary", BASE, "--vary", "speculative.num_speculative_tokens=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"b70lab: variant {BASE}-num-speculative-tokens-0 of contract {BASE} is refused"), err
