"""The import part: what the auto-loaded plugin adds to `pytest --co` of a file that does not use it."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .figures import BenchError, Figure, checked, wall


def plugin_cost(repeats: int = 21) -> Figure:
    """Alternating runs with and without `-p no:b70lab` in a folder of its own (no project conftest or
    ini), so the difference of the medians is the plugin alone: its import and its hooks."""
    with tempfile.TemporaryDirectory(prefix="b70bench-") as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text("[pytest]\n")
        (folder / "test_one.py").write_text("def test_one():\n    pass\n")
        base = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "test_one.py"]
        with_plugin: list[float] = []
        without: list[float] = []
        for _ in range(repeats):
            for times, extra in ((with_plugin, []), (without, ["-p", "no:b70lab"])):
                seconds, done = wall(base + extra, folder)
                checked(done, "pytest --co on a one-test file")
                times.append(seconds)
    cost_ms = (statistics.median(with_plugin) - statistics.median(without)) * 1000
    import_ms = statistics.median(_module_import_ms("pytest_b70lab.plugin") for _ in range(5))
    return Figure(
        "import",
        "plugin cost on an unrelated `pytest --co`",
        cost_ms,
        "ms",
        "<= 50 ms",
        cost_ms <= 50,
        f"median of {repeats}: {statistics.median(with_plugin) * 1000:.0f} ms with the plugin, "
        f"{statistics.median(without) * 1000:.0f} ms with -p no:b70lab (run-to-run noise is tens of ms); "
        f"the plugin module's own import (-X importtime, pytest already loaded): {import_ms:.1f} ms",
        {"with_s": with_plugin, "without_s": without, "plugin_import_ms": import_ms},
    )


def _module_import_ms(module: str) -> float:
    """Cumulative import time of `module` alone, pytest imported first (it is loaded before any plugin)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import pytest; import {module}"], capture_output=True, text=True
    )
    checked(done, f"python -X importtime -c 'import {module}'")
    for line in done.stderr.splitlines():
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2] == module:
            return int(fields[1]) / 1000
    raise BenchError(f"python -X importtime did not report {module}")
