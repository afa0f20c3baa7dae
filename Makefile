# The two commands of the README. Everything runs from .venv/bin; `make setup` (re)creates the venv when it
# is missing or older than the dependency files.
VENV      := .venv
PYTHON    := $(VENV)/bin/python
STAMP     := $(VENV)/.b70lab-installed
PYTEST_ARGS ?=
export B70LAB_CACHE_DIR ?= $(CURDIR)/data/cache

.PHONY: setup gates test clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/lock.txt
	bash scripts/setup-venv.sh $(VENV)
	touch $@

gates: setup
	mkdir -p reports
	$(PYTHON) -m pytest -m gates --junitxml=reports/gates.xml $(PYTEST_ARGS)

test: setup
	mkdir -p reports
	$(PYTHON) -m pytest --junitxml=reports/junit.xml $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
