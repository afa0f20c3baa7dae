"""The fault hook is inert unless B70LAB_FAULT names a fault, and a misspelt fault is an error, not a
silently healthy engine (the fault matrix itself is tests/faults/)."""

from __future__ import annotations

import pytest

from pytest_b70lab.in_engine import faults


def test_unset_means_no_fault(monkeypatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.parse(None) is None and faults.parse("") is None
    monkeypatch.setattr(faults, "_installed", None)
    faults.register()
    assert faults._installed is None


@pytest.mark.parametrize(
    "spec, fault",
    [
        ("collective-stall:1", faults.Fault("collective-stall", 1, None)),
        ("die-decode:1:30", faults.Fault("die-decode", 1, 30)),
        ("raise-loading:1", faults.Fault("raise-loading", 1, None)),
        ("raise-kv-cache:0", faults.Fault("raise-kv-cache", 0, None)),
        ("engine-core-exit:7", faults.Fault("engine-core-exit", None, 7)),
        ("stream-cut", faults.Fault("stream-cut", None, None)),
        ("slow-decode:0:25", faults.Fault("slow-decode", 0, 25, None)),
        ("slow-decode:1:25:2", faults.Fault("slow-decode", 1, 25, 2)),
    ],
)
def test_a_fault_names_its_rank_and_moment(spec: str, fault) -> None:
    assert faults.parse(spec) == fault


@pytest.mark.parametrize(
    "spec, message",
    [
        ("die-loadin:1", "unknown fault 'die-loadin'"),
        ("die-loading", "die-loading needs a rank"),
        ("raise-kv-cache", "raise-kv-cache needs a rank"),
        ("slow-decode:0", "needs a rank and a positive percentage"),
        ("slow-decode:0:0", "needs a rank and a positive percentage"),
    ],
)
def test_a_misspelt_fault_is_an_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        faults.parse(spec)


@pytest.mark.parametrize(
    "folder, start", [("start-2", 2), ("start-1", 1), ("probe", None), ("start-x", None), ("restart-2", None)]
)
def test_a_start_is_known_by_its_folder(folder: str, start, tmp_path, monkeypatch) -> None:
    (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / folder)
    assert faults.this_start() == start


def test_a_fault_for_another_start_is_not_armed(tmp_path, monkeypatch) -> None:
    (tmp_path / "start-1").mkdir()
    monkeypatch.chdir(tmp_path / "start-1")
    monkeypatch.setenv(faults.ENV, "slow-decode:0:25:2")
    monkeypatch.setattr(faults, "_installed", None)
    faults.register()
    assert faults._installed is None
