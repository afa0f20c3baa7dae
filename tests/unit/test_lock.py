"""requirements/lock.txt agrees with pyproject.toml, checked offline (no index, no uv; `make lock` regenerates
the lock with the index, scripts/lock.sh): every requirement of the project's dependencies and of its cpu and test
extras (what the lock is compiled from) is pinned there at a version its specifier allows, every line of the lock
is an exact pin, the three wheels of requirements/lock-excludes.txt are not in it, and its header names
`make lock` and the cut-off date that scripts/lock.sh passes to --exclude-newer.

What this cannot see offline: a dependency of a dependency that changed. The lock is whole only as uv resolved it;
rerun `make lock` after editing pyproject.toml, and the diff it prints says what moved.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKED_EXTRAS = (
    "cpu",
    "fleet",
    "test",
)  # scripts/lock.sh: uv pip compile pyproject.toml --extra cpu --extra fleet --extra test
# The platform scripts/lock.sh resolves for (Python 3.11, x86_64 linux): environment markers are judged there.
LOCK_ENVIRONMENT = {
    **default_environment(),
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined and comments dropped, as pip reads it."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, line))
    return out


def read_lock(path: Path) -> tuple[dict[str, Version], list[str]]:
    """The lock's pins by canonical name, and what is wrong with its lines."""
    pins: dict[str, Version] = {}
    problems: list[str] = []
    for number, line in _logical_lines(path.read_text()):
        if line.startswith("-"):
            problems.append(f"{path.name}:{number}: an option line ({line.split()[0]}); the lock holds pins only")
            continue
        spec = " ".join(word for word in line.split() if not word.startswith("--hash"))
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            problems.append(f"{path.name}:{number}: not a requirement: {line!r} ({exc})")
            continue
        specs = list(req.specifier)
        if req.url or len(specs) != 1 or specs[0].operator not in ("==", "==="):
            problems.append(f"{req.name}: the lock must pin an exact version ({path.name}:{number}: {spec!r})")
            continue
        name = canonicalize_name(req.name)
        if name in pins:
            problems.append(f"{req.name}: pinned twice in {path.name} (again at line {number})")
        pins[name] = Version(specs[0].version)
    return pins, problems


def read_excludes(path: Path) -> list[str]:
    return [canonicalize_name(line) for _, line in _logical_lines(path.read_text())]


def lock_disagreements(pyproject: Path, lock: Path, excludes: Path) -> list[str]:
    """Every way the lock and pyproject.toml disagree, one message each, naming the package."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [("dependencies", spec) for spec in project.get("dependencies", [])]
    extras = project.get("optional-dependencies", {})
    for extra in LOCKED_EXTRAS:
        if extra not in extras:
            return [f"pyproject.toml has no [project.optional-dependencies] {extra}; scripts/lock.sh compiles it"]
        wanted += [(f"extra {extra}", spec) for spec in extras[extra]]

    pins, problems = read_lock(lock)
    for where, spec in wanted:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({**LOCK_ENVIRONMENT, "extra": ""}):
            continue  # not for the platform the lock is for
        name = canonicalize_name(req.name)
        pinned = pins.get(name)
        if pinned is None:
            problems.append(f"{req.name}: pyproject.toml requires {spec!r} ({where}), the lock does not pin it")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{req.name}: pyproject.toml requires {spec!r} ({where}), the lock pins {pinned}")
    for name in read_excludes(excludes):
        if name in pins:
            problems.append(f"{name}: in the lock at {pins[name]}, but {excludes.name} keeps it out")
    return problems


def header_problems(lock: Path, script: Path) -> list[str]:
    header = "\n".join(line for line in lock.read_text().splitlines()[:10] if line.startswith("#"))
    cutoff = re.search(r"^EXCLUDE_NEWER=(\S+)$", script.read_text(), re.M)
    problems = []
    if not re.search(r"^#\s+make lock$", header, re.M):
        problems.append(f"{lock.name}'s header does not name the command that regenerates it (`make lock`)")
    if cutoff is None:
        problems.append(f"{script.name} sets no EXCLUDE_NEWER")
    elif f"--exclude-newer {cutoff.group(1)}" not in header.replace("\n# ", " "):
        problems.append(
            f"{lock.name}'s header does not record {script.name}'s --exclude-newer {cutoff.group(1)}: "
            "the date was moved without `make lock`, or the lock was edited by hand"
        )
    return problems


def test_the_lock_pins_what_pyproject_requires() -> None:
    problems = lock_disagreements(
        ROOT / "pyproject.toml", ROOT / "requirements/lock.txt", ROOT / "requirements/lock-excludes.txt"
    )
    assert not problems, "pyproject.toml and requirements/lock.txt disagree (run `make lock`):\n" + "\n".join(problems)


def test_the_lock_says_how_to_regenerate_it() -> None:
    problems = header_problems(ROOT / "requirements/lock.txt", ROOT / "scripts/lock.sh")
    assert not problems, "\n".join(problems)


def test_the_lock_leaves_out_the_three_wheels_that_break_transformers() -> None:
    assert set(read_excludes(ROOT / "requirements/lock-excludes.txt")) == {"torchvision", "torchaudio", "torchcodec"}
    pins, _ = read_lock(ROOT / "requirements/lock.txt")
    assert "torch" in pins and pins["torch"].local == "cpu", "the lock's torch is the CPU build"


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path, Path]:
    for name in ("pyproject.toml", "requirements/lock.txt", "requirements/lock-excludes.txt"):
        shutil.copy2(ROOT / name, tmp_path / Path(name).name)
    return tmp_path / "pyproject.toml", tmp_path / "lock.txt", tmp_path / "lock-excludes.txt"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert re.search(old, text, re.M), f"{old!r} not in {path.name}: the test's edit needs updating"
    path.write_text(re.sub(old, new, text, count=1, flags=re.M))


def test_a_disagreement_is_caught_and_names_the_package(copies: tuple[Path, Path, Path]) -> None:
    pyproject, lock, excludes = copies
    _edit(pyproject, r'"httpx>=[^"]*"', '"httpx>=99"')  # a raised floor the lock was not regenerated for
    _edit(pyproject, r'"hypothesis>=[^"]*",', '"hypothesis>=6.100",\n    "some-new-tool>=1",')  # a new test tool
    _edit(lock, r"^ruff==\S+", "ruff==0.16.0")  # a hand edit below the test extra's pin
    _edit(lock, r"^torch==", "torchvision==0.28.0\ntorch==")  # an excluded wheel back in
    problems = lock_disagreements(pyproject, lock, excludes)
    assert len(problems) == 4, problems
    [httpx] = [p for p in problems if p.startswith("httpx:")]
    assert "'httpx>=99' (dependencies), the lock pins" in httpx
    assert any(p.startswith("some-new-tool:") and "extra test" in p and "does not pin it" in p for p in problems)
    assert any(p.startswith("ruff:") and "the lock pins 0.16.0" in p for p in problems)
    assert any(p.startswith("torchvision:") and "lock-excludes.txt keeps it out" in p for p in problems)


def test_a_loose_or_hashed_line_is_judged_as_pip_reads_it(copies: tuple[Path, Path, Path]) -> None:
    pyproject, lock, excludes = copies
    # uv's --generate-hashes layout (scripts/lock.sh can turn it on): the pin still counts, hashes and all.
    _edit(lock, r"^tomli-w==(\S+)$", "tomli-w==\\1 \\\\\n    --hash=sha256:" + "0" * 64)
    _edit(lock, r"^filelock==\S+", "filelock>=3.12")
    problems = lock_disagreements(pyproject, lock, excludes)
    assert len(problems) == 2, problems
    assert problems[0].startswith("filelock: the lock must pin an exact version (lock.txt:"), problems
    assert problems[1] == "filelock: pyproject.toml requires 'filelock>=3.12' (dependencies), the lock does not pin it"


def test_a_header_that_lost_the_command_or_the_date_is_caught(tmp_path: Path) -> None:
    lock, script = tmp_path / "lock.txt", tmp_path / "lock.sh"
    shutil.copy2(ROOT / "requirements/lock.txt", lock)
    script.write_text((ROOT / "scripts/lock.sh").read_text())
    _edit(script, r"^EXCLUDE_NEWER=\S+$", "EXCLUDE_NEWER=2099-01-01T00:00:00Z")
    _edit(lock, r"^#\s+make lock$", "#    uv pip compile pyproject.toml")
    problems = header_problems(lock, script)
    assert len(problems) == 2 and "`make lock`" in problems[0] and "2099-01-01T00:00:00Z" in problems[1], problems


# Where each pin comes from (issue 49): PyPI, or for the CPU build of torch, PyTorch's CPU wheel index, which the lock's
# header names and scripts/setup-venv.sh installs from where pip's own sources lack it. A machine with only the public
# indexes then installs the lock; no committed file may point at a wheel folder of one machine.
PYPI_INDEX = "https://pypi.org/simple"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
COMMITTED_INSTALL_FILES = ("requirements/lock.txt", "pyproject.toml", "Makefile", "scripts/setup-venv.sh", ".ci/run")


def source_problems(lock: Path, script: Path) -> list[str]:
    """Every pin whose declared source is neither PyPI nor the lock header's PyTorch CPU index."""
    declared = re.findall(r"^# torch index: (\S+)$", lock.read_text(), re.M)
    script_index = re.search(r"^TORCH_INDEX=(\S+)$", script.read_text(), re.M)
    problems = []
    if declared != [TORCH_CPU_INDEX]:
        problems.append(f"{lock.name}'s header must name the CPU torch's index once as {TORCH_CPU_INDEX}: {declared}")
    if script_index is None or script_index.group(1) != TORCH_CPU_INDEX:
        problems.append(f"{script.name} must write TORCH_INDEX={TORCH_CPU_INDEX} into the header")
    pins, _ = read_lock(lock)
    for name, version in sorted(pins.items()):
        # PyPI refuses local version labels (PEP 440 `+cpu`): such a pin can only be the index's build of torch.
        if version.local is not None and name != "torch":
            problems.append(f"{name}=={version}: a local version is on no public index ({PYPI_INDEX} refuses them)")
    return problems


def local_sources(root: Path, names: tuple[str, ...] = COMMITTED_INSTALL_FILES) -> list[str]:
    """Lines of the committed install files that name a machine's own wheel folder or file index."""
    pattern = re.compile(r"--find-links|--no-index|file://|(^|[\s=])/opt/")
    return [
        f"{name}:{number}: {line.strip()}"
        for name in names
        if (root / name).exists()
        for number, line in enumerate((root / name).read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_every_pin_comes_from_pypi_or_the_pytorch_cpu_index() -> None:
    assert source_problems(ROOT / "requirements/lock.txt", ROOT / "scripts/lock.sh") == []
    assert local_sources(ROOT) == [], "a committed install file names one machine's wheel folder"


def test_a_foreign_source_or_a_local_folder_is_caught(tmp_path: Path) -> None:
    lock, script = tmp_path / "lock.txt", tmp_path / "lock.sh"
    shutil.copy2(ROOT / "requirements/lock.txt", lock)
    shutil.copy2(ROOT / "scripts/lock.sh", script)
    _edit(lock, r"^# torch index: \S+$", "# torch index: https://mirror.example/whl")
    _edit(lock, r"^numpy==(\S+)$", "numpy==\\1+local")
    problems = source_problems(lock, script)
    assert len(problems) == 2 and "mirror.example" in problems[0] and problems[1].startswith("numpy=="), problems
    (tmp_path / "Makefile").write_text("setup:\n\tpip install --find-links /srv/wheelhouse -r lock.txt\n")
    assert local_sources(tmp_path, ("Makefile",)) == [
        "Makefile:2: pip install --find-links /srv/wheelhouse -r lock.txt"
    ]
