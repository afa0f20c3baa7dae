"""`b70lab evidence show / diff`: two recorded runs side by side, and every damaged input a clear error."""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from pytest_b70lab import cli
from pytest_b70lab.evidence import host
from pytest_b70lab.evidence import record as evidence
from pytest_b70lab.judge import compare
from pytest_b70lab.judge.compare import CompareError

BUNDLES = Path(__file__).resolve().parents[2] / "fixtures" / "evidence"
CANDIDATE = "mini-laguna-cpu"
TEACHER = "mini-laguna-cpu-teacher"


def copy_bundle(tmp_path: Path, name: str, as_name: str | None = None) -> Path:
    return Path(shutil.copytree(BUNDLES / name, tmp_path / (as_name or name)))


def rewrite(run: Path, start: int, change: Any) -> None:
    """Edit one start's evidence as a consistent editor would: the hashes and decode figures derived again
    from the edited observations (evidence that contradicts itself is refused at load), and a valid digest."""
    record = evidence.read(run / f"start-{start}")
    change(record)
    evidence.write(evidence.rederive(record), run / f"start-{start}")


def expected_changes(a: Any, b: Any, prefix: str = "") -> set[str]:
    """The spec of the contract diff, written independently: dotted keys down to where both sides are dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {
            key
            for k in a.keys() | b.keys()
            for key in expected_changes(a.get(k, "<none>"), b.get(k, "<none>"), f"{prefix}.{k}".lstrip("."))
        }
    return set() if a == b else {prefix}


@pytest.fixture
def candidate(tmp_path: Path) -> Path:
    return copy_bundle(tmp_path, CANDIDATE)


@pytest.fixture
def teacher(tmp_path: Path) -> Path:
    return copy_bundle(tmp_path, TEACHER)


def test_the_teacher_bundle_is_recorded_evidence_as_it_stands() -> None:
    record = evidence.read(BUNDLES / TEACHER / "start-1")
    assert record.role == "teacher" and record.draft is None and record.status == "ok"
    assert sum(p.stat().st_size for p in (BUNDLES / TEACHER).rglob("*") if p.is_file()) < 1_000_000


def test_a_run_against_itself_changes_nothing(candidate: Path) -> None:
    run = compare.load_run(candidate)
    assert [s.start_index for s in run.starts] == [1, 2] and run.promotion is None
    c = compare.compare_runs(run, compare.load_run(candidate))
    assert c.only_speed_changed
    assert not (c.contract or c.flags or c.environment or c.models or c.versions or c.only_in_a or c.only_in_b)
    assert c.contract_digest is None
    assert c.identical_outputs == len(c.prompts) == 6
    assert all(p.starts_agree_a and p.starts_agree_b for p in c.prompts)
    assert c.speed.ratio == 1.0 and c.speed.low <= 1.0 <= c.speed.high
    assert c.speed.paired is not None and c.speed.paired.ratio == 1.0
    assert c.headline().startswith(
        "speed B/A paired 1.000 [1.000, 1.000], of medians 1.000 [1.000, 1.000] "
        "(95 %, 6 prompts); outputs identical on 6/6 prompts; contract: identical"
    )
    assert "only the speed changed" in compare.format_comparison(c)


def test_the_candidate_against_its_teacher(candidate: Path, teacher: Path) -> None:
    a, b = compare.load_run(candidate), compare.load_run(teacher)
    c = compare.compare_runs(a, b)

    ca, cb = a.starts[0].contract.canonical, b.starts[0].contract.canonical
    assert {ch.key for ch in c.contract} == expected_changes(ca, cb)
    assert {"speculative", "draft", "kind", "name"} <= {ch.key for ch in c.contract}
    assert c.contract_digest is not None and c.contract_digest.b == b.starts[0].contract.digest
    assert c.flags[0].key == "--speculative-config" and len(c.flags) == 1
    assert json.loads(c.flags[0].a)["method"] == "dflash" and c.flags[0].b == "(absent)"
    assert [ch.key for ch in c.models] == ["draft"], "the target checkpoint is the same one"
    assert not c.environment and not c.versions

    tokens_b = {r.prompt_id: r.token_ids for r in b.starts[0].requests}
    for p in c.prompts:
        assert p.identical == (a.starts[0].request(p.prompt_id).token_ids == tokens_b[p.prompt_id])
    assert c.identical_outputs == sum(r.token_ids == tokens_b[r.prompt_id] for r in a.starts[0].requests)

    def passes(start: evidence.Evidence, pid: str) -> float:
        """The prompt's median over every counted pass of an interleaved start (gate 7's figure)."""
        return statistics.median(r.decode_rate for (_p, q), (_m, r) in start.counted().items() if q == pid)

    rates_a = [statistics.median(passes(s, pid) for s in a.starts) for pid in tokens_b]
    rates_b = [b.starts[0].request(pid).decode_rate for pid in tokens_b]
    assert c.speed.ratio == pytest.approx(statistics.median(rates_b) / statistics.median(rates_a))
    assert c.speed.paired is not None and c.speed.paired.ratio == pytest.approx(
        statistics.geometric_mean([rb / ra for ra, rb in zip(rates_a, rates_b, strict=False)])
    )
    assert c.speed.paired.high < 1
    assert c.speed.high < 1, "the teacher decodes without drafts: slower, beyond the interval"
    assert not c.only_speed_changed
    assert (
        "contract: 9 fields differ" in c.headline()
    )  # name, kind, description, draft, speculative, expect.compile_graphs and .draft_unit_scale_layers,
    # reproduction.schedule and .passes (a teacher is recorded one start at a time)
    text = compare.format_comparison(c)
    assert "kind: candidate -> teacher" in text and "more than the speed changed" in text


@pytest.mark.parametrize(("prompt", "position"), [(2, 37), (0, 0), (5, 99)])
def test_one_changed_token_is_found_where_it_is(candidate: Path, tmp_path: Path, prompt: int, position: int) -> None:
    mutated = copy_bundle(tmp_path, CANDIDATE, "mutated")
    original = evidence.read(candidate / "start-1").requests[prompt]

    def change(record: evidence.Evidence) -> None:
        record.requests[prompt].token_ids[position] += 1

    rewrite(mutated, 1, change)

    c = compare.compare_runs(compare.load_run(candidate), compare.load_run(mutated))
    differing = [p for p in c.prompts if not p.identical]
    assert [p.prompt_id for p in differing] == [original.prompt_id]
    (p,) = differing
    assert p.position == position
    assert (p.token_a, p.token_b) == (original.token_ids[position], original.token_ids[position] + 1)
    assert p.starts_agree_a and not p.starts_agree_b, "B's start-2 still has the recorded tokens"
    assert not (c.contract or c.flags or c.environment or c.models or c.versions)
    assert "outputs identical on 5/6 prompts" in c.headline() and not c.only_speed_changed
    assert f"differs at token {position}: {p.token_a} vs {p.token_b}" in compare.format_comparison(c)


def test_a_shorter_output_differs_at_its_end(candidate: Path, tmp_path: Path) -> None:
    mutated = copy_bundle(tmp_path, CANDIDATE, "mutated")

    def change(record: evidence.Evidence) -> None:
        record.requests[1].token_ids.pop()

    rewrite(mutated, 1, change)
    (p,) = [
        p
        for p in compare.compare_runs(compare.load_run(candidate), compare.load_run(mutated)).prompts
        if not p.identical
    ]
    assert (p.position, p.token_b, p.length_a, p.length_b) == (99, None, 100, 99)


def test_a_faster_run_reads_as_its_ratio(candidate: Path, tmp_path: Path) -> None:
    faster = copy_bundle(tmp_path, CANDIDATE, "faster")

    def scale(record: evidence.Evidence) -> None:
        for r in (*record.requests, *record.repeats):  # every pass
            r.chunk_times = [t / 1.5 for t in r.chunk_times]

    for start in (1, 2):
        rewrite(faster, start, scale)

    c = compare.compare_runs(compare.load_run(candidate), compare.load_run(faster))
    assert c.speed.ratio == pytest.approx(1.5) and c.speed.paired.ratio == pytest.approx(1.5)
    assert c.speed.low > 1 and c.speed.low <= c.speed.ratio <= c.speed.high
    assert all(p.ratio == pytest.approx(1.5) for p in c.prompts)
    assert c.only_speed_changed, "the same tokens, faster: that is all that changed"


def test_a_run_slower_in_its_later_passes_only_reads_slower(candidate: Path, tmp_path: Path) -> None:
    """Passes 2 and 3 of every prompt at half speed, pass 1 as it was: the comparison takes every counted pass,
    as gate 7 does, so the per-prompt median over the passes moves (pass 1 alone would read 1.000)."""
    slower = copy_bundle(tmp_path, CANDIDATE, "slower")

    def later_passes(record: evidence.Evidence) -> None:
        for (pass_index, _pid), (_m, r) in record.counted().items():
            if pass_index > 1:
                r.chunk_times = [t * 2 for t in r.chunk_times]

    for start in (1, 2):
        rewrite(slower, start, later_passes)
    c = compare.compare_runs(compare.load_run(candidate), compare.load_run(slower))
    # Each prompt's median of (pass 1, pass 2 / 2, pass 3 / 2): at most the faster half of the two slowed passes.
    assert c.speed.ratio < 0.75 and c.speed.paired.ratio < 0.75 and c.speed.high < 1, c.headline()


def test_the_committed_bundle_against_itself_is_1_from_every_pass(candidate: Path) -> None:
    run = compare.load_run(candidate)
    assert all(s.schedule is not None and len(s.counted()) > len(s.requests) for s in run.starts), "interleaved"
    c = compare.compare_runs(run, run)
    assert (c.speed.ratio, c.speed.low, c.speed.high) == (1.0, 1.0, 1.0)
    assert "speed B/A paired 1.000 [1.000, 1.000]" in c.headline()


def test_the_interval_is_reproducible_and_narrows_with_confidence(candidate: Path, teacher: Path) -> None:
    a, b = compare.load_run(candidate), compare.load_run(teacher)
    first, again = (compare.compare_runs(a, b, seed=7, resamples=2000) for _ in range(2))
    assert first.speed == again.speed
    narrow = compare.compare_runs(a, b, confidence=0.5, resamples=2000, seed=7).speed
    assert first.speed.low <= narrow.low <= narrow.high <= first.speed.high
    with pytest.raises(ValueError, match="confidence"):
        compare.compare_runs(a, b, confidence=1.0)


def test_where_a_start_lived_is_not_a_difference(candidate: Path, tmp_path: Path) -> None:
    elsewhere = copy_bundle(tmp_path, CANDIDATE, "elsewhere")

    def move(record: evidence.Evidence) -> None:
        cmd = record.engine.command
        cmd[cmd.index("--uds") + 1] = "/tmp/b70lab-abc123/engine.sock"
        record.engine.command = [w.replace("<repo>", "/srv/lab/checkout") for w in cmd]
        record.engine.environment = {
            k: v.replace("<repo>", "/srv/lab/checkout") for k, v in record.engine.environment.items()
        }
        record.engine.environment["B70LAB_SOCKET"] = "/tmp/b70lab-abc123/engine.sock"
        record.target.ref = record.target.ref.replace("<repo>", "/srv/lab/checkout")

    rewrite(elsewhere, 1, move)

    c = compare.compare_runs(compare.load_run(candidate), compare.load_run(elsewhere))
    assert not (c.flags or c.environment or c.models), [ch.line() for ch in c.flags + c.environment + c.models]


def test_a_changed_flag_and_version_are_named(candidate: Path, tmp_path: Path) -> None:
    other = copy_bundle(tmp_path, CANDIDATE, "other")

    def change(record: evidence.Evidence) -> None:
        cmd = record.engine.command
        cmd[cmd.index("--block-size") + 1] = "16"
        record.engine.vllm_version = "0.33.0"

    rewrite(other, 1, change)
    c = compare.compare_runs(compare.load_run(candidate), compare.load_run(other))
    assert [ch.line() for ch in c.flags] == ["--block-size: 32 -> 16"]
    assert [ch.line() for ch in c.versions] == ["vllm: 0.32.0 -> 0.33.0"]


def test_speeds_of_two_host_classes_are_not_compared_naming_why(candidate: Path, tmp_path: Path) -> None:
    """The INT4 bundle (an AVX2-only AMD EPYC) against itself moved to an Intel Xeon: the figures are still computed,
    but the headline, the diff and only_speed_changed say the speed was not compared."""
    here = copy_bundle(tmp_path, "mini-laguna-cpu-int4", "here")
    there = copy_bundle(tmp_path, "mini-laguna-cpu-int4", "there")
    for start in (1, 2):
        rewrite(there, start, lambda r: r.host.update(model="Intel(R) Xeon(R) Platinum 8481C", amx=True))
    same = compare.compare_runs(compare.load_run(here), compare.load_run(here))
    assert same.speed_not_compared is None and same.host_classes is not None
    assert same.host_classes[0] == same.host_classes[1]
    assert same.host_classes[0].label == "AMD EPYC (no AVX-512, no AMX), 2 cores, FP8 attention portable"
    c = compare.compare_runs(compare.load_run(here), compare.load_run(there))
    assert c.speed_not_compared is not None and c.speed.ratio == 1.0
    assert c.headline().startswith(
        "speed B/A: not compared: A on AMD EPYC (no AVX-512, no AMX), 2 cores, FP8 attention portable, B on "
        "Intel(R) Xeon(R) Platinum 8481C (no AVX-512, AMX), 2 cores, FP8 attention portable (host classes differ: model: "
        "'AMD EPYC' vs 'Intel(R) Xeon(R) Platinum 8481C'; amx: False vs True)"
    ), c.headline()
    assert f"speed: {c.speed_not_compared}" in compare.format_comparison(c).splitlines()
    assert not c.only_speed_changed and [ch.line() for ch in c.versions][0].startswith("cpu: AMD EPYC")


# --- bad inputs ---------------------------------------------------------------------------------------


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="no run folder at") as err:
        compare.load_run(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value)


def test_a_folder_without_starts_is_named(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="no starts in") as err:
        compare.load_run(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_corrupted_evidence_is_named(candidate: Path) -> None:
    path = candidate / "start-2" / evidence.FILENAME
    path.write_text(path.read_text()[:1000])
    with pytest.raises(CompareError, match="is not valid JSON") as err:
        compare.load_run(candidate)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("content", "message"), [("{truncated", "is not valid JSON"), ("[1, 2]", "is not a b70lab promotion verdict")]
)
def test_a_corrupted_verdict_is_named(candidate: Path, content: str, message: str) -> None:
    path = candidate / compare.PROMOTION
    path.write_text(content)
    with pytest.raises(CompareError, match=message) as err:
        compare.load_run(candidate)
    assert str(path) in str(err.value)


# --- show and the last promoted run ---------------------------------------------------------------------


def test_show_says_what_ran_and_the_verdict(candidate: Path) -> None:
    record = evidence.read(candidate / "start-1")
    text = compare.show(compare.load_run(candidate))
    per_prompt: dict[str, list[float]] = {}
    for (_pass, prompt_id), (_m, r) in record.counted().items():
        per_prompt.setdefault(prompt_id, []).append(r.decode_rate)
    gate_7s = statistics.median(statistics.median(rates) for rates in per_prompt.values())
    for expected in (
        record.contract.name,
        record.contract.digest,
        record.target.digest,
        record.draft.digest,
        "vllm 0.32.0",
        "--kv-cache-dtype fp8",
        "start-1  ok",
        "start-2  ok",
        f"ready {record.ready_s:.1f} s",
        f"endpoint median {gate_7s:.2f} tok/s",  # over every counted pass, as the verdict line's
        f"verdict   No verdict recorded: {candidate.name} has no promotion.json; judged now from its evidence "
        "(not a promotion until a session records it): PROMOTABLE at ",
        f"machine   {host.describe(record.host)}; FP8 attention {host.fp8_attention_ran(record.audits)}",
    ):
        assert expected in text
    assert "--uds" not in text

    (candidate / compare.PROMOTION).write_text(
        json.dumps({"promotable": True, "complete": True, "endpoint_medians_tok_s": [193.45, 194.62]})
    )
    # The headline every surface prints (verdict.recorded_headline): the terminal's and the report's line.
    assert (
        "verdict   PROMOTABLE at 193.45 / 194.62 tok/s median (start-1 / start-2) - contract "
        f"{record.contract.name} (0/0 required gate subjects passed)"
    ) in compare.show(compare.load_run(candidate))
    (candidate / compare.PROMOTION).write_text(
        json.dumps({"promotable": False, "complete": True, "failed_gates": ["teacher_exactness"], "problems": []})
    )
    assert (
        f"verdict   NOT PROMOTABLE - contract {record.contract.name}: failed gates: teacher_exactness"
        in compare.show(compare.load_run(candidate))
    )


def test_the_last_promoted_run(tmp_path: Path) -> None:
    verdicts = {
        "old": {"promotable": True, "complete": True},
        "newer": {"promotable": True, "complete": True},
        "failed": {"promotable": False, "complete": True},
        "partial": {"promotable": True, "complete": False},
        "corrupt": None,
    }
    for age, (name, verdict) in enumerate(reversed(verdicts.items())):
        (tmp_path / name).mkdir()
        path = tmp_path / name / compare.PROMOTION
        path.write_text("{broken" if verdict is None else json.dumps(verdict))
        os.utime(path, (1_000_000 - age * 10, 1_000_000 - age * 10))  # "old" is the oldest
    assert compare.last_promoted_run(tmp_path) == tmp_path / "newer"
    assert compare.last_promoted_run(tmp_path, exclude=tmp_path / "newer") == tmp_path / "old"
    assert compare.last_promoted_run(tmp_path / "failed") is None


# --- the command line -----------------------------------------------------------------------------------


def test_cli_show_and_diff(candidate: Path, teacher: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["evidence", "show", str(teacher)]) == 0
    assert "mini-laguna-cpu-teacher (teacher)" in capsys.readouterr().out

    assert cli.main(["evidence", "diff", str(candidate), str(candidate)]) == 0
    assert capsys.readouterr().out.startswith("speed B/A paired 1.000")

    assert cli.main(["evidence", "diff", str(candidate), str(teacher)]) == 1
    assert "--speculative-config" in capsys.readouterr().out

    assert cli.main(["evidence", "diff", str(candidate), str(teacher), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["only_speed_changed"] is False and data["speed"]["prompts"] == 6
    assert data["headline"].startswith("speed B/A paired 0.")


def test_cli_errors_are_one_line_naming_the_file(
    tmp_path: Path, candidate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["evidence", "show", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"b70lab: no run folder at {tmp_path / 'nowhere'}\n"
    (candidate / compare.PROMOTION).write_text("{broken")
    assert cli.main(["evidence", "diff", str(candidate), str(candidate)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("b70lab: ") and str(candidate / compare.PROMOTION) in err and err.count("\n") == 1
