"""The load audit and gate 3 over INT4 weights, on a run recorded from the real INT4 mini
(fixtures/evidence/mini-laguna-cpu-int4: `pytest -m gates --b70-contract mini-laguna-cpu-int4`, TP2 + EP2, the
portable INT4 path), and over mutated copies of it.

The recorded run passes; a rank whose packed words lost one 4-bit field, a rank whose group scales were zeroed,
a rank that loaded the other rank's experts each fail the load audit naming that rank and that tensor; a fused
layer's `weight_shape` may hold any one member's shape (notes/2026-12-04-int4-weight-shape-last-member-wins.md),
never another; gate 3 holds every rank's INT4 path to the contract.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pytest_b70lab.contract.schema import Contract
from pytest_b70lab.engine.starts import checkpoint_tables
from pytest_b70lab.evidence.record import Evidence
from pytest_b70lab.evidence.run_folder import read_starts
from pytest_b70lab.judge import engine_resolution, load_audit, rules

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu-int4"


class Int4Run:
    def __init__(self, cache_root: Path) -> None:
        self.starts: list[Evidence] = read_starts(BUNDLE)
        self.contract = Contract.model_validate(self.starts[0].contract.canonical, strict=False)
        # A cache of its own: the tables of a checkpoint present here are cached, never into the bundle.
        self.tables = checkpoint_tables(BUNDLE, self.contract, cache_root)

    def mutated(self) -> Int4Run:
        other = copy.copy(self)
        other.starts = [s.model_copy(deep=True) for s in self.starts]
        other.tables = copy.deepcopy(self.tables)
        return other

    def audit(self, rank: int, start: int = 0) -> dict:
        return next(a for a in self.starts[start].audits if a["tp_rank"] == rank)

    def load_audit(self, start: int = 0) -> rules.Verdict:
        return load_audit.load_audit(
            self.starts[start], self.contract, self.tables["target"], self.tables["draft"], self.tables.get("problems")
        )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Int4Run:
    if not (BUNDLE / "start-1" / "evidence.json").exists():
        pytest.fail(f"no recorded evidence bundle at {BUNDLE}", pytrace=False)
    return Int4Run(tmp_path_factory.mktemp("int4-tables"))


def test_the_recorded_int4_run_passes_the_load_audit_over_every_packed_tensor(recorded: Int4Run) -> None:
    tensors = recorded.tables["target"]["tensors"]
    packed = [name for name in tensors if name.endswith(".weight_packed")]
    assert len(packed) > 50 and all(tensors[name]["dtype"] == "int32" for name in packed)
    assert all("nibbles" in tensors[name]["moments"] for name in packed), "the table reads the 4-bit fields"
    for start in range(len(recorded.starts)):
        verdict = recorded.load_audit(start)
        assert verdict.passed, verdict.explain()
        assert verdict.observed["target_mismatched"] == 0
        assert verdict.observed["target_tensors_covered"] == len(tensors) - 8, "all but the 8 KV scales"


def test_the_recorded_int4_run_ran_the_portable_path_on_every_rank(recorded: Int4Run) -> None:
    for start in recorded.starts:
        for rank in range(2):
            verdict = engine_resolution.engine_resolution(start, rank, recorded.contract)
            assert verdict.passed, verdict.explain()
            layers = verdict.observed["int4_layers"]
            assert set(layers) == {"linear portable", "moe portable"} and layers["moe portable"] == 3, layers


def _one_rank(run: Int4Run, rank: int, name: str) -> dict:
    return run.audit(rank)["parameters"][name]["moments"]


def test_a_flipped_low_nibble_on_one_rank_fails_naming_the_rank_and_tensor(recorded: Int4Run) -> None:
    """A flipped lowest field moves the word by 1: far below the float64 rounding of the words' sum of squares,
    so only the 4-bit field moments see it."""
    run = recorded.mutated()
    name = "model.layers.2.self_attn.o_proj.weight_packed"  # row parallel: each rank holds half the words
    moments = _one_rank(run, 1, name)
    moments["sum"] += 1.0
    moments["nibbles"]["sum"] += 1.0
    moments["nibbles"]["sumsq"] += 2 * 7 + 1  # a field of 7 became 8
    verdict = run.load_audit()
    assert not verdict.passed
    assert f"{name} on rank 1:" in verdict.explain() and "part 2 of 2 along dim 1" in verdict.explain()
    assert "on rank 0" not in verdict.explain()


def test_a_zeroed_scale_on_one_rank_fails_naming_the_rank_and_tensor(recorded: Int4Run) -> None:
    run = recorded.mutated()
    name = "model.layers.0.self_attn.qkv_proj.weight_scale"  # fused and column parallel: q, k, v halves
    _one_rank(run, 0, name).update(sum=0.0, sumsq=0.0)
    verdict = run.load_audit()
    assert not verdict.passed
    assert f"{name} on rank 0: sum 0" in verdict.explain() and "part 1 of 2 along dim 0" in verdict.explain()


def test_an_expert_rank_holding_the_other_ranks_experts_is_named(recorded: Int4Run) -> None:
    run = recorded.mutated()
    name = next(n for n in run.audit(0)["parameters"] if n.endswith("w2_weight_scale"))
    run.audit(1)["parameters"][name]["moments"] = copy.deepcopy(_one_rank(run, 0, name))
    verdict = run.load_audit()
    assert not verdict.passed and f"{name} on rank 1:" in verdict.explain() and "experts 4-7" in verdict.explain()


@pytest.mark.parametrize(
    "name, share0, share1",
    [
        # row parallel: each rank holds half the packed words along the input dimension
        ("model.layers.2.self_attn.o_proj.weight_packed", "part 1 of 2 along dim 1", "part 2 of 2 along dim 1"),
        # fused and column parallel
        ("model.layers.0.self_attn.qkv_proj.weight_scale", "part 1 of 2 along dim 0", "part 2 of 2 along dim 0"),
        # expert parallel: each rank holds a block of whole experts
        ("model.layers.1.mlp.experts.routed_experts.w2_weight_packed", "experts 0-3", "experts 4-7"),
    ],
)
def test_two_ranks_that_swapped_their_shares_are_both_named(
    recorded: Int4Run, name: str, share0: str, share1: str
) -> None:
    """Neither rank fits its own share and their total is the checkpoint's: the audit names who holds whose."""
    run = recorded.mutated()
    a, b = run.audit(0)["parameters"][name], run.audit(1)["parameters"][name]
    a["moments"], b["moments"] = b["moments"], a["moments"]
    verdict = run.load_audit()
    assert not verdict.passed
    assert f"{name} on rank 0: rank 0 holds rank 1's share ({share1})" in verdict.explain(), verdict.explain()
    assert f"{name} on rank 1: rank 1 holds rank 0's share ({share0})" in verdict.explain(), verdict.explain()


def test_a_fused_weight_shape_may_be_any_members_and_nothing_else(recorded: Int4Run) -> None:
    name = "model.layers.1.self_attn.qkv_proj.weight_shape"
    assert _one_rank(recorded, 0, name)["sum"] == 512.0, "k's or v's shape, as vLLM 0.32 leaves it"
    q_shape = {"sum": 1024.0 + 256.0, "sumsq": 1024.0**2 + 256.0**2, "numel": 2}
    run = recorded.mutated()
    for rank in (0, 1):
        run.audit(rank)["parameters"][name]["moments"] = dict(q_shape)
    assert run.load_audit().passed, "q's shape, had q been loaded last"
    run.audit(1)["parameters"][name]["moments"] = {"sum": 1280.0 + 256.0, "sumsq": 1280.0**2 + 256.0**2, "numel": 2}
    verdict = run.load_audit()
    assert not verdict.passed and f"{name} on rank 1:" in verdict.explain()


def test_loaded_alternatives_split_only_a_fused_weight_shape() -> None:
    parts = [f"m.layers.0.self_attn.{p}_proj.weight_shape" for p in "qkv"]
    alternatives = load_audit.loaded_alternatives("m.layers.0.self_attn.qkv_proj.weight_shape", parts)
    assert sorted(alternatives) == sorted([p] for p in parts)
    packed = [p.replace("weight_shape", "weight_packed") for p in parts]
    assert load_audit.loaded_alternatives("m.layers.0.self_attn.qkv_proj.weight_packed", packed) == [packed]
    experts = [f"m.experts.{e}.{p}.weight_shape" for e in range(2) for p in ("gate_proj", "up_proj")]
    alternatives = load_audit.loaded_alternatives("m.experts.w13_weight_shape", experts)
    assert alternatives == [[e for e in experts if "gate_proj" in e], [e for e in experts if "up_proj" in e]]


@pytest.mark.parametrize(
    ("accepted", "mutate", "message"),
    [
        ("native", None, "INT4 layers ran the portable path (35 linear portable, 3 moe portable"),
        ("portable", "native", "INT4 layers ran vLLM's kernels (35 linear CPUWNA16LinearKernel)"),
        ("portable", "missing", "the audit does not say which INT4 weight path ran"),
        ("portable", "none", "no layer of this rank was served as INT4"),
    ],
)
def test_gate_3_holds_the_int4_path_to_the_contract(recorded: Int4Run, accepted: str, mutate, message: str) -> None:
    run = recorded.mutated()
    contract = run.contract.model_copy(
        update={"expect": run.contract.expect.model_copy(update={"int4_path": accepted})}
    )
    audit = run.audit(1)
    if mutate == "native":
        audit["int4"]["linear"] = {"CPUWNA16LinearKernel": audit["int4"]["linear"].pop("portable")}
    elif mutate == "missing":
        del audit["int4"]
    elif mutate == "none":
        audit["int4"].update(linear={}, moe={})
    verdict = engine_resolution.engine_resolution(run.starts[0], 1, contract)
    assert not verdict.passed and message in verdict.explain(), verdict.explain()
    assert "rank 1" in verdict.explain()


def test_an_xpu_style_audit_naming_vllms_int4_kernels_passes_gate_3_under_native(recorded: Int4Run) -> None:
    """What the counting alone (every platform, no kernel replaced) reports on an XPU rank: vLLM's own W4A16
    linear kernel and INT4 experts by name. Under `int4_path = "native"` gate 3 passes it; the recorded rank
    (the portable path) fails under the same contract."""
    run = recorded.mutated()
    contract = run.contract.model_copy(
        update={"expect": run.contract.expect.model_copy(update={"int4_path": "native"})}
    )
    audit = run.audit(1)
    linear, moe = audit["int4"]["linear"]["portable"], audit["int4"]["moe"]["portable"]
    audit["int4"].update(
        installed=False,
        counting=True,
        linear={"XPUwNa16LinearKernel": linear},
        moe={"XPUExpertsWNA16": moe},
        reasons={},
    )
    verdict = engine_resolution.engine_resolution(run.starts[0], 1, contract)
    assert verdict.passed, verdict.explain()
    assert verdict.observed["int4_layers"] == {"linear XPUwNa16LinearKernel": linear, "moe XPUExpertsWNA16": moe}
    assert not engine_resolution.engine_resolution(recorded.starts[0], 1, contract).passed
