"""Keep Ray out of the engine's processes.

vLLM imports Ray wherever it is installed (`vllm/v1/engine/utils.py` imports `vllm/v1/executor/ray_utils.py`, which
tries `import ray` at import), so a lab that installs the `fleet` extra into the engine's environment would load
Ray into every engine process: its import-time threads and memory, and a Ray that vLLM could pick as its executor.
The engine runs vLLM's multiprocessing executor on every platform (engine/command.py), and nothing of it needs
Ray; vLLM treats a failed `import ray` as "Ray is not installed". A finder at the head of sys.meta_path refuses
the import, installed by the entry module, which every engine process runs first (spawned children re-import it
as their __main__)."""

from __future__ import annotations

import importlib.abc
import sys

REFUSED = "ray"


class RefuseRay(importlib.abc.MetaPathFinder):
    """Answers every import of `ray` or `ray.*` with ImportError, as if Ray were not installed."""

    refused = 0  # how many imports were turned away in this process (the rank audit reports it)

    def find_spec(self, fullname, path=None, target=None):
        if fullname == REFUSED or fullname.startswith(REFUSED + "."):
            RefuseRay.refused += 1
            raise ImportError(f"{fullname}: Ray is kept out of the engine's processes (pytest_b70lab.in_engine.no_ray)")
        return None


def install() -> None:
    """Idempotent: one finder, first in the path."""
    if not any(isinstance(f, RefuseRay) for f in sys.meta_path):
        sys.meta_path.insert(0, RefuseRay())


def loaded() -> bool:
    """Whether Ray is in this process anyway (imported before install())."""
    return REFUSED in sys.modules
