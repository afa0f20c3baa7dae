"""Every gate over a run recorded from a real mini engine (fixtures/evidence/), and over mutated copies.

The recorded run must pass every gate; each mutation breaks one observation the way a real failure would
(a rank that lost its scales, a layer on another backend, a cached prompt, a changed token...), and its
gate must reject it with the right message. A gate that no mutation can fail is not a gate. Each removal
takes away data a gate reads (a log, a counter, an audit field, a checkpoint table): the gate must fail
saying what is missing, never pass by having nothing to look at.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_b70lab.contract.schema import Contract, load_prompts
from pytest_b70lab.engine.starts import checkpoint_tables
from pytest_b70lab.evidence import metrics
from pytest_b70lab.evidence.record import Evidence, sha256_ids
from pytest_b70lab.evidence.run_folder import PROMPTS_COPY, read_starts
from pytest_b70lab.judge import (
    catalogue,
    cold_prompts,
    engine_resolution,
    evidence_checks,
    exactness,
    load_audit,
    reproduction,
    rules,
    scale_audits,
    teacher,
    topology,
)

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
SNAPSHOTS = REPO / "tests" / "gates" / "__snapshots__"


class Run:
    def __init__(self) -> None:
        self.starts: list[Evidence] = read_starts(BUNDLE)
        self.contract = Contract.model_validate(self.starts[0].contract.canonical, strict=False)
        self.tables: dict = checkpoint_tables(BUNDLE, self.contract, BUNDLE / "no-cache")
        self.snapshots = {
            r.prompt_id: teacher.read(teacher.snapshot_path(SNAPSHOTS, self.contract, r.prompt_id))
            for r in self.starts[0].requests
        }
        # The sizes of the run folder's rank logs, as the evidence check reads them: the committed bundle keeps
        # the evidence without its logs (None), a live run folder has them.
        self.log_sizes: dict[int, dict[str, int] | None] = {s.start_index: None for s in self.starts}

    def clone(self) -> Run:
        other = copy.copy(self)
        other.starts = [s.model_copy(deep=True) for s in self.starts]
        other.tables = copy.deepcopy(self.tables)
        other.snapshots = copy.deepcopy(self.snapshots)
        other.log_sizes = copy.deepcopy(self.log_sizes)
        return other

    @property
    def ranks(self) -> range:
        return range(self.contract.engine.tensor_parallel)

    @property
    def prompts(self) -> list[str]:
        """The contract's prompt set (as the plugin parametrizes it), not the evidence's requests."""
        return [p.id for p in load_prompts(self.contract, fallback=BUNDLE / PROMPTS_COPY)]


def all_verdicts(run: Run) -> list[rules.Verdict]:
    c = run.contract
    out: list[rules.Verdict] = []
    target, draft = run.tables.get("target"), run.tables.get("draft")
    for s in run.starts:
        for r in run.ranks:
            out += [
                scale_audits.target_scale_audit(s, r, c, (target or {}).get("kv_scales")),
                scale_audits.draft_cache_audit(s, r, c),
                engine_resolution.engine_resolution(s, r, c),
                topology.compile_topology(s, r, c),
                engine_resolution.launch_flags(s, r, c),
            ]
        out.append(load_audit.load_audit(s, c, target, draft, run.tables.get("problems")))
        for p in run.prompts:
            out += [
                cold_prompts.cold_prompt(s, p),
                exactness.token_count(s, p, c),
                exactness.teacher_exactness(s, p, c, run.snapshots.get(p), f"<snapshot {p}>"),
            ]
        out += [engine_resolution.metrics_agree(s, c), engine_resolution.spec_counters(s, c)]
        out += [
            evidence_checks.evidence_start(s),
            evidence_checks.evidence_ranks(s, c, run.log_sizes.get(s.start_index)),
            evidence_checks.evidence_metrics(s),
            evidence_checks.evidence_prompts(s, run.prompts, c),
            evidence_checks.evidence_teardown(s),
            evidence_checks.evidence_exposure(s),
            evidence_checks.evidence_probe(s, c),
            evidence_checks.evidence_logs(s),
        ]
    out.append(reproduction.reproduction(run.starts, c))
    return out


@pytest.fixture(scope="module")
def recorded() -> Run:
    if not (BUNDLE / "start-1" / "evidence.json").exists():
        pytest.fail(f"no recorded evidence bundle at {BUNDLE}", pytrace=False)
    return Run()


def test_the_recorded_run_passes_every_gate(recorded: Run) -> None:
    failed = [v.explain() for v in all_verdicts(recorded) if not v.passed]
    assert not failed, "\n".join(failed)


def test_the_recorded_run_covers_the_contract(recorded: Run) -> None:
    assert len(recorded.starts) == recorded.contract.reproduction.fresh_starts == 2
    assert all(len(s.audits) == recorded.contract.engine.tensor_parallel for s in recorded.starts)
    assert set(recorded.snapshots) == set(recorded.prompts)


# --- mutations ---------------------------------------------------------------------------------------


def _layer(run: Run, start: int, rank: int, owner: str, index: int = 0) -> dict:
    audit = next(a for a in run.starts[start].audits if a["tp_rank"] == rank)
    names = sorted(n for n, layer in audit["attention_layers"].items() if layer["owner"] == owner)
    return audit["attention_layers"][names[index]]


def _audit(run: Run, start: int, rank: int) -> dict:
    return next(a for a in run.starts[start].audits if a["tp_rank"] == rank)


def _set_metric(text: str, name: str, value: float) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            line = line.rsplit(" ", 1)[0] + f" {value}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _set_tokens(request, ids: list[int]) -> None:
    request.token_ids = ids
    request.token_ids_sha256 = sha256_ids(ids)


def rank_scale_one(run: Run) -> None:
    layer = _layer(run, 0, 1, "target", 2)
    layer["k_scale"] = layer["v_scale"] = 1.0


def layer_on_other_backend(run: Run) -> None:
    _layer(run, 1, 0, "draft", 1)["backend"] = "TORCH_SDPA"


def backend_fallback_logged(run: Run) -> None:
    run.starts[0].log_findings["backend_fallback"] = [
        "(Worker_TP0_EP0 pid=1) INFO [cpu.py:178] Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU."
    ]


# vLLM's own line when the launch turns its SHM all-reduce off (from a real TP2+EP2 start on two cores).
SHM_ALLREDUCE_FALLBACK = (
    "(Worker pid=28836) INFO 11-30 17:35:04 [cpu_communicator.py:47] CPU SHM communicator "
    "disabled for group tp:0: ranks do not share the same SHM group name, falling back to "
    "torch.distributed."
)


def undeclared_allreduce_fallback(run: Run) -> None:
    run.starts[0].engine.environment.pop("VLLM_CPU_SHM_ALLREDUCE", None)
    run.starts[0].log_findings["backend_fallback"] = [SHM_ALLREDUCE_FALLBACK]


def test_a_declared_allreduce_fallback_is_not_a_backend_fallback(recorded: Run) -> None:
    """The launch chose gloo (VLLM_CPU_SHM_ALLREDUCE=0 in the recorded environment): vLLM's fallback line
    for it is expected. Any other fallback in the same log still fails the gate."""
    run = recorded.clone()
    for s in run.starts:
        s.engine.environment["VLLM_CPU_SHM_ALLREDUCE"] = "0"
        s.log_findings["backend_fallback"] = [SHM_ALLREDUCE_FALLBACK]
    assert all(engine_resolution.engine_resolution(s, r, run.contract).passed for s in run.starts for r in run.ranks)
    backend_fallback_logged(run)
    run.starts[0].log_findings["backend_fallback"].insert(0, SHM_ALLREDUCE_FALLBACK)
    verdict = engine_resolution.engine_resolution(run.starts[0], 0, run.contract)
    assert not verdict.passed and "Cannot use AttentionBackendEnum.FLASH_ATTN" in verdict.explain()


def kv_tensor_not_fp8(run: Run) -> None:
    _layer(run, 0, 0, "target", 1)["kv_tensor"]["dtype"] = "float32"


def runtime_scale_calculation(run: Run) -> None:
    _layer(run, 0, 0, "target", 3)["calculate_kv_scales"] = True


def scale_digest_drift(run: Run) -> None:
    layer = _layer(run, 1, 1, "target", 0)
    layer["k_scale"] = layer["k_scale"] * 2


def draft_scale_not_unit(run: Run) -> None:
    _layer(run, 0, 1, "draft", 0)["v_scale"] = 0.5


def draft_declares_calibration(run: Run) -> None:
    _audit(run, 0, 0)["draft_quantization"] = {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"type": "float", "num_bits": 8},
    }


def cached_prompt(run: Run) -> None:
    r = run.starts[1].requests[2]
    r.usage["prompt_tokens_details"]["cached_tokens"] = 3
    r.cached_tokens = 3


def prefix_cache_hit(run: Run) -> None:
    s = run.starts[0]
    s.metrics_after = _set_metric(s.metrics_after, "vllm:prefix_cache_hits_total", 7.0)


def changed_token(run: Run) -> None:
    r = run.starts[1].requests[0]
    ids = list(r.token_ids)
    ids[5] = (ids[5] + 1) % 512
    _set_tokens(r, ids)


def bf16_teacher(run: Run) -> None:
    for snap in run.snapshots.values():
        snap["teacher"]["kv_cache_dtype"] = "bfloat16"
        snap["teacher"]["engine_kv_cache_dtypes"] = ["bfloat16"]


def stale_teacher(run: Run) -> None:
    for snap in run.snapshots.values():
        snap["teacher"]["output_digest"] = "0" * 64


def foreign_teacher(run: Run) -> None:
    for snap in run.snapshots.values():
        snap["teacher"]["model_digest"] = "f" * 64


def speculative_teacher(run: Run) -> None:
    for snap in run.snapshots.values():
        snap["teacher"]["engine_speculative_config"] = [{"method": "dflash", "num_speculative_tokens": 11}]


def missing_teacher(run: Run) -> None:
    run.snapshots.pop(run.prompts[3])


def changed_topology(run: Run) -> None:
    _audit(run, 0, 1)["compile_counters"]["dynamo_graph_breaks"] = 1


def loaded_graphs_uncounted(run: Run) -> None:
    """Start-2 loaded both models from the AOT compile cache, but vLLM's counter says it loaded none."""
    _audit(run, 1, 0)["compile_counters"]["vllm"]["num_aot_artifacts_loaded"] = 0


def loaded_start_also_traced(run: Run) -> None:
    """A start that loaded both models from the AOT cache traced one more graph besides."""
    _audit(run, 1, 1)["compile_counters"]["dynamo_unique_graphs"] += 1


def test_the_recorded_run_compiled_once_and_loaded_once(recorded: Run) -> None:
    """The bundle covers both ways a start gets its graphs: start-1 compiled them (Dynamo counted them),
    start-2 loaded them from vLLM's AOT compile cache (Dynamo counted none): the topology gate passes both,
    reading the counts from what each start did."""
    c = recorded.contract
    for index, source in ((0, "compiled"), (1, "loaded")):
        for r in recorded.ranks:
            audit = _audit(recorded, index, r)
            assert {m["source"] for m in audit["compiled_modules"]} == {source}
            assert len(audit["compiled_modules"]) == c.expect.compile_graphs
            verdict = topology.compile_topology(recorded.starts[index], r, c)
            assert verdict.passed, verdict.explain()
    assert _audit(recorded, 1, 0)["compile_counters"]["dynamo_unique_graphs"] == 0


def starts_on_two_boxes(run: Run) -> None:
    """Each start names the box it ran on, and they are two (a planted pair across boxes)."""
    for start, (label, digest) in zip(run.starts, (("box-a", "a" * 16), ("box-b", "b" * 16)), strict=False):
        start.host = {**(start.host or {}), "box": {"label": label, "digest": digest}}


def slower_second_start(run: Run) -> None:
    """The second start decodes at a third of the speed of the first."""
    s = run.starts[1]
    slowdown = 3 * s.throughput.endpoint_median / run.starts[0].throughput.endpoint_median
    for r in _every(s):
        r.chunk_times = [t * slowdown for t in r.chunk_times]
        r.decode_rate = r.decode_rate / slowdown
    s.throughput.endpoint_median = s.throughput.endpoint_median / slowdown


def _every(start: Evidence) -> list:
    """Every request of a start: the interleaved schedule's later passes and attempts too."""
    return [*start.requests, *start.repeats]


def _recorded_paired(run: Run) -> float:
    """Start-2 / start-1 of the recorded bundle, as gate 7 figures it: a mutation that sets the paired figure
    scales from it (stretching every request of a start by f moves every pair's ratio, so the figure, by 1/f)."""
    paired = reproduction.reproduction(run.starts, run.contract).observed.get("paired_ratio_start2")
    assert paired is not None
    return paired


def stretched_second_start(run: Run) -> None:
    """Start-2's tokens arrive so much later that the paired figure is 0.5, but its recorded rates and
    medians are left as they were: the gate recomputes the paired figure from the arrival times, so it sees
    the slowdown the records hide."""
    stretch = 2 * _recorded_paired(run)
    for r in _every(run.starts[1]):
        r.chunk_times = [t * stretch for t in r.chunk_times]


def nan_arrival_time(run: Run) -> None:
    r = run.starts[1].requests[2]
    r.chunk_times[-1] = float("nan")


def zero_router_bias(run: Run) -> None:
    """What every rank reports when the bias is left at its initial zeros (the vLLM 0.32 defect)."""
    for audit in run.starts[0].audits:
        for name, p in audit["parameters"].items():
            if name.endswith("e_score_correction_bias"):
                p["moments"] = {**p["moments"], "sum": 0.0, "sumsq": 0.0}


def expert_weights_from_the_wrong_rank(run: Run) -> None:
    """Rank 1 loaded rank 0's experts: each looks plausible alone; rank 1 is not its own share (experts 4-7)."""
    audits = {a["tp_rank"]: a for a in run.starts[1].audits}
    name = next(n for n in audits[0]["parameters"] if n.endswith("w13_weight"))
    audits[1]["parameters"][name]["moments"] = dict(audits[0]["parameters"][name]["moments"])


def _swap_ranks(run: Run, ending: str) -> None:
    audits = {a["tp_rank"]: a for a in run.starts[1].audits}
    name = next(n for n in audits[0]["parameters"] if n.endswith(ending))
    a, b = audits[0]["parameters"][name], audits[1]["parameters"][name]
    a["moments"], b["moments"] = b["moments"], a["moments"]


def expert_blocks_swapped(run: Run) -> None:
    """Ranks 0 and 1 loaded each other's block of experts: neither fits its own share, their total is the
    checkpoint's. (A swapped tensor-parallel shard is tested on the INT4 bundle: this bundle's table copy
    predates the shard moments that cut a 2-D tensor rank by rank.)"""
    _swap_ranks(run, "w13_weight")


def draft_norm_not_loaded(run: Run) -> None:
    """A draft norm left at its initial ones on every rank."""
    for audit in run.starts[1].audits:
        p = audit["draft_parameters"]["model.hidden_norm.weight"]
        n = p["moments"]["numel"]
        p["moments"] = {"sum": float(n), "sumsq": float(n), "numel": n}


def tensor_never_loaded(run: Run) -> None:
    """A checkpoint tensor that no engine parameter is made of."""
    run.tables["target"]["tensors"]["model.layers.1.mlp.extra_router.weight"] = {
        "dtype": "bfloat16",
        "shape": [8],
        "sha256": "0" * 64,
        "moments": {"sum": 1.0, "sumsq": 1.0, "numel": 8},
    }


def block_size_drift(run: Run) -> None:
    _audit(run, 1, 1)["cache_config"]["block_size"] = 64


def metrics_say_auto(run: Run) -> None:
    s = run.starts[0]
    s.metrics_after = s.metrics_after.replace('cache_dtype="fp8"', 'cache_dtype="auto"')


def draft_token_count_off(run: Run) -> None:
    s = run.starts[1]
    total = metrics.counter_total(s.metrics_after, "vllm:spec_decode_num_draft_tokens_total")
    s.metrics_after = _set_metric(s.metrics_after, "vllm:spec_decode_num_draft_tokens_total", total + 1)


def reported_count_off(run: Run) -> None:
    run.starts[0].requests[1].usage["completion_tokens"] = 99


def start_failed(run: Run) -> None:
    from pytest_b70lab.evidence.record import Failure

    run.starts[1].status = "failed"
    run.starts[1].failure = Failure(message="the server exited with code -11 during start-up")


def rank_missing(run: Run) -> None:
    run.starts[0].audits = [a for a in run.starts[0].audits if a["tp_rank"] != 1]


def process_outlived_teardown(run: Run) -> None:
    process = run.starts[1].teardown["processes"][2]
    process.update(gone=False, how="still running after SIGKILL")
    run.starts[1].teardown["clean"] = False


def engine_listened_on_every_address(run: Run) -> None:
    socket = run.starts[0].exposure["listening"][0]
    socket.update(address="0.0.0.0", loopback=False)


def probe_failed(run: Run) -> None:
    run.starts[0].probe.update(passed=False, problems=["rank 1: all-reduce gave 2.0, expected 3.0"])
    run.starts[0].probe["ranks"][1].update(correct=False)


def ready_never_timed(run: Run) -> None:
    run.starts[1].ready_s = float("nan")


def empty_rank_log(run: Run) -> None:
    logs = run.starts[1].logs
    run.log_sizes[2] = {rel: 4096 for rel in logs.values()} | {logs["rank:Worker_TP1_EP1"]: 0}


def prompt_repeated(run: Run) -> None:
    run.starts[0].requests.append(run.starts[0].requests[0].model_copy(deep=True))


def metrics_scraped_after_only(run: Run) -> None:
    run.starts[1].metrics_before = None


def no_ready_time(run: Run) -> None:
    run.starts[0].ready_s = None


def no_start_identity(run: Run) -> None:
    """What a start recorded before starts had an identity looks like."""
    run.starts[1].identity = None


def no_process_creation_time(run: Run) -> None:
    del run.starts[0].audits[1]["process_started"]


def logs_not_scanned_for_exceptions(run: Run) -> None:
    run.starts[0].log_findings.pop("exception")


def no_teardown_record(run: Run) -> None:
    run.starts[0].teardown = None


def no_exposure_record(run: Run) -> None:
    run.starts[1].exposure = None


def no_probe_record(run: Run) -> None:
    run.starts[0].probe = None


def copied_start(run: Run) -> None:
    """Start-1's evidence standing in for start-2, only its index changed: the issue's case, to the bit."""
    run.starts[1] = run.starts[0].model_copy(deep=True, update={"start_index": 2})


def audit_of_another_start(run: Run) -> None:
    run.starts[1].audits[1]["start_nonce"] = run.starts[0].identity.nonce


def same_rank_process(run: Run) -> None:
    mine, theirs = run.starts[1].audits[0], run.starts[0].audits[0]
    mine.update(pid=theirs["pid"], process_started=theirs["process_started"])


def same_launch_time(run: Run) -> None:
    run.starts[1].identity = run.starts[1].identity.model_copy(
        update={"launched_at": run.starts[0].identity.launched_at}
    )


def table_of_another_checkpoint(run: Run) -> None:
    run.starts[1].draft.digest = "0" * 64


def crash_logged(run: Run) -> None:
    run.starts[0].log_findings["native_crash"] = ["(Worker_TP1_EP1 pid=9) Fatal Python error: Segmentation fault"]


def error_logged(run: Run) -> None:
    run.starts[1].log_findings["error_record"] = [
        "(EngineCore pid=7) ERROR 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error."
    ]


def exception_raised(run: Run) -> None:
    run.starts[1].log_findings["exception"] = ["(Worker_TP0_EP0 pid=8) RuntimeError: oneDNN primitive failed"]


def other_kv_scale_line(run: Run) -> None:
    run.starts[0].log_findings["kv_scale_notice"].append(
        "(Worker_TP0_EP0 pid=8) WARNING 12-01 10:00:00 [attention.py:1] Checkpoint does not provide a q scaling "
        "factor. Setting it to k_scale."
    )


def unknown_finding_kind(run: Run) -> None:
    run.starts[1].log_findings["oom_killer"] = []


def portable_path_under_a_native_only_contract(run: Run) -> None:
    expect = run.contract.expect.model_copy(update={"fp8_attention": "native"})
    run.contract = run.contract.model_copy(update={"expect": expect})
    _audit(run, 1, 1)["fp8_attention"].update(
        portable=True,
        implementation="b70lab-portable-fp8",
        op_library="_C_AVX2",
        reason="this CPU has neither AVX-512 nor AMX",
    )


def native_path_where_the_cpu_cannot_run_it(run: Run) -> None:
    _audit(run, 0, 1)["fp8_attention"].update(portable=False, native_supported=False)


def fp8_path_not_audited(run: Run) -> None:
    del _audit(run, 1, 0)["fp8_attention"]


MUTATIONS: list[tuple[Callable[[Run], None], str, str]] = [
    (
        portable_path_under_a_native_only_contract,
        "engine-resolution",
        "rank 1: FP8 attention ran portable: b70lab-portable-fp8 (this CPU has neither AVX-512 nor AMX), op library "
        "_C_AVX2; the contract accepts native only",
    ),
    (native_path_where_the_cpu_cannot_run_it, "engine-resolution", "the audit contradicts itself"),
    (rank_scale_one, "target-scale-audit", "K and V scale are 1.0"),
    (scale_digest_drift, "target-scale-audit", "scale digest"),
    (runtime_scale_calculation, "target-scale-audit", "calculates KV scales at run time"),
    (draft_scale_not_unit, "draft-cache-audit", "expected unit scale"),
    (draft_declares_calibration, "draft-cache-audit", "declares a KV calibration"),
    (layer_on_other_backend, "engine-resolution", "backend 'TORCH_SDPA', expected 'CPU_ATTN'"),
    (backend_fallback_logged, "engine-resolution", "backend fallback in the log"),
    (undeclared_allreduce_fallback, "engine-resolution", "CPU SHM communicator disabled for group tp:0"),
    (kv_tensor_not_fp8, "engine-resolution", "not 8-bit FP8 storage"),
    (metrics_say_auto, "metrics-agree", "cache_dtype='auto'"),
    (cached_prompt, "cold-prompt", "3 cached prompt tokens"),
    (prefix_cache_hit, "cold-prompt", "prefix-cache hit counter moved by 7"),
    (changed_token, "fresh-start-reproduction", "differs from start-1 at token 5"),
    (changed_token, "teacher-exactness", "token IDs differ from the teacher"),
    (bf16_teacher, "teacher-exactness", "did not run an FP8 KV cache"),
    (stale_teacher, "teacher-exactness", "stale teacher"),
    (foreign_teacher, "teacher-exactness", "foreign teacher"),
    (speculative_teacher, "teacher-exactness", "not recorded by a target-only teacher"),
    (missing_teacher, "teacher-exactness", "no teacher snapshot"),
    (changed_topology, "compile-topology", "1 graph breaks, the contract expects 0"),
    (
        loaded_graphs_uncounted,
        "compile-topology",
        "lists 2 modules loaded from the AOT compile cache, vLLM's counter says 0",
    ),
    (loaded_start_also_traced, "compile-topology", "3 compiled graphs, the contract expects 2"),
    (slower_second_start, "fresh-start-reproduction", "tolerance"),
    (
        starts_on_two_boxes,
        "fresh-start-reproduction",
        "start-2 ran on box box-b [bbbbbbbbbbbbbbbb], start-1 on box box-a [aaaaaaaaaaaaaaaa]: two boxes",
    ),
    (stretched_second_start, "fresh-start-reproduction", "paired figure start-2 / start-1 0.5"),
    (nan_arrival_time, "fresh-start-reproduction", "its arrival times give a decode rate of nan"),
    (zero_router_bias, "load-audit", "e_score_correction_bias on rank 0: sum 0"),
    (expert_weights_from_the_wrong_rank, "load-audit", "w13_weight on rank 1: rank 1 holds rank 0's share"),
    (expert_blocks_swapped, "load-audit", "w13_weight on rank 0: rank 0 holds rank 1's share (experts 4-7)"),
    (expert_blocks_swapped, "load-audit", "w13_weight on rank 1: rank 1 holds rank 0's share (experts 0-3)"),
    (
        draft_norm_not_loaded,
        "load-audit",
        "draft: 2 mismatch(es) with the checkpoint: model.hidden_norm.weight on rank 0: sum 256",
    ),
    (
        tensor_never_loaded,
        "load-audit",
        "never reached an engine parameter (and the contract does not exempt them): "
        "model.layers.1.mlp.extra_router.weight",
    ),
    (block_size_drift, "launch-flags", "block_size: engine has 64, contract says 32"),
    (draft_token_count_off, "spec-counters", "draft tokens"),
    (reported_count_off, "token-count", "usage says 99 tokens"),
    (start_failed, "fresh-start-reproduction", "did not complete"),
    (start_failed, "target-scale-audit", "did not complete"),
    (rank_missing, "launch-flags", "0 audits from TP rank 1"),
]


def _drop_metric(text: str, name: str) -> str:
    """/metrics without any sample (or HELP/TYPE line) of the family `name`."""
    family = name.removesuffix("_total")
    return (
        "\n".join(
            line
            for line in text.splitlines()
            if not (
                line.startswith((family + "{", family + " ", family + "_total"))
                or (line.startswith("#") and f" {family}" in line)
            )
        )
        + "\n"
    )


def draft_config_unavailable(run: Run) -> None:
    _audit(run, 0, 1)["draft_quantization"] = (
        "unavailable: AttributeError: 'NoneType' object has no attribute 'hf_config'"
    )


def draft_quantization_not_audited(run: Run) -> None:
    del _audit(run, 1, 0)["draft_quantization"]


def no_server_log(run: Run) -> None:
    run.starts[0].logs.pop("server")


def no_rank_log(run: Run) -> None:
    run.starts[1].logs.pop(engine_resolution.rank_log_name(run.contract, 1))


def log_not_scanned(run: Run) -> None:
    run.starts[0].log_findings.pop("backend_fallback")


def no_prefix_cache_counter(run: Run) -> None:
    s = run.starts[1]
    s.metrics_after = _drop_metric(s.metrics_after, "vllm:prefix_cache_hits_total")


def no_acceptance_series(run: Run) -> None:
    s = run.starts[0]
    s.metrics_after = _drop_metric(s.metrics_after, "vllm:spec_decode_num_accepted_tokens_per_pos_total")


def no_acceptance_counters(run: Run) -> None:
    s = run.starts[1]
    s.metrics_before = _drop_metric(s.metrics_before, "vllm:spec_decode_num_accepted_tokens_total")


def one_start_missing(run: Run) -> None:
    run.starts = run.starts[:1]


def max_model_len_not_audited(run: Run) -> None:
    del _audit(run, 0, 1)["model_config"]["max_model_len"]


def seed_drift(run: Run) -> None:
    _audit(run, 1, 0)["model_config"]["seed"] = 7


def ran_eager(run: Run) -> None:
    _audit(run, 0, 0)["model_config"]["enforce_eager"] = True


def no_attention_config(run: Run) -> None:
    del _audit(run, 1, 1)["attention_config"]


def teacher_without_speculative_field(run: Run) -> None:
    for snap in run.snapshots.values():
        del snap["teacher"]["engine_speculative_config"]


def teacher_without_token_ids(run: Run) -> None:
    del run.snapshots[run.prompts[2]]["token_ids"]


def no_target_table(run: Run) -> None:
    run.tables["target"] = None
    run.tables["problems"] = {"target": "poolside/Laguna-S-2.1-INT4 is not in the Hugging Face cache"}


def no_draft_table(run: Run) -> None:
    run.tables["draft"] = None


def no_draft_parameters(run: Run) -> None:
    for audit in run.starts[1].audits:
        audit["draft_parameters"] = None


def scale_calculation_not_audited(run: Run) -> None:
    del _layer(run, 1, 0, "target", 2)["calculate_kv_scales"]


def no_compile_break_count(run: Run) -> None:
    del _audit(run, 1, 0)["compile_counters"]["dynamo_graph_breaks"]


def no_cache_config_info(run: Run) -> None:
    s = run.starts[1]
    s.metrics_after = _drop_metric(s.metrics_after, "vllm:cache_config_info")


def no_cached_token_count(run: Run) -> None:
    run.starts[0].requests[4].cached_tokens = None


def no_usage_count(run: Run) -> None:
    del run.starts[1].requests[3].usage["completion_tokens"]


def a_request_missing(run: Run) -> None:
    run.starts[0].requests = run.starts[0].requests[1:]


def no_requests_at_all(run: Run) -> None:
    run.starts[0].requests = []


REMOVALS: list[tuple[Callable[[Run], None], str, str]] = [
    (no_target_table, "target-scale-audit", "no checkpoint table of calibrated scales"),
    (scale_calculation_not_audited, "target-scale-audit", "did not record calculate_kv_scales"),
    (
        draft_config_unavailable,
        "draft-cache-audit",
        'quantization config could not be read: "unavailable: AttributeError',
    ),
    (draft_quantization_not_audited, "draft-cache-audit", "did not record the draft's quantization config"),
    (
        fp8_path_not_audited,
        "engine-resolution",
        "rank 0: the audit does not say which FP8 attention implementation ran",
    ),
    (no_server_log, "engine-resolution", "no server log recorded"),
    (no_rank_log, "engine-resolution", "no log of rank 1"),
    (log_not_scanned, "engine-resolution", "not scanned for backend fallbacks"),
    (no_cache_config_info, "metrics-agree", "/metrics has no vllm:cache_config_info"),
    (teacher_without_speculative_field, "teacher-exactness", "lacks ['engine_speculative_config']"),
    (teacher_without_token_ids, "teacher-exactness", "does not keep its token IDs"),
    (no_prefix_cache_counter, "cold-prompt", "has no vllm:prefix_cache_hits_total"),
    (no_cached_token_count, "cold-prompt", "None cached prompt tokens"),
    (no_compile_break_count, "compile-topology", "lack ['dynamo_graph_breaks']"),
    (one_start_missing, "fresh-start-reproduction", "1 fresh starts recorded, the contract asks for 2"),
    (no_requests_at_all, "fresh-start-reproduction", "start-1 recorded no requests"),
    (max_model_len_not_audited, "launch-flags", "max_model_len: the audit did not record"),
    (no_attention_config, "launch-flags", "attention_backend: the audit did not record"),
    (no_target_table, "load-audit", "target: no checkpoint table to compare the engine with: poolside"),
    (no_draft_table, "load-audit", "draft: no checkpoint table"),
    (no_draft_parameters, "load-audit", "draft: the audit recorded no draft parameters"),
    (no_acceptance_series, "spec-counters", "lacks vllm:spec_decode_num_accepted_tokens_per_pos_total (after)"),
    (no_acceptance_counters, "spec-counters", "lacks vllm:spec_decode_num_accepted_tokens_total (before)"),
    (no_usage_count, "token-count", "usage says None tokens"),
    (a_request_missing, "token-count", "no request for prompt"),
    (a_request_missing, "evidence-prompts", "no request for"),
    (no_rank_log, "evidence-ranks", "start-2: no log of Worker_TP1_EP1"),
    (no_cache_config_info, "evidence-metrics", "no /metrics scrape after the prompts"),
    (
        no_start_identity,
        "fresh-start-reproduction",
        "start-2 records no start identity (evidence recorded before each start got a nonce)",
    ),
    (no_process_creation_time, "fresh-start-reproduction", "start-1 rank 1: the audit records no process creation"),
    (logs_not_scanned_for_exceptions, "evidence-logs", "start-1: the server log was not scanned for exception"),
    (no_ready_time, "evidence-start", "start-1: ready after None s: the launch recorded no time to ready"),
    (no_teardown_record, "evidence-teardown", "start-1: the evidence records no teardown"),
    (no_exposure_record, "evidence-exposure", "start-2: the evidence does not record who could reach the engine"),
    (no_probe_record, "evidence-probe", "start-1: the evidence does not record the preflight collective probe"),
]
MUTATIONS += [
    (start_failed, "evidence-start", "start-2 did not complete: the server exited with code -11"),
    (ready_never_timed, "evidence-start", "start-2: ready after nan s"),
    (rank_missing, "evidence-ranks", "start-1: audits from TP ranks [0], expected one from each of 0..1"),
    (empty_rank_log, "evidence-ranks", "start-2: the log ranks/Worker_TP1_EP1.log of Worker_TP1_EP1 is empty"),
    (metrics_scraped_after_only, "evidence-metrics", "start-2: no /metrics scrape before the prompts"),
    (prompt_repeated, "evidence-prompts", "start-1: requests outside the prompt set or repeated"),
    (process_outlived_teardown, "evidence-teardown", "start-2: still running after teardown: pid"),
    (
        engine_listened_on_every_address,
        "evidence-exposure",
        "start-1: listening beyond loopback: VLLM::Worker_TP0_EP0 on 0.0.0.0",
    ),
    (probe_failed, "evidence-probe", "start-1: the probe did not pass: ['rank 1: all-reduce gave 2.0"),
    (copied_start, "fresh-start-reproduction", "start-2 has start-1's identity (nonce "),
    (audit_of_another_start, "fresh-start-reproduction", "start-2 rank 1 echoes start-1's nonce"),
    (same_rank_process, "fresh-start-reproduction", "a rank of start-1: the same engine, not a fresh start"),
    (same_launch_time, "fresh-start-reproduction", "as start-1 was: not a fresh start of its own"),
    (
        table_of_another_checkpoint,
        "load-audit",
        "draft: the engine served checkpoint 0000000000000000..., the checkpoint table is of",
    ),
    (crash_logged, "evidence-logs", "start-1: a process crashed: (Worker_TP1_EP1 pid=9) Fatal Python error"),
    (error_logged, "evidence-logs", "start-2: vLLM logged an error: (EngineCore pid=7) ERROR"),
    (exception_raised, "evidence-logs", "start-2: a process raised an exception: (Worker_TP0_EP0 pid=8) RuntimeError"),
    (
        other_kv_scale_line,
        "evidence-logs",
        "a log line about KV scales that is not vLLM's generic FP8 notice: (Worker_TP0_EP0 pid=8) WARNING",
    ),
    (unknown_finding_kind, "evidence-logs", "log findings of unknown kind ['oom_killer']"),
    (seed_drift, "launch-flags", "seed: engine has 7, contract says 0"),
    (ran_eager, "launch-flags", "compile_mode: engine has enforce_eager=True, contract says 'compiled'"),
]


def _rejected(run: Run, mutate, gate: str, message: str) -> None:
    mutate(run)
    failed = [v for v in all_verdicts(run) if not v.passed]
    assert failed, f"no gate rejected {mutate.__name__}"
    by_gate = [v for v in failed if v.gate == gate]
    assert by_gate, f"{mutate.__name__} was rejected only by {sorted({v.gate for v in failed})}, not by {gate}"
    assert any(message in reason for v in by_gate for reason in v.reasons), (
        f"{gate} rejected {mutate.__name__} without saying {message!r}: {[v.reasons for v in by_gate]}"
    )


# --- the interleaved schedule: every pass is output, and only clean pairs are speed -------------------------


def _counted(run: Run, start: int, pass_index: int, prompt: int = 0):
    """The (measurement, request) that counts for one pass of the bundle's `prompt`-th prompt at a start."""
    prompt_id = run.starts[0].requests[prompt].prompt_id
    return run.starts[start].counted()[(pass_index, prompt_id)]


def busy_during_a_counted_pair(run: Run) -> None:
    """Start-1 was busy while start-2's pass-2 request ran, and it was not measured again."""
    m, _r = _counted(run, 1, 2)
    m.other_cpu_s = 0.9


def host_busy_during_a_counted_pair(run: Run) -> None:
    """Another job on the machine used most of a core while start-1's pass-3 request ran (the host rule)."""
    m, _r = _counted(run, 0, 3)
    m.outside_cpu_s = 0.8


def host_unread_during_a_counted_pair(run: Run) -> None:
    """The machine's CPU time was not read around start-2's pass-1 request: not known to be clean."""
    m, _r = _counted(run, 1, 1)
    m.outside_cpu_s = None


def host_rule_loosened(run: Run) -> None:
    run.starts[1].schedule.outside_fraction = 1.0


def later_pass_differs(run: Run) -> None:
    """Start-2's third pass of the first prompt gave another token 7: a later pass is output too."""
    _m, r = _counted(run, 1, 3)
    ids = list(r.token_ids)
    ids[7] = (ids[7] + 1) % 512
    _set_tokens(r, ids)


def later_pass_cached(run: Run) -> None:
    _m, r = _counted(run, 0, 2)
    r.cached_tokens = 4


def one_pass_fewer(run: Run) -> None:
    run.starts[1].schedule.passes = 2


def quiet_rule_loosened(run: Run) -> None:
    run.starts[0].schedule.busy_floor_cpu_s = 5.0


def schedule_dropped(run: Run) -> None:
    """A start whose evidence says nothing of how it was measured: not the contract's interleaved schedule."""
    run.starts[1].schedule = None


def second_start_after_the_first(run: Run) -> None:
    """Start-2's measurements moved after all of start-1's, their sequence numbers kept: run one after the
    other, yet labelled interleaved."""
    assert run.starts[0].schedule is not None and run.starts[1].schedule is not None
    end = max(m.ended_at for m in run.starts[0].schedule.measurements)
    for m in run.starts[1].schedule.measurements:
        m.started_at, m.ended_at = m.started_at + end, m.ended_at + end


def second_start_onto_the_first(run: Run) -> None:
    """Every start-2 measurement moved onto the start-1 measurement just before it: the two served together."""
    assert run.starts[0].schedule is not None and run.starts[1].schedule is not None
    first = sorted(run.starts[0].schedule.measurements, key=lambda m: m.sequence)
    for m in run.starts[1].schedule.measurements:
        before = max((f for f in first if f.sequence < m.sequence), key=lambda f: f.sequence, default=first[0])
        m.started_at, m.ended_at = before.started_at + 0.001, before.ended_at + 0.001


def second_start_renumbered_after_the_first(run: Run) -> None:
    """A sequential session dressed as interleaved with a consistent timeline: start-1 measured every pass,
    then start-2, sequence numbers and times following that order."""
    assert run.starts[0].schedule is not None and run.starts[1].schedule is not None
    ordered = [
        *sorted(run.starts[0].schedule.measurements, key=lambda m: m.sequence),
        *sorted(run.starts[1].schedule.measurements, key=lambda m: m.sequence),
    ]
    t = 0.0
    for sequence, m in enumerate(ordered):
        length = m.ended_at - m.started_at
        m.sequence, m.started_at, m.ended_at = sequence, t, t + length
        t += length + 0.01


def later_pass_slower(run: Run) -> None:
    """Every later pass of start-2 at half speed, pass 1 as it was: the median over passes sees it."""
    for (pass_index, _prompt), (_m, r) in run.starts[1].counted().items():
        if pass_index > 1:
            r.chunk_times = [t * 2.2 for t in r.chunk_times]


MUTATIONS += [
    (busy_during_a_counted_pair, "fresh-start-reproduction", "used 0.9 CPU-s while it ran"),
    (host_busy_during_a_counted_pair, "fresh-start-reproduction", "outside both starts used 0.8 CPU-s"),
    (host_unread_during_a_counted_pair, "fresh-start-reproduction", "outside both starts could not be read"),
    (host_rule_loosened, "fresh-start-reproduction", "schedule.outside_fraction is 1.0, the quiet rule is 0.15"),
    (later_pass_differs, "fresh-start-reproduction", "start-2 differs from start-1 at token 7"),
    (later_pass_differs, "teacher-exactness", "(request 3 of 3): token IDs differ from the teacher from token 7"),
    (later_pass_cached, "cold-prompt", "(request 2 of 3): 4 cached prompt tokens"),
    (one_pass_fewer, "fresh-start-reproduction", "start-2 evidence.schedule.passes is 2; the contract asks for 3"),
    (quiet_rule_loosened, "fresh-start-reproduction", "schedule.busy_floor_cpu_s is 5.0, the quiet rule is 0.05"),
    (schedule_dropped, "fresh-start-reproduction", "start-2 evidence.schedule is absent"),
    (later_pass_slower, "fresh-start-reproduction", "paired figure start-2 / start-1"),
    (second_start_after_the_first, "fresh-start-reproduction", "before start-2"),
    (second_start_onto_the_first, "fresh-start-reproduction", "not measured one at a time"),
    (second_start_renumbered_after_the_first, "fresh-start-reproduction", "the starts did not alternate"),
]


@pytest.mark.parametrize(("mutate", "gate", "message"), MUTATIONS, ids=[f"{m.__name__}->{g}" for m, g, _ in MUTATIONS])
def test_each_mutation_is_rejected_by_its_gate(recorded: Run, mutate, gate: str, message: str) -> None:
    _rejected(recorded.clone(), mutate, gate, message)


@pytest.mark.parametrize(("remove", "gate", "message"), REMOVALS, ids=[f"{m.__name__}->{g}" for m, g, _ in REMOVALS])
def test_each_gate_fails_closed_when_its_data_is_removed(recorded: Run, remove, gate: str, message: str) -> None:
    _rejected(recorded.clone(), remove, gate, message)


def test_the_required_subjects_come_from_the_contract(recorded: Run) -> None:
    c = recorded.contract
    required = catalogue.required_subjects(c, recorded.prompts)
    starts, ranks, prompts = c.reproduction.fresh_starts, c.engine.tensor_parallel, len(recorded.prompts)
    checks = len(catalogue.EVIDENCE_CHECK_SCOPES)
    assert len(required) == len(set(required)) == starts * (5 * ranks + 3 * prompts + 3 + checks) + 1
    assert ("cold-prompt", f"start-2 prompt:{recorded.prompts[-1]}") in required and (
        "fresh-start-reproduction",
        "run",
    ) in required
    teacher_only = {g for g, _ in catalogue.required_subjects(c.teacher(), recorded.prompts)}
    assert teacher_only == set(catalogue.GATE_NAMES) - catalogue.SPECULATIVE_GATES


def test_each_verdict_is_of_its_declared_subject(recorded: Run) -> None:
    required = set(catalogue.required_subjects(recorded.contract, recorded.prompts))
    assert {(v.gate, v.subject) for v in all_verdicts(recorded)} == required


def test_every_gate_has_a_mutation_that_fails_it() -> None:
    covered = {gate for _, gate, _ in MUTATIONS}
    assert covered == set(catalogue.GATE_NAMES)


def test_every_gate_has_a_removal_that_fails_it() -> None:
    assert {gate for _, gate, _ in REMOVALS} == set(catalogue.GATE_NAMES)


# --- the teacher belongs to the target -----------------------------------------------------------------


def _other_draft(run: Run) -> None:
    """The same target with another draft: a DFlash re-sweep (another width, another draft checkpoint)."""
    data = run.contract.canonical()
    data["name"] = "mini-laguna-cpu-other-draft"
    data["speculative"] = {**data["speculative"], "num_speculative_tokens": 7, "verify_width": 8}
    run.contract = Contract.model_validate(data, strict=False)
    for s in run.starts:
        s.draft.digest = "d" * 64
        s.target.manifest_digest = "e" * 64  # the whole mini's digest moves with its draft


def test_candidates_differing_only_in_the_draft_share_one_teacher(recorded: Run) -> None:
    run = recorded.clone()
    _other_draft(run)
    assert teacher.snapshot_path(SNAPSHOTS, run.contract, "x") == teacher.snapshot_path(
        SNAPSHOTS, recorded.contract, "x"
    )
    verdicts = [
        exactness.teacher_exactness(s, p, run.contract, run.snapshots[p], f"<snapshot {p}>")
        for s in run.starts
        for p in run.prompts
    ]
    assert all(v.passed for v in verdicts), [v.explain() for v in verdicts if not v.passed]


def test_a_candidate_with_another_target_meets_a_foreign_teacher(recorded: Run) -> None:
    run = recorded.clone()
    run.starts[0].target.digest = "a" * 64
    v = exactness.teacher_exactness(run.starts[0], run.prompts[0], run.contract, run.snapshots[run.prompts[0]], "<s>")
    assert not v.passed and any("foreign teacher: <s> was recorded on target checkpoint" in r for r in v.reasons), (
        v.reasons
    )


def test_a_teacher_mismatch_names_the_first_differing_token_and_the_text(recorded: Run) -> None:
    run = recorded.clone()
    changed_token(run)
    r = run.starts[1].requests[0]
    v = exactness.teacher_exactness(run.starts[1], r.prompt_id, run.contract, run.snapshots[r.prompt_id], "<s>")
    want = run.snapshots[r.prompt_id]["token_ids"][5]
    assert any(
        f"from token 5 on (this run {r.token_ids[5]}, teacher {want})" in x and "text here" in x for x in v.reasons
    ), v.reasons


def test_the_original_is_untouched_by_mutations(recorded: Run) -> None:
    assert all(v.passed for v in all_verdicts(recorded))


def test_a_consistent_per_prompt_shift_fails_whatever_the_medians_do(recorded: Run) -> None:
    """Every prompt of start-2 slowed so that the paired figure is 1 / 1.15, its endpoint median recorded as
    it was: under a paired tolerance of 10 % the paired figure fails the gate, the endpoint medians (within
    the contract's 35 % for this bundle) do not."""
    run = recorded.clone()
    stretch = 1.15 * _recorded_paired(recorded)
    for r in _every(run.starts[1]):
        r.chunk_times = [t * stretch for t in r.chunk_times]
    data = run.contract.canonical()
    data["reproduction"]["paired_tolerance"] = 0.10
    tight = Contract.model_validate(data, strict=False)
    verdict = reproduction.reproduction(run.starts, tight)
    assert not verdict.passed and len(verdict.reasons) == 1, verdict.reasons
    assert "paired figure start-2 / start-1" in verdict.reasons[0] and "tolerance 10%" in verdict.reasons[0]
    level = recorded.clone()  # the same starts with start-2 brought to a paired figure of 1: it passes
    for r in _every(level.starts[1]):
        r.chunk_times = [t * _recorded_paired(recorded) for t in r.chunk_times]
    before = reproduction.reproduction(level.starts, tight)
    assert before.passed, before.reasons
    shifted, unshifted = verdict.observed["paired_ratio_start2"], before.observed["paired_ratio_start2"]
    assert unshifted == pytest.approx(1, abs=1e-3) and shifted == pytest.approx(1 / 1.15, abs=1e-3)
    low, high = verdict.observed["paired_interval_start2"]
    assert low <= shifted <= high


def test_an_unquantized_kv_contract_wants_the_cache_in_the_model_dtype(recorded) -> None:
    """kv_cache_dtype "auto" stores the cache in the model's dtype: the recorded FP8 run's uint8 cache is not
    that, and the FP8-only gates (the scale audit, teacher exactness) are not the reference's to pass."""
    run = recorded.clone()
    auto = run.contract.model_copy(update={"engine": run.contract.engine.model_copy(update={"kv_cache_dtype": "auto"})})
    verdict = engine_resolution.engine_resolution(run.starts[0], 0, auto)
    assert not verdict.passed
    assert "KV cache tensor is 'uint8', the contract's KV dtype 'auto' stores it as 'float32'" in verdict.explain()
    reference = run.contract.unquantized_kv_reference()
    assert (
        set(catalogue.GATE_NAMES) - set(catalogue.applicable_gates(reference))
        == catalogue.SPECULATIVE_GATES | catalogue.FP8_ONLY_GATES
    )
    assert set(catalogue.applicable_gates(run.contract)) == set(catalogue.GATE_NAMES)


def test_ranks_past_ten_are_in_numeric_order(recorded: Run) -> None:
    """TP 12: ranks 0..11 audited once each are every rank, not 0, 1, 10, 11, 2, ... (sorted as text)."""
    run = recorded.clone()
    data = run.contract.canonical()
    data["engine"] = {**data["engine"], "tensor_parallel": 12}
    contract = Contract.model_validate(data, strict=False)
    start = run.starts[0]
    start.audits = [{**start.audits[0], "tp_rank": r} for r in reversed(range(12))]
    verdict = evidence_checks.evidence_ranks(start, contract)
    assert verdict.observed["audited_ranks"] == list(range(12))
    assert not any("audits from TP ranks" in reason for reason in verdict.reasons), verdict.reasons
