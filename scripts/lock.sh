#!/usr/bin/env bash
# Regenerate requirements/lock.txt from pyproject.toml (`make lock`); tests/unit/test_lock.py checks offline, in
# `make test`, that the two still agree. Needs the package index (PyPI), not .venv.
#
# What the lock is: `uv pip compile pyproject.toml --extra cpu --extra fleet --extra test` (the project's dependencies, the
# embedded engine's extra, the fleet's (Ray) and the test tools; not `xpu`, which cannot share an environment with `cpu`), for
# CPython 3.11 on x86_64 manylinux_2_28 linux (the CPU torch wheel's tag), whatever machine runs it, minus the three
# wheels in requirements/lock-excludes.txt (torchvision, torchaudio, torchcodec: why there). scripts/setup-venv.sh
# installs it with --no-deps.
#
# Frozen in time: uv considers only files uploaded before EXCLUDE_NEWER, so a rerun gives the same lock (the same
# uv, the same pyproject.toml, the same sources) and a new release changes nothing until someone moves the date
# here on purpose: edit it, `make lock`, review the diff, then `make setup test`. Two consequences, found by
# experiment with uv 0.13.8 (notes/2026-12-03-lock-regenerated.md):
#  - file:// simple indexes (PEP 503 pages without upload times) lose every file under --exclude-newer: uv warns
#    "missing an upload date" and ignores it. Everything then resolves from the default index, which does record
#    upload times; the warnings are counted below, not repeated. A machine whose only index is such a mirror
#    cannot run `make lock`.
#  - --find-links folders are not filtered by date: where one holds the CPU torch wheel, that is where it comes from
#    (torch==2.13.0 is pinned exactly in pyproject.toml, so the date has nothing to decide there). Where none does,
#    PyTorch's CPU wheel index (TORCH_INDEX) is added as a source. Either way the lock's header names that index as
#    the CPU torch's source (`# torch index: URL`): setup-venv.sh installs torch from there when pip's own sources
#    lack it, and tests/unit/test_lock.py holds every other pin to PyPI.
#
# No hashes (yet). uv would give sha256 hashes for every file the index lists, and one for torch==2.13.0+cpu that
# it computes from the wheel in this machine's find-links folder: that wheel is not on PyPI (its upstream,
# download.pytorch.org, is not reachable from here to compare), so that hash is only this machine's. But a single
# hash in the lock turns on pip's --require-hashes for everything installed alongside it, and
# scripts/setup-ipex-venv.sh uses this file as a constraints file (`pip install -c`) for torch 2.8 and IPEX, which
# have no hashes: `make kernels-ipex` would fail. To turn hashes on: make setup-ipex-venv.sh drop the `--hash`
# lines from its constraints, then set hashes=(--generate-hashes) below and `make lock`.
#
# Sources: uv does not read pip's configuration, so the index, the extra indexes, the find-links and the CA bundle
# that `pip install` would use here (pip.conf files and PIP_* variables, read by pip's own option parser) are passed
# through; nothing of this machine's is written here or into the lock. pip's `constraint` setting is not passed:
# it caps what lies on a machine's disk (here torch<=2.14.1, torchvision<=0.29.1), it is not a source, and
# setup-venv.sh's `pip install` applies it anyway. UV_* variables (except UV_CACHE_DIR) and uv's config files are
# ignored, so that nobody's uv settings change the lock.
set -euo pipefail

EXCLUDE_NEWER=2026-12-03T00:00:00Z
PYTHON_VERSION=3.11
PYTHON_PLATFORM=x86_64-manylinux_2_28
TORCH_INDEX=https://download.pytorch.org/whl/cpu
hashes=()

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
lock=requirements/lock.txt
tools=.venv-lock
python=${PYTHON:-python3}

# uv, pinned with hashes (requirements/lock-tools.txt), in a venv of its own: .venv stays as setup made it.
uv_version=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements/lock-tools.txt)
uv=$tools/bin/uv
installed() { "$uv" --version 2>/dev/null | cut -d' ' -f2; }  # "uv 0.13.8 (x86_64-unknown-linux-gnu)"
if [ "$(installed)" != "$uv_version" ]; then
    "$python" -m venv --clear "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
        -r requirements/lock-tools.txt
fi
[ "$(installed)" = "$uv_version" ] || { echo "lock.sh: $tools has uv $(installed), not $uv_version" >&2; exit 1; }

# The sources `pip install` would use, as uv options, one per line (pip's own parser: an assignment, so that
# set -e stops here if pip's internals ever move, rather than resolving against PyPI alone).
sources_text=$("$tools/bin/python" - <<'PY'
from pip._internal.commands import create_command

options, _ = create_command("install").parse_args([])  # pip.conf files and PIP_* variables, as pip reads them
if options.no_index:
    print("--no-index")
else:
    print(f"--default-index={options.index_url}")
    for url in dict.fromkeys(options.extra_index_urls):
        print(f"--index={url}")
for link in dict.fromkeys(options.find_links):
    print(f"--find-links={link}")
if options.cert:
    print(f"--cert={options.cert}")
PY
)
mapfile -t sources <<<"$sources_text"
local_torch=no
for source in "${sources[@]}"; do
    case "$source" in
        --find-links=*) compgen -G "${source#--find-links=}/torch-*+cpu-*.whl" >/dev/null && local_torch=yes ;;
    esac
done
[ "$local_torch" = yes ] || sources+=("--index=$TORCH_INDEX")
echo "lock.sh: pip's sources: ${sources[*]}" >&2

for var in $(compgen -e | grep '^UV_' | grep -vx UV_CACHE_DIR || true); do unset "$var"; done
new=$(mktemp "$lock.XXXXXX")
log=$(mktemp)
trap 'rm -f "$new" "$new.tmp" "$log"' EXIT
# An empty output file: uv takes no preferences from the previous lock; the lock is a function of its inputs only.
if ! "$uv" pip compile pyproject.toml --extra cpu --extra fleet --extra test \
    --no-config --exclude-newer "$EXCLUDE_NEWER" \
    --python-version "$PYTHON_VERSION" --python-platform "$PYTHON_PLATFORM" \
    --index-strategy unsafe-best-match "${sources[@]}" \
    --excludes requirements/lock-excludes.txt "${hashes[@]}" \
    --custom-compile-command "make lock" --format requirements.txt --output-file "$new" >/dev/null 2>"$log"; then
    cat "$log" >&2
    exit 1
fi
undated=$(grep -c 'is missing an upload date' "$log" || true)
grep -v 'is missing an upload date' "$log" >&2 || true
if [ "$undated" -gt 0 ]; then
    echo "lock.sh: $undated files of file:// indexes have no upload date; --exclude-newer ignored them" >&2
fi

if ! grep -qE '^torch==[^ ]*\+cpu( |$)' "$new"; then
    echo "lock.sh: no CPU torch (torch==...+cpu) in the lock: neither pip's find-links nor $TORCH_INDEX gave it" >&2
    exit 1
fi

# uv's header names the command; say what it does and how the lock is installed.
{
    sed -n '1,2p' "$new"
    cat <<EOF
# (scripts/lock.sh: uv $uv_version pip compile pyproject.toml --extra cpu --extra fleet --extra test, for Python $PYTHON_VERSION on
# $PYTHON_PLATFORM, --exclude-newer $EXCLUDE_NEWER.) Not in the lock: torchvision, torchaudio,
# torchcodec (requirements/lock-excludes.txt); install with \`pip install --no-deps -r requirements/lock.txt\`
# after torch (\`make setup\`: scripts/setup-venv.sh). Every pin is from PyPI but the CPU torch, which is from:
# torch index: $TORCH_INDEX
EOF
    sed '1,2d' "$new"
} > "$new.tmp"
mv "$new.tmp" "$new"

# name==version per pin, names normalized (PEP 503): the old hand-made lock spelled them as pip freeze does.
pins() { grep -E '^[A-Za-z0-9]' "$1" | sed 's/ .*//' | awk -F'==' '{n=tolower($1); gsub(/[-_.]+/,"-",n); print n"=="$2}' | sort; }
if [ -f "$lock" ]; then
    changes=$(diff <(pins "$lock") <(pins "$new") | grep '^[<>]' || true)
else
    changes="(no previous lock)"
fi
chmod 644 "$new"
mv "$new" "$lock"
echo "$lock: $(pins "$lock" | wc -l) pins, uploaded before $EXCLUDE_NEWER"
if [ -n "$changes" ]; then
    echo "changed pins (< before, > now):"
    echo "$changes"
else
    echo "no pin changed"
fi
