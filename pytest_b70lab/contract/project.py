"""Where the lab's own files are: contracts, prompt and quality sets, the mini's trained weights.

They live in the lab's repository, not in the package: an installed wheel carries none of them. So the
surfaces say where the repository is (the plugin: pytest's root folder; the command line: the working
folder), and a relative path is looked up there first. An editable checkout also finds its own files, so
a run rooted elsewhere (pytester's temporary folders, a contract copied to /tmp) still reaches them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# The folder above the package: the checkout of an editable install; site-packages for an installed wheel,
# where the lookups below simply find nothing.
_BESIDE_PACKAGE = Path(__file__).resolve().parents[2]
_root: Path | None = None


def use_root(folder: Path | str) -> None:
    """The surface's root folder (pytest's rootpath; the CLI's working folder), searched first."""
    global _root
    _root = Path(folder).resolve()


def bases() -> list[Path]:
    """The folders a relative path is looked up in, in order."""
    found: list[Path] = []
    for base in (_root, Path.cwd().resolve(), _BESIDE_PACKAGE):
        if base is not None and base not in found:
            found.append(base)
    return found


def find(relative: str | Path) -> Path:
    """The first existing `base / relative`; where none exists, the path under the first base (so that an
    error names the place the user would look)."""
    path = Path(relative).expanduser()
    if path.is_absolute():
        return path
    for base in bases():
        if (base / path).exists():
            return base / path
    return bases()[0] / path


def commit() -> str | None:
    """The lab repository's commit (git HEAD of the first base), with "-dirty" where a tracked file differs from
    it; None outside a git checkout or without git. Each start records it, so that a series of figures over many
    runs (`b70lab history`) can say at which commit a figure moved."""
    base = bases()[0]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(base), *args], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changed else "")
