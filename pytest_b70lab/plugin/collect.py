"""The shipped gate suite (suite/) collected in the lab's gates folder: pytest's own pattern for tests that are
not files of the project (a `pytest_collect_directory` collector), so that a lab repository needs no test file
of its own and this repository's node ids stay what they were when the suite was files in tests/gates."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .state import STATE, Settings
from .suite import MODULES

DEFAULT_GATES_DIR = "tests/gates"


def gates_folder(config: pytest.Config) -> Path | None:
    """The folder the suite is collected in, or None where the project has not asked for gates: it names
    `b70_gates_dir` or a contract in its ini file, or the command line names a contract or evidence. (A plugin
    installed beside other projects must not grow tests in their tests/gates.)"""
    state = config.stash.get(STATE, None)
    settings = state.settings if state is not None else Settings.from_config(config)
    named = settings.gates_dir
    asked = named is not None or settings.contract is not None or settings.replay_dir is not None
    if not asked:
        return None
    if named is not None:
        return named.resolve()
    # `--b70-evidence RUN` (a space, not `=`) makes pytest take RUN for its root folder, before any plugin
    # loads (docs/gates.md): the working folder's gates folder is then the one meant.
    candidates = [Path(config.rootpath) / DEFAULT_GATES_DIR, config.invocation_params.dir / DEFAULT_GATES_DIR]
    return next((c for c in candidates if c.is_dir()), candidates[0]).resolve()


class GatesFolder(pytest.Dir):  # type: ignore[misc]  # pytest marks Dir final; its collect is what is extended
    """The gates folder as pytest's Dir collects it, plus the suite's modules its files do not replace."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        found = list(super().collect())
        present = {node.path.name for node in found if isinstance(node, pytest.File)}
        shipped: list[pytest.Collector] = []
        for name, module in MODULES.items():
            path = self.path / name
            if name in present:
                warnings.warn(
                    pytest.PytestWarning(
                        f"b70lab: {path} replaces the gate suite's own {name} (remove it to use the shipped one)"
                    ),
                    stacklevel=1,
                )
                continue
            if self.ihook.pytest_ignore_collect(collection_path=path, config=self.config):
                continue
            shipped.append(ShippedModule.from_parent(self, path=path, module=module))
        return sorted([*found, *shipped], key=lambda node: node.path.name)


class ShippedModule(pytest.Module):
    """A module of the suite, collected under the file name the lab's folder would have held."""

    def __init__(self, *, module: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.suite_module = module

    def _getobj(self) -> ModuleType:
        return importlib.import_module(f"{__package__}.suite.{self.suite_module}")

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        # pytest finds the conftest.py files that apply to a node from its path's folder, and takes a path that
        # does not exist for a folder: without this, no conftest hook of the lab (its runtest hooks, its
        # generate_tests) would reach the suite's tests. The call is the one pytest makes before collecting a
        # folder (_pytest/runner.py); it walks up from the path and finds the gates folder's conftests and those
        # above it. No public hook does this.
        self.config.pluginmanager._loadconftestmodules(
            self.path,
            self.config.getoption("importmode"),
            rootpath=self.config.rootpath,
            consider_namespace_packages=self.config.getini("consider_namespace_packages"),
        )
        return super().collect()


def collect_gates_folder(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    folder = gates_folder(parent.config)
    if folder is None or path.resolve() != folder:
        return None
    return GatesFolder.from_parent(parent, path=path)
