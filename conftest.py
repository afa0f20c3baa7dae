"""What every test folder of the repository shares (the plugin itself lives in pytest_b70lab/plugin/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis profiles for every test folder (the fuzzing of tests/unit/test_fuzz.py, the kernel tests' page
# edges): CI runs a fixed, reproducible set that keeps `pytest -m kernels -n 2` within two minutes here; a
# developer's run explores new examples; `thorough` (HYPOTHESIS_PROFILE=thorough, or hypothesis's own
# --hypothesis-profile) looks ten times harder. Kernel calls on big pages are slow by nature, not a health
# problem.
_SLOW_BY_NATURE = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True, suppress_health_check=_SLOW_BY_NATURE
)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_SLOW_BY_NATURE)
settings.register_profile("thorough", max_examples=400, deadline=None, suppress_health_check=_SLOW_BY_NATURE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

# Each marked lane lives in one folder. A run that selects one lane alone (`pytest -m gates`, the lab's most
# frequent command, and every replay of saved evidence) then skips importing the other folders, whose
# modules pull in torch and vLLM: 12 s of a 14 s gates replay here. tests/unit/test_lanes.py checks that no
# test of a lane lives outside its folder, so nothing is ever skipped that the marker would have selected.
LANE_FOLDERS = {
    "gates": "tests/gates",
    "teacher": "tests/gates",
    "quality": "tests/quality",
    "kernels": "tests/kernels",
    "faults": "tests/faults",
    "fleet": "tests/fleet",
}
REPO = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    folder = LANE_FOLDERS.get((config.getoption("-m") or "").strip())
    if folder is None:
        return None
    tests, lane = REPO / "tests", REPO / folder
    path = Path(collection_path).resolve()
    if not path.is_relative_to(tests) or path.is_relative_to(lane) or lane.is_relative_to(path):
        return None
    return True
