"""The repository conftest skips whole folders when a run selects one lane (`-m gates`): that is only
sound while every test of a lane lives in the lane's folder."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# By path: `conftest` as a module name is also tests/kernels/conftest.py.
LANE_FOLDERS = runpy.run_path(str(REPO / "conftest.py"))["LANE_FOLDERS"]

# Collects the whole repository (no -m: nothing skipped) and writes each test's id with its markers.
PROBE = """
import json, sys, pytest
class Probe:
    def pytest_collection_modifyitems(self, items):
        with open(sys.argv[1], "w") as f:
            json.dump([[i.nodeid, sorted({m.name for m in i.iter_markers()})] for i in items], f)
sys.exit(pytest.main(["--co", "-q", "-p", "no:cacheprovider"] + sys.argv[2:], plugins=[Probe()]))
"""


def _collect(out: Path, *args: str) -> list[tuple[str, list[str]]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [tuple(item) for item in json.loads(out.read_text())]


def test_every_test_of_a_lane_lives_in_its_folder(tmp_path: Path) -> None:
    everything = _collect(tmp_path / "all.json")
    for lane, folder in LANE_FOLDERS.items():
        marked = [node for node, markers in everything if lane in markers]
        assert marked, f"no test is marked {lane}"
        outside = [node for node in marked if not node.startswith(folder + "/")]
        assert not outside, f"`-m {lane}` skips every folder but {folder}/, so these would never run: {outside}"
    gates_alone = _collect(tmp_path / "gates.json", "-m", "gates")
    assert {node for node, _ in gates_alone} >= {node for node, markers in everything if "gates" in markers}
    assert all(node.startswith("tests/gates/") for node, _ in gates_alone), "-m gates still imports other folders"
