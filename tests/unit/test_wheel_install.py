"""The plugin as a user installs it: a built wheel (not the editable checkout) in an environment of its own,
run from the lab's repository, finds the repository's contracts, prompt sets and mini weights there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the wheel built from a copy of the sources. Its other dependencies (pytest, pydantic,
    vllm, torch: gigabytes) are the project venv's, reached through a .pth line: that adds the folder to
    sys.path without running its own .pth files, so the checkout's editable hook stays out."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "pytest_b70lab", src / "pytest_b70lab", ignore=shutil.ignore_patterns("__pycache__"))
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        cwd=tmp,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("pytest_b70lab-*.whl")
    env = tmp / "env"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(env)], cwd=tmp)
    assert made.returncode == 0, made.stderr
    python = env / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip()
    )
    (site / "b70lab_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    put = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        cwd=tmp,
    )
    assert put.returncode == 0, put.stderr
    return env


def test_the_wheel_is_what_runs_and_carries_every_subpackage(installed: Path) -> None:
    # -P: not the working folder first on sys.path (that would be the checkout's package)
    shown = _run(
        [
            str(installed / "bin" / "python"),
            "-P",
            "-c",
            "import pytest_b70lab, pytest_b70lab.quality.judge, pytest_b70lab.mini.build, pytest_b70lab.plugin; "
            "print(pytest_b70lab.__file__)",
        ],
        cwd=REPO,
    )
    assert shown.returncode == 0, shown.stderr
    assert Path(shown.stdout.strip()).is_relative_to(installed), f"imported from the checkout: {shown.stdout}"


def test_contract_list_reads_the_repository_it_is_run_from(installed: Path, tmp_path: Path) -> None:
    listed = _run([str(installed / "bin" / "b70lab"), "contract", "list"], cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == sorted(p.stem for p in (REPO / "fixtures" / "contracts").glob("*.toml"))
    elsewhere = _run([str(installed / "bin" / "b70lab"), "contract", "list"], cwd=tmp_path)
    assert elsewhere.returncode == 1
    assert f"no contracts in {tmp_path}/fixtures/contracts" in elsewhere.stderr
    assert "Traceback" not in elsewhere.stderr


@pytest.mark.parametrize("contract", ["laguna-s-2.1-int4-fp8kv-b70", "mini-laguna-cpu"])
def test_a_dry_run_from_the_repository(installed: Path, contract: str) -> None:
    """The production contract (hub models) and the embedded default (whose mini is found from its trained
    weights under fixtures/mini/)."""
    ran = _run(
        [
            str(installed / "bin" / "python"),
            "-P",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--b70-dry-run",
            "--b70-contract",
            contract,
        ],
        cwd=REPO,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert f"contract {contract} (candidate)" in ran.stdout
    assert f"{installed}/bin/python -m pytest_b70lab.vllm_entry serve" in ran.stdout, (
        "the command must run the installed package's entry"
    )
    assert "b70lab dry run: nothing launched" in ran.stdout
    assert "plugins: b70lab-0.1.0" in ran.stdout
