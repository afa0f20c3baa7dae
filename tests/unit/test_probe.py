"""The preflight collective probe on real processes and vLLM's own TP group: it passes on a healthy fabric,
and the seed's stall (a rank that never reaches its first all_reduce) fails it within seconds, saying which
rank stopped where, with every process gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from pytest_b70lab import cli
from pytest_b70lab.engine import environment
from pytest_b70lab.engine.probe import PROBE_FILE, ProbeResult, RankState, probe_collectives


def _env(tmp_path: Path, world: int) -> dict[str, str]:
    return environment.engine_environment(tmp_path / "engine-state", world)


def _saved(folder: Path) -> ProbeResult:
    raw = json.loads((folder / PROBE_FILE).read_text())
    ranks = [RankState(**r) for r in raw.pop("ranks")]
    return ProbeResult(**raw, ranks=ranks)


def _no_rank_left(result) -> None:
    for r in result.ranks:
        assert r.gone, f"rank {r.rank} left processes behind"
        assert (
            r.pid is None or not psutil.pid_exists(r.pid) or psutil.Process(r.pid).status() == psutil.STATUS_ZOMBIE
        ), f"rank {r.rank} (pid {r.pid}) still runs"


def test_two_ranks_pass_with_the_right_sum(tmp_path: Path) -> None:
    result = probe_collectives(2, tmp_path / "probe", _env(tmp_path, 2))
    assert result.passed, result.lines()
    for r in result.ranks:
        assert r.reached == ["started", "initialized", "entered", "completed", "torn_down"], r
        assert r.correct is True and r.value == 3.0 and r.exit_code == 0
        assert r.communicator.startswith("CpuCommunicator"), r.communicator
    _no_rank_left(result)
    saved = json.loads((tmp_path / "probe" / PROBE_FILE).read_text())
    assert saved["passed"] is True and [r["rank"] for r in saved["ranks"]] == [0, 1]


def test_a_rank_that_never_enters_the_all_reduce_fails_in_seconds(tmp_path: Path, capsys) -> None:
    """Through `b70lab probe collectives`, as the lab runs it before trusting a fabric again."""
    code = cli.main(
        [
            "probe",
            "collectives",
            "--contract",
            "mini-laguna-cpu",
            "--stall-rank",
            "1",
            "--collective-deadline",
            "5",
            "--out",
            str(tmp_path / "probe"),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    assert code == 1
    assert capsys.readouterr().out.splitlines()[1:3] == [
        "  rank 0: stopped after entered, never completed",
        "  rank 1: stopped after initialized, never entered",
    ]
    result = _saved(tmp_path / "probe")
    assert not result.passed
    by_rank = {r.rank: r for r in result.ranks}
    assert by_rank[1].reached == ["started", "initialized"], by_rank[1]
    assert by_rank[0].reached == ["started", "initialized", "entered"], by_rank[0]
    assert by_rank[1].describe() == "rank 1: stopped after initialized, never entered"
    assert by_rank[0].describe() == "rank 0: stopped after entered, never completed"
    assert "the all_reduce did not complete within 5 s of the first rank entering it" in result.problems
    assert result.injected == "rank 1 stalls before the all_reduce"
    _no_rank_left(result)


def test_the_rank_module_the_fault_matrix_looks_for_is_the_probe_itself() -> None:
    """The fault matrix finds leftover probe ranks by this name in their command lines: a move that left it
    behind would turn that check into one that finds nothing and passes."""
    import importlib.util

    from pytest_b70lab.engine import probe

    assert importlib.util.find_spec(probe.RANK_MODULE).origin == probe.__file__
