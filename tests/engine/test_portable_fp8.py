"""The embedded default through every gate on the portable FP8 path, as an AVX2-only CPU runs it.

On a CPU with AVX-512 the session runs under the AVX2 emulation (B70LAB_EMULATE_CPU=avx2: vLLM's AVX2 op
library, torch and oneDNN at AVX2, native FP8 refused), so that every run of the suite exercises both paths:
this session the portable one, the gates lane the native one. It is judged against the committed teacher,
which was recorded on the native path (notes/2026-12-01-fp8-kv-without-avx512.md says why that holds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_b70lab import host, session, vllm_portable_fp8

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]


def test_the_embedded_default_is_promotable_on_the_portable_path(tmp_path: Path, b70_cache_root: Path) -> None:
    identity = host.cpu_identity()
    if not host.native_fp8_possible(identity):
        pytest.skip(f"{host.describe(identity)}: every gates session here runs the portable path already")
    run = tmp_path / "run"
    env = {**os.environ, "B70LAB_CACHE_DIR": str(b70_cache_root), "B70LAB_EMULATE_CPU": "avx2"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "tests" / "gates"), "-m", "gates", f"--b70-run-dir={run}",
         "-p", "no:cacheprovider"],  # not -q: the report header, which forecasts the path, is checked
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1500)
    out = done.stdout[-8000:]
    verdict = json.loads((run / "promotion.json").read_text()) if (run / "promotion.json").exists() else {}
    assert done.returncode == 0 and verdict.get("promotable") is True, out
    assert "FP8 attention: portable" in done.stdout, "the report header forecasts the path"
    for start in session.load_run(run):
        assert start.host["emulated"] == "avx2", start.host
        for audit in start.audits:
            path = audit["fp8_attention"]
            assert (path["implementation"], path["op_library"], path["torch_cpu_capability"]) == \
                (vllm_portable_fp8.IMPLEMENTATION, "_C_AVX2", "AVX2"), f"start-{start.start_index}: {path}"
    print(next(line for line in out.splitlines() if line.startswith("PROMOTABLE")))
