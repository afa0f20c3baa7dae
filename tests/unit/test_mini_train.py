"""Training the mini end to end on CPU, a few steps: what CI can afford to show that `b70lab mini train`
still produces weights `b70lab mini build` can serve (the committed weights came from the same code on a GPU).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from pytest_b70lab import cli, mini
from pytest_b70lab.mini import distil, train
from pytest_b70lab.mini import recipe as recipe_mod
from pytest_b70lab.mini.tokenizer import load_tokenizer

COMMITTED = Path(__file__).resolve().parents[2] / "fixtures" / "mini"


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny matrices: one thread is fastest, and several fight whatever else runs on a small CI machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _tensor_table(path: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape), read from the header only (values are not compared)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {name: (f.get_slice(name).get_dtype(), f.get_slice(name).get_shape()) for name in f.keys()}


def test_a_few_steps_on_cpu_train_weights_the_build_serves(
    tmp_path: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "w"
    target_cfg = replace(train.TargetTraining(), steps=2, batch=2, seqlen=128, log_every=1)
    draft_cfg = replace(
        distil.DraftTraining(), steps=2, batch=2, blocks=2, rollouts=4, rollout_tokens=24, eval_rollouts=2, log_every=1
    )
    train.train_target(out, cfg=target_cfg, device="cpu")
    distil.train_draft(out, cfg=draft_cfg, device="cpu")

    events = [json.loads(line) for line in (out / recipe_mod.LOG_FILE).read_text().splitlines()]
    by_phase = {phase: [e for e in events if e["phase"] == phase] for phase in ("target", "draft")}
    for phase, cfg in (("target", target_cfg), ("draft", draft_cfg)):
        kinds = [e["event"] for e in by_phase[phase]]
        assert kinds.count("step") == cfg.steps and kinds.count("end") == 1, (phase, kinds)
        assert kinds.index("end") > max(i for i, k in enumerate(kinds) if k == "step"), kinds
        losses = [e["loss"] for e in by_phase[phase] if e["event"] == "step"]
        assert all(math.isfinite(loss) and loss > 0 for loss in losses), (phase, losses)
    start = next(e for e in by_phase["target"] if e["event"] == "start")
    assert start["device"] == "cpu" and start["config"] == asdict(target_cfg)
    assert [e["event"] for e in by_phase["target"]][0] == "start"
    # The draft's run opens with its rollouts and closes with held-out acceptance, one value a draft position.
    committed = json.loads((COMMITTED / recipe_mod.RECIPE_FILE).read_text())
    rollouts = next(e for e in by_phase["draft"] if e["event"] == "rollouts")
    assert rollouts["count"] == draft_cfg.rollouts and rollouts["tokens"] == draft_cfg.rollout_tokens
    acceptance = next(e for e in by_phase["draft"] if e["event"] == "eval")["per_position_acceptance"]
    assert len(acceptance) == committed["architecture"]["draft"]["block_size"] - 1
    assert all(0.0 <= a <= 1.0 for a in acceptance)

    recipe = json.loads((out / recipe_mod.RECIPE_FILE).read_text())
    assert recipe["target"] == asdict(target_cfg) and recipe["draft"] == asdict(draft_cfg)
    assert recipe["corpus_digest"] == start["corpus_digest"], "the recipe pins the corpus the run drew"
    assert recipe["architecture"] == committed["architecture"], "the smoke run trains the committed architecture"
    assert set(recipe["versions"]) == set(committed["versions"])

    tok = load_tokenizer(out, recipe_mod.TRAINED_RECIPE)
    assert len(tok) == committed["architecture"]["vocab_size"]
    for name in (recipe_mod.TARGET_WEIGHTS, recipe_mod.DRAFT_WEIGHTS):
        assert _tensor_table(out / name) == _tensor_table(COMMITTED / name), (
            f"{name}: tensor names, dtypes or shapes differ from the committed weights"
        )

    monkeypatch.setenv("B70LAB_MINI_WEIGHTS", str(out))
    folder = mini.build(tmp_path / "cache")
    manifest = mini.verify(folder)
    assert manifest["weights"]["files"] == mini.weight_digests(out), "built from the retrained weights"
    assert manifest["weights"]["corpus_digest"] == recipe["corpus_digest"]
    assert manifest["target"]["kv_scale_count"] == 2 * len(committed["architecture"]["target"]["heads_per_layer"])

    # The INT4 lane's draft: distilled against the retrained target's INT4 form, recorded apart, then served.
    from safetensors.torch import save_file

    from pytest_b70lab.mini import int4_reference

    before = (out / recipe_mod.RECIPE_FILE).read_text()
    state = int4_reference.int4_target_state(out, folder / "target", recipe_mod.TRAINED_RECIPE, tok)
    int4_target = tmp_path / "target-int4.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(int4_target))
    distil.train_draft(out, cfg=draft_cfg, device="cpu", against_int4=int4_target)
    assert (out / recipe_mod.RECIPE_FILE).read_text() == before, "recipe.json is the unquantized build's"
    assert _tensor_table(out / recipe_mod.DRAFT_INT4_WEIGHTS) == _tensor_table(COMMITTED / recipe_mod.DRAFT_WEIGHTS)
    record = json.loads((out / recipe_mod.DRAFT_INT4_RECIPE).read_text())
    assert record["draft_int4"] == asdict(draft_cfg)
    assert mini.file_sha256(int4_target) in record["history"][-1]["target"]
    int4_manifest = mini.verify(mini.build_int4(tmp_path / "cache"))
    assert int4_manifest["draft"]["weights"] == mini.int4_draft_digests(out)
    assert int4_manifest["draft"]["distilled_against"] == record["history"][-1]["target"]


def test_trainer_module_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_b70lab.mini.train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "--time-budget" in done.stdout


def test_cli_mini_train_forwards_to_the_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["mini", "train", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "--time-budget" in shown and "b70lab mini train" in shown

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["mini", "train", "target"])  # the trainer's own parser: --out is required
    assert exit_info.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_cli_other_commands_still_reject_unknown_options(capsys: pytest.CaptureFixture[str]) -> None:
    """Only `mini train` passes unknown arguments on; elsewhere a typo is an error, not ignored."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["mini", "build", "--no-such-option"])
    assert exit_info.value.code == 2
    assert "--no-such-option" in capsys.readouterr().err
