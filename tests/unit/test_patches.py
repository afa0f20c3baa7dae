"""The mail patches in patches/ still apply, in order, to the installed vLLM's Python sources."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

PATCHES = sorted((Path(__file__).resolve().parents[2] / "patches").glob("*.patch"))
TOUCHED = re.compile(r"^diff --git a/(\S+) b/", re.M)


def test_there_is_one_patch_per_runtime_fix_plus_the_cli() -> None:
    from pytest_b70lab.in_engine import dflash_fix
    from pytest_b70lab.in_engine.fixes import FIX_NAMES

    # The DFlash fix is its own plugin until it is folded into in_engine.fixes; then it is one of FIX_NAMES
    # and must stop being counted here.
    assert dflash_fix.FIX_NAME not in FIX_NAMES
    runtime_fixes = [*FIX_NAMES, dflash_fix.FIX_NAME]
    assert len(PATCHES) == len(runtime_fixes) + 1, [p.name for p in PATCHES]


def test_patches_apply_to_the_installed_vllm(tmp_path: Path) -> None:
    site = Path(vllm.__file__).resolve().parent.parent
    for patch in PATCHES:
        for rel in TOUCHED.findall(patch.read_text()):
            target = tmp_path / rel
            if not target.exists() and (site / rel).exists():  # a file the patch creates is absent, as it should be
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(site / rel, target)
    for patch in PATCHES:
        run = subprocess.run(["git", "apply", "--verbose", str(patch)], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, f"{patch.name} does not apply to vLLM {vllm.__version__}:\n{run.stderr}"
