"""The gate suite the plugin ships: the tests of `pytest -m gates` and `pytest -m teacher`, collected in the
lab's gates folder (`b70_gates_dir`, default tests/gates) as if they were files there, so that a lab repository
that only installs the plugin has them. Each test is one call of the catalogue (judge/catalogue.py), as the
in-process judge (judge/folder.py) is.

A module here is collected under the file name in MODULES: the node ids (`tests/gates/test_rank_gates.py::
test_launch_flags[start-2-rank-0]`), JUnit names and syrupy's snapshot paths (`__snapshots__/<folder>/
test_teacher/...`) are the ones the lab's files had before the suite moved into the package."""

from __future__ import annotations

# collected file name -> module of this package, in collection order
MODULES = {
    "test_evidence_complete.py": "evidence_complete",
    "test_prompt_gates.py": "prompt_gates",
    "test_rank_gates.py": "rank_gates",
    "test_run_gates.py": "run_gates",
    "test_speedup.py": "speedup",
    "test_teacher.py": "teacher",
}
