"""The embedded default under the AVX2 emulation, end to end: `pytest -m gates` on the default contract
(`mini-laguna-cpu-int4`: INT4 target and its own INT4 draft) on the portable INT4 path and the portable FP8 path,
as an AVX2-only CPU runs it.

Target and draft are plain folders of the mini's W4A16 build (config, tokenizer, compressed-tensors
pack-quantized safetensors; no b70lab manifest), exported by the session itself when they are missing, so the
load and scale audits read the checkpoints' own packed tensors, as they read production's INT4 checkpoints,
and the committed teacher of that contract (target only, INT4 weights, FP8 KV) is judged. The session must be
PROMOTABLE with every checkpoint tensor covered and every rank's INT4 layers on the portable path.

On a CPU with AVX-512 the session runs under the AVX2 emulation (B70LAB_EMULATE_CPU=avx2: vLLM's AVX2 op
library, torch and oneDNN at AVX2, native FP8 refused), so that every run of the suite runs the default on both FP8
paths with one session each: this one the portable path, the gates lane (tests/gates) the machine's own. On an
AVX2-only CPU the gates lane's session is already this one, and this test skips. Live
sessions of the unquantized lane (`mini-laguna-cpu`, bf16 weights) stay in the suite: the lab layout
(`mini-laguna-cpu-tp4ep4`), the sweep's smoke, the degraded-quality start and the fault rows.

The contract judges gate 7 by the equivalence rule with passes added until the paired interval is decided (3 to
8): the stopping rule runs live in every CI run, on the portable paths here and on the machine's own in the gates
lane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_b70lab.contract import schema as contract
from pytest_b70lab.contract.defaults import DEFAULT_CONTRACT
from pytest_b70lab.engine.starts import model_folder
from pytest_b70lab.evidence import checkpoint, host
from pytest_b70lab.evidence.run_folder import TABLES_COPY, read_starts
from pytest_b70lab.in_engine import portable_fp8, portable_int4

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
CONTRACT = DEFAULT_CONTRACT


def test_an_int4_path_checkpoint_is_promotable_on_the_portable_paths_with_full_load_audit_coverage(
    tmp_path: Path, b70_cache_root: Path
) -> None:
    run_dir = tmp_path / "run"
    if not host.native_fp8_possible(host.cpu_identity()):
        # One 800-token session of the default took 384 s on an AVX2-only CPU, where CI's budget is tightest.
        pytest.skip(
            "this CPU has no native FP8 path: the gates lane (tests/gates) runs this same contract on the portable "
            "FP8 and INT4 paths natively, and gates 2, 3 and the load audit judge them there"
        )
    env = {**os.environ, "B70LAB_CACHE_DIR": str(b70_cache_root), "B70LAB_EMULATE_CPU": "avx2"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "tests" / "gates"),
            "-m",
            "gates",
            "-p",
            "no:cacheprovider",
            "--b70-contract",
            CONTRACT,
            f"--b70-run-dir={run_dir}",  # not -q: the header forecasts the path
            "--b70-no-probe",
        ],  # the checkpoint's lane is the point: the probe is the gates lane's
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
    )
    tail = done.stdout[-6000:]
    assert done.returncode == 0, tail
    assert "PROMOTABLE at" in tail and f"contract {CONTRACT}" in tail, tail
    assert "FP8 attention: portable" in done.stdout, "the report header forecasts the path"

    verdict = json.loads((run_dir / "promotion.json").read_text())
    assert verdict["promotable"] and verdict["complete"] and verdict["contract"] == CONTRACT
    starts = read_starts(run_dir)
    for start in starts:
        assert start.host["emulated"] == "avx2", start.host
        for audit in start.audits:
            path = audit["fp8_attention"]
            assert (path["implementation"], path["op_library"], path["torch_cpu_capability"]) == (
                portable_fp8.IMPLEMENTATION,
                "_C_AVX2",
                "AVX2",
            ), f"start-{start.start_index}: {path}"
            int4 = audit["int4"]
            assert int4["implementation"] == portable_int4.IMPLEMENTATION and int4["forced"], int4
            assert set(int4["linear"]) == {"portable"} and set(int4["moe"]) == {"portable"}, int4
    # The tables came from reading the exported folders, not from a manifest.
    folders = {part: model_folder(getattr(contract.load(CONTRACT), part)) for part in ("target", "draft")}
    assert not any((f / "manifest.json").exists() for f in folders.values())
    tables = json.loads((run_dir / TABLES_COPY).read_text())
    for part, folder in folders.items():
        assert tables[part]["digest"] == checkpoint.read_table(folder)["digest"]
    audits = [g["observed"] for g in verdict["gates"] if g["gate"] == "load-audit"]
    assert len(audits) == len(starts) == 2
    for observed in audits:
        for part in ("target", "draft"):
            tensors = tables[part]["tensors"]
            scales = sum(1 for name in tensors if checkpoint.engine_kv_scale(name))
            assert observed[f"{part}_tensors"] == len(tensors)
            assert observed[f"{part}_tensors_covered"] == len(tensors) - scales, observed
            assert observed[f"{part}_exempted"] == scales and observed[f"{part}_mismatched"] == 0
    _sampled_as_the_rule_says(starts, verdict)
    print(next(line for line in tail.splitlines() if line.startswith("PROMOTABLE")))


def _sampled_as_the_rule_says(starts: list, verdict: dict) -> None:
    """Each start records the same sampling; the session served every prompt on both starts in each pass it
    counts; gate 7 judged the interval (its observed values name the passes and why it stopped)."""
    rule = contract.load(CONTRACT).reproduction
    sampled = [s.schedule.sampling for s in starts]
    assert sampled[0] is not None and sampled[0] == sampled[1], sampled
    assert (sampled[0].min_passes, sampled[0].max_passes, sampled[0].tolerance) == (3, rule.max_passes, 0.10)
    served = starts[0].schedule.passes
    assert 3 <= served <= (rule.max_passes or 0) and all(s.schedule.passes == served for s in starts)
    assert {k[0] for s in starts for k in s.counted()} == set(range(1, served + 1))
    (gate7,) = [g["observed"] for g in verdict["gates"] if g["gate"] == "fresh-start-reproduction"]
    assert gate7["passes_served"] == served and gate7["sampling_stopped"] == sampled[0].stopped, gate7
    low, high = gate7["paired_interval_start2"]
    assert 0.9 <= low <= high <= 1.1, gate7
