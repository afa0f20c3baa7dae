"""The plugin as a user installs it: a built wheel (not the editable checkout) in an environment of its own,
run from the lab's repository, finds the repository's contracts, prompt sets and mini weights there."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(
    cmd: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    return subprocess.run(cmd, cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def _pinned_dependencies(wheel: Path) -> list[str]:
    """The wheel's declared dependencies and theirs, each at the version requirements/lock.txt pins: what a
    lab installing the wheel from the lock gets, resolved here without an index (the closure is read from the
    project venv's installed metadata, the versions from the lock)."""
    import email
    import importlib.metadata as md
    import re
    import zipfile

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))))
    pins = {
        canonicalize_name(m[1]): m[2]
        for line in (REPO / "requirements" / "lock.txt").read_text().splitlines()
        if (m := re.match(r"([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip()))
    }
    todo = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in md.requires(req.name) or []]
    unpinned = sorted(seen - set(pins))
    assert not unpinned, f"declared dependencies the lock does not pin: {unpinned} (make lock)"
    return [f"{name}=={pins[name]}" for name in sorted(seen)]


QUICKSTART = REPO / "docs" / "quickstart.md"
LIVE = "# live:"  # the first line of a quickstart block that needs the engine and minutes


def quickstart_blocks(page: Path = QUICKSTART) -> list[str]:
    """The page's `bash` blocks in order, read with a CommonMark parser (markdown-it-py)."""
    from markdown_it import MarkdownIt

    return [t.content for t in MarkdownIt().parse(page.read_text()) if t.type == "fence" and t.info.strip() == "bash"]


def stand_ins(wheel: Path) -> dict[str, str]:
    """What the test runs instead of each live block, by the word after `# live: the`: the wheel's own dependencies
    at the lock's versions instead of the engine; the committed teacher snapshots instead of recording them; the
    committed run of the embedded default instead of a gates session (the replay block then judges it as written)."""
    snapshots = REPO / "tests" / "gates" / "__snapshots__"
    bundle = REPO / "fixtures" / "evidence" / "mini-laguna-cpu-int4"
    return {
        "engine": f"{shlex.quote(sys.executable)} -m pip --python .venv/bin/python install --quiet --no-deps "
        + " ".join(_pinned_dependencies(wheel)),
        "teacher": f"mkdir -p tests/gates && cp -r {shlex.quote(str(snapshots))} tests/gates/",
        "gates": f"mkdir -p data/runs && cp -r {shlex.quote(str(bundle))} data/runs/20261205-000000",
    }


def live_block_drift(blocks: list[str], lock: Path = REPO / "requirements" / "lock.txt") -> list[str]:
    """What the live blocks, which the test does not run, say differently from the project: the engine block must
    install the lock's torch from the lock's torch index and then the lock; the teacher and gates blocks must be the
    README's commands."""
    text = lock.read_text()
    torch = re.search(r"^(torch==\S+)", text, re.M)
    index = re.search(r"^# torch index: (\S+)$", text, re.M)
    wanted = {
        "engine": [torch and torch[1], index and index[1], '-r "$B70LAB_CHECKOUT/requirements/lock.txt"'],
        "teacher": [".venv/bin/pytest -m teacher --snapshot-update"],
        "gates": [".venv/bin/pytest -m gates"],
    }
    live = {b.split()[3]: b for b in blocks if b.startswith(LIVE)}
    problems = [f"no live block for the {name}" for name in wanted if name not in live]
    problems += [f"live block {name!r} is not one the test stands in for" for name in live if name not in wanted]
    problems += [
        f"the {name} block does not say {want!r}"
        for name, wants in wanted.items()
        for want in wants
        if name in live and (want is None or want not in live[name])
    ]
    return problems


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """docs/quickstart.md run in an empty folder: every block as written, in one shell (its `cd` carries over),
    the live ones replaced by their stand-ins. B70LAB_CHECKOUT is a folder holding the wheel built from a copy of
    the sources and the repository's lock and fixtures. Returns the lab folder and what the shell printed."""
    tmp = tmp_path_factory.mktemp("quickstart")
    src, checkout, home = tmp / "src", tmp / "checkout", tmp / "home"
    for folder in (src, checkout, home):
        folder.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "pytest_b70lab", src / "pytest_b70lab", ignore=shutil.ignore_patterns("__pycache__"))
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    built = _run([*wheel_cmd, "-w", str(checkout / "dist"), str(src)], cwd=tmp)
    assert built.returncode == 0, built.stderr
    (wheel,) = (checkout / "dist").glob("pytest_b70lab-*-py3-none-any.whl")
    for name in ("requirements", "fixtures"):
        (checkout / name).symlink_to(REPO / name)
    blocks = quickstart_blocks()
    assert live_block_drift(blocks) == []
    replace = stand_ins(wheel)
    script = ["set -euo pipefail"]
    for number, block in enumerate(blocks, 1):
        script.append(f"echo '### quickstart block {number}'")
        script.append(replace[block.split()[3]] if block.startswith(LIVE) else block)
    env = {"B70LAB_CHECKOUT": str(checkout), "HOME": str(home)}
    ran = _run(["bash", "-c", "\n".join(script)], cwd=home, timeout=600, env=env)
    assert ran.returncode == 0, f"quickstart failed:\n{ran.stdout[-4000:]}\n{ran.stderr[-4000:]}"
    return home / "my-lab", ran


@pytest.fixture(scope="module")
def installed(quickstart: tuple[Path, subprocess.CompletedProcess]) -> Path:
    """The quickstart's environment: the wheel and its declared dependencies at the lock's versions, nothing of
    the project venv, so a dependency used but not declared fails here. No engine: vllm and torch are the `cpu`
    extra's."""
    return quickstart[0] / ".venv"


def test_the_quickstart_ends_in_a_promotable_replay_of_its_run(
    quickstart: tuple[Path, subprocess.CompletedProcess],
) -> None:
    lab, ran = quickstart
    assert re.search(
        r"^PROMOTABLE at [\d.]+ / [\d.]+ tok/s median \(start-1 / start-2\) - contract mini-laguna-cpu-int4 "
        r"\(79/79 required gate subjects passed\)$",
        ran.stdout,
        re.M,
    ), ran.stdout[-3000:]
    assert "verdict   PROMOTABLE at" in ran.stdout, "b70lab evidence show reads the verdict back"
    assert (lab / "data" / "runs" / "20261205-000000" / "report.html").is_file()
    held = [p for p in lab.rglob("*.py") if not p.is_relative_to(lab / ".venv")]
    assert (lab / "pyproject.toml").is_file() and held == [], "the lab holds no test file"


def test_a_live_block_that_drifts_from_the_project_is_caught() -> None:
    blocks = quickstart_blocks()
    drifted = [b.replace("torch==", "torch==9.9.9+cpu #") if "# live: the engine" in b else b for b in blocks]
    drifted = [b for b in drifted if "# live: the teacher" not in b]
    problems = live_block_drift(drifted)
    assert problems[0] == "no live block for the teacher", problems
    assert any("the engine block does not say 'torch==" in p for p in problems), problems


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


def _dry_run(installed: Path, contract: str) -> subprocess.CompletedProcess:
    return _run(
        [
            str(installed / "bin" / "python"),
            "-P",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--noconftest",  # the repository's own conftest wants its test tools (hypothesis), not the plugin's
            "--b70-dry-run",
            "--b70-contract",
            contract,
        ],
        cwd=REPO,
    )


def test_a_dry_run_of_the_production_contract_from_the_repository(installed: Path) -> None:
    contract = "laguna-s-2.1-int4-fp8kv-b70"
    ran = _dry_run(installed, contract)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert f"contract {contract} (candidate)" in ran.stdout
    assert f"{installed}/bin/python -m pytest_b70lab.vllm_entry serve" in ran.stdout, (
        "the command must run the installed package's entry"
    )
    assert "b70lab dry run: nothing launched" in ran.stdout
    assert re.search(r"^plugins: .*\bb70lab-0\.1\.0\b", ran.stdout, re.M), ran.stdout[:2000]


def test_the_embedded_default_without_the_engine_says_what_to_install(installed: Path) -> None:
    """The mini is named by its libraries' versions: the plugin alone (no `cpu` extra) cannot find it, and
    says so in one line instead of a traceback."""
    ran = _dry_run(installed, "mini-laguna-cpu")
    assert ran.returncode == pytest.ExitCode.USAGE_ERROR, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "is not installed in this environment: install the engine (the `cpu` extra" in ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr and "INTERNALERROR" not in ran.stdout


def _lab(root: Path) -> Path:
    """A lab repository that only installs the plugin: a pyproject naming its contract, the contract and its
    prompt set, the teacher snapshots, a copy of the committed bundle, and the B70 contract with its sets. No
    test file: the gates are the wheel's."""
    fixtures = REPO / "fixtures"
    (root / "contracts").mkdir(parents=True)
    shutil.copy(fixtures / "contracts" / "mini-laguna-cpu.toml", root / "contracts" / "candidate.toml")
    shutil.copy(fixtures / "contracts" / "laguna-s-2.1-int4-fp8kv-b70.toml", root / "contracts" / "b70.toml")
    for named in (
        "prompts/mini-v3.jsonl",
        "prompts/laguna-s-2.1-b70-v1.jsonl",
        "quality/laguna-s-2.1-b70-quality-v1.jsonl",
    ):
        (root / "fixtures" / named).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(fixtures / named, root / "fixtures" / named)
    shutil.copytree(REPO / "tests" / "gates" / "__snapshots__", root / "tests" / "gates" / "__snapshots__")
    shutil.copytree(fixtures / "evidence" / "mini-laguna-cpu", root / "bundle")
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\nb70_contract = "contracts/candidate.toml"\n')
    assert not list(root.rglob("*.py"))
    return root


def test_a_lab_folder_with_no_test_file_replays_the_bundle_and_dry_runs_the_b70_contract(
    installed: Path, tmp_path: Path
) -> None:
    """Issue 36's lab: the same verdict line as this checkout's replay of the bundle, and the B70 launch."""
    lab = _lab(tmp_path / "lab")
    python = str(installed / "bin" / "python")
    replay = _run(
        [python, "-P", "-m", "pytest", "-m", "gates", "--b70-evidence=bundle", "-p", "no:cacheprovider"], cwd=lab
    )
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
    verdict = re.search(
        r"^PROMOTABLE at ([\d.]+ / [\d.]+) tok/s median \(start-1 / start-2\) - contract mini-laguna-cpu "
        r"\(79/79 required gate subjects passed\)$",
        replay.stdout,
        re.M,
    )
    assert verdict is not None, replay.stdout[-3000:]
    assert "tests/gates/test_rank_gates.py" in replay.stdout, "the suite is collected in the lab's gates folder"
    b70lab = str(installed / "bin" / "b70lab")
    shown = _run([b70lab, "evidence", "show", "bundle"], cwd=lab)
    assert shown.returncode == 0 and f"verdict   PROMOTABLE at {verdict[1]}" in shown.stdout, shown.stderr[-2000:]
    page = _run([b70lab, "report", "bundle"], cwd=lab)
    assert page.returncode == 0 and (lab / "bundle" / "report.html").is_file(), page.stderr[-2000:]
    dry = _run([python, "-P", "-m", "pytest", "--b70-dry-run", "--b70-contract", "contracts/b70.toml"], cwd=lab)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert f"{installed}/bin/python -m pytest_b70lab.vllm_entry serve poolside/Laguna-S-2.1-INT4" in dry.stdout
    assert "xpu profile: 4 ranks" in dry.stdout
