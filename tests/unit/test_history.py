"""`b70lab history`: series rebuilt from the folders a lab keeps, and the change points in them. The run folders
are the committed bundle of the embedded default, copied with its token arrival times stretched (a slower build
at a later commit): the recorded requests, only slower."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_b70lab.cli import main
from pytest_b70lab.contract import project
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.evidence import run_folder
from pytest_b70lab.records import history, layout

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "evidence" / "mini-laguna-cpu"
# Run-to-run jitter of the copies (a factor on every arrival time), then a 4 % slower build from the 7th run on.
JITTER = [1.000, 1.004, 0.997, 1.002, 0.998, 1.003, 0.999, 1.002, 0.997, 1.001, 1.003, 0.998]
SLOWER_FROM, SLOWER = 6, 1 / 0.96


def test_a_known_step_is_found_where_it_is() -> None:
    figures = [100.0, 101.0, 99.5, 100.4, 99.8, 100.6, 96.1, 95.8, 96.5, 95.7, 96.3, 95.9]
    (change,) = history.change_points(figures)
    assert change.index == 6
    assert change.change == pytest.approx(96.0 / 100.2 - 1, abs=0.003)


def test_noise_alone_is_no_change_point() -> None:
    figures = [100.0, 101.0, 99.5, 100.4, 99.8, 100.6, 100.1, 99.6, 100.5, 99.9, 100.3, 100.2]
    assert history.change_points(figures) == []
    assert history.change_points([100.0, 90.0, 80.0]) == [], "too few points for two segments"


def _copies(root: Path) -> list[str]:
    commits = []
    for i, jitter in enumerate(JITTER):
        stretch = jitter * (SLOWER if i >= SLOWER_FROM else 1.0)
        commit = f"{i + 1:02d}" + "c0ffee" * 6 + "ab"
        folder = root / f"run-{i + 1:02d}"
        for start in run_folder.read_starts(BUNDLE):
            start.created_at = f"2026-12-{i + 10:02d}T08:00:0{start.start_index}+00:00"
            assert start.identity is not None
            start.identity.launched_at = start.created_at
            start.lab_commit = commit
            for request in (*start.requests, *start.repeats):
                request.chunk_times = [t * stretch for t in request.chunk_times]
            evidence.write(evidence.rederive(start), folder / f"start-{start.start_index}")
        commits.append(commit)
    return commits


def test_the_series_is_rebuilt_from_run_folders_and_names_the_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commits = _copies(tmp_path / "runs")
    (series,), skipped = history.build([tmp_path / "runs"])
    assert skipped == [] and len(series.points) == len(JITTER)
    assert [p.commit for p in series.points] == commits, "in launch order"
    assert all(p.low <= p.figure <= p.high for p in series.points)
    (change,) = series.changes
    assert series.points[change.index].commit == commits[SLOWER_FROM]
    assert change.change == pytest.approx(0.96 - 1, abs=0.005)

    page = tmp_path / "history.html"
    assert main(["history", "mini-laguna-cpu", "--from", str(tmp_path / "runs"), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"change: decode fell (3\.9|4\.0|4\.1)% at commit {commits[SLOWER_FROM][:10]} ", out), out
    assert 'data-plot="series-1"' in page.read_text()


def test_the_committed_seals_are_points_of_their_own_host_class(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "mini-laguna-cpu", "--from", str(REPO / "repro")]) == 0
    out = capsys.readouterr().out
    # One series per host class, named by its label and key: both seals of 2026-12-04 on an Intel Xeon (recorded
    # before the CPU's family, stepping and cores were, so a class of their own), the 2026-12-05 seal on an AMD EPYC.
    heads = [line for line in out.splitlines() if line.startswith("mini-laguna-cpu on ")]
    assert len(heads) == 2, out
    (xeon,) = [h for h in heads if h.startswith("mini-laguna-cpu on Intel(R) Xeon(R) Processor (AVX-512, AMX), ")]
    assert xeon.endswith(": 2 points") and "FP8 attention native [" in xeon, out
    (epyc,) = [h for h in heads if h is not xeon]
    assert epyc.startswith("mini-laguna-cpu on AMD EPYC (AVX-512, no AMX), 2 cores, ") and epyc.endswith(": 1 points")
    lines = [line for line in out.splitlines() if line.rstrip().endswith(("-20261204", "-20261204b"))]
    assert len(lines) == 2 and all(" seal " in line for line in lines), out
    for line in lines:
        figure = float(line.split("tok/s")[0].split()[-1])
        sealed = evidence.read(REPO / "repro" / line.split()[-1].split("/")[-1] / "start-1" / evidence.FILENAME)
        assert 0.9 < figure / sealed.throughput.endpoint_median < 1.1  # type: ignore[operator]


def test_a_folder_without_a_figure_is_named_and_nothing_found_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "runs" / "broken" / "start-1"
    broken.mkdir(parents=True)
    shutil.copy(BUNDLE / "start-1" / evidence.FILENAME, broken / evidence.FILENAME)
    (broken / evidence.FILENAME).write_text((broken / evidence.FILENAME).read_text().replace('"ok"', '"okay"', 1))
    assert main(["history", "--from", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "no run folder with a figure under" in err and "broken" in err, err
    assert main(["history", "--from", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_start_records_the_lab_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(project, "_root", None)
    monkeypatch.chdir(tmp_path)
    assert project.commit() is None or not (tmp_path / ".git").exists()
    git = ["git", "-c", "user.name=lab", "-c", "user.email=lab@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "contract.toml").write_text("x = 1\n")
    subprocess.run([*git, "add", "contract.toml"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    project.use_root(tmp_path)
    assert project.commit() == head
    (tmp_path / "contract.toml").write_text("x = 2\n")
    assert project.commit() == head + "-dirty"


def test_a_run_and_its_seal_are_one_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commits = _copies(tmp_path / "runs")
    # The first slower run, sealed, is found under both folders: the seal's copy of each start has the machine's
    # paths redacted (records.seal.anonymize), so its bytes and digests are not the run folder's.
    run = tmp_path / "runs" / "run-07"
    sealed = tmp_path / "repro" / "sealed-07"
    for start in run_folder.read_starts(run):
        start.target.ref = "<repo>/" + Path(start.target.ref).name
        evidence.write(start, sealed / f"start-{start.start_index}")
    one = evidence.FILENAME
    assert evidence.read(sealed / "start-1" / one).digest != evidence.read(run / "start-1" / one).digest
    (sealed / layout.SEAL_FILE).write_text("{}")

    (series,), skipped = history.build([tmp_path / "runs", tmp_path / "repro"])
    assert skipped == [] and len(series.points) == len(JITTER), "one run, one point"
    (twice,) = [p for p in series.points if p.also]
    assert (twice.kind, twice.commit, twice.folder, twice.also) == (
        "seal",
        commits[SLOWER_FROM],
        str(sealed),
        (str(run),),
    )
    (change,) = series.changes
    assert series.points[change.index] is twice

    assert main(["history", "--from", str(tmp_path / "runs"), "--from", str(tmp_path / "repro")]) == 0
    out = capsys.readouterr().out
    assert f"seal  {sealed} (also {run})" in out, out
