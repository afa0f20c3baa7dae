"""The served mini model: assembled deterministically from the committed trained weights, self-describing,
and its scales come from calibration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytest_b70lab import mini


def _all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_builds_are_byte_identical(tmp_path: Path, b70_mini_model: Path) -> None:
    fresh = mini.build(tmp_path / "again")
    assert fresh.name == b70_mini_model.name, "same recipe and libraries must give the same digest"
    first, second = _all_files(b70_mini_model), _all_files(fresh)
    assert sorted(first) == sorted(second)
    differing = [name for name in first if first[name] != second[name]]
    assert not differing, f"files differ between two builds: {differing}"


def test_manifest_matches_the_files(b70_mini_model: Path) -> None:
    manifest = mini.verify(b70_mini_model)
    on_disk = {
        p.relative_to(b70_mini_model).as_posix()
        for p in b70_mini_model.rglob("*")
        if p.is_file() and p.name != mini.MANIFEST
    }
    assert set(manifest["files"]) == on_disk
    assert manifest["recipe_digest"] == mini.recipe_digest()
    assert manifest["weights"]["files"] == mini.weight_digests(), "the manifest pins the committed weights"
    assert b70_mini_model.name == f"mini-laguna-{manifest['recipe_digest'][:16]}"


def test_target_carries_calibrated_kv_scales_the_compressed_tensors_way(b70_mini_model: Path) -> None:
    manifest = mini.load_manifest(b70_mini_model)
    config = json.loads((b70_mini_model / "target" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["kv_cache_scheme"]["type"] == "float" and qc["kv_cache_scheme"]["num_bits"] == 8
    assert qc["kv_cache_scheme"]["strategy"] == "tensor" and qc["kv_cache_scheme"]["dynamic"] is False
    assert qc["config_groups"] == {}, "only the KV cache is quantized"

    tensors = load_file(str(b70_mini_model / "target" / "model.safetensors"))
    n = manifest["target"]["num_layers"]
    stored = {
        mini.engine_attention_layer(i): (
            float(tensors[f"model.layers.{i}.self_attn.k_scale"]),
            float(tensors[f"model.layers.{i}.self_attn.v_scale"]),
        )
        for i in range(n)
    }
    assert (
        sum(1 for k in tensors if k.endswith(("k_scale", "v_scale"))) == manifest["target"]["kv_scale_count"] == 2 * n
    )
    assert mini.kv_scale_digest(stored) == manifest["target"]["kv_scale_digest"]
    values = [s for pair in stored.values() for s in pair]
    assert all(0 < s < 1 for s in values) and len(set(values)) == len(values), (
        f"every layer should calibrate to scales of its own, not 1.0: {stored}"
    )


def test_scales_fit_the_calibration_activations(b70_mini_model: Path) -> None:
    """Independent of the builder's hooks: load the reference checkpoint with transformers, capture V and
    pre-RoPE K on the calibration text, and check the stored scales map their maxima to the top of E4M3."""
    from transformers import AutoTokenizer, LagunaForCausalLM

    manifest = mini.load_manifest(b70_mini_model)
    tok = AutoTokenizer.from_pretrained(str(b70_mini_model / "reference"), local_files_only=True)
    model = LagunaForCausalLM.from_pretrained(str(b70_mini_model / "reference"), dtype=torch.float32).eval()
    seen: dict[tuple[int, str], float] = {}

    def keep(i: int, kind: str):
        def hook(_m, _i, out):
            seen[(i, kind)] = max(seen.get((i, kind), 0.0), float(out.abs().max()))

        return hook

    for i, layer in enumerate(model.model.layers):
        layer.self_attn.k_norm.register_forward_hook(keep(i, "k"))
        layer.self_attn.v_proj.register_forward_hook(keep(i, "v"))
    with torch.no_grad():
        for text in mini.calibration_texts():
            model(**tok(text, return_tensors="pt"))
    for i in range(manifest["target"]["num_layers"]):
        scales = manifest["target"]["kv_scales"][mini.engine_attention_layer(i)]
        v_codes = seen[(i, "v")] / scales["v_scale"]
        k_codes = seen[(i, "k")] * mini.trained_recipe().k_scale_headroom / scales["k_scale"]
        # bf16 storage of the scale moves it by at most 2^-8 relative
        for kind, codes in (("v", v_codes), ("k", k_codes)):
            assert 448 * (1 - 2**-7) <= codes <= 448 * (1 + 2**-7), (
                f"layer {i} {kind}: calibration maximum maps to {codes:.1f}, expected ~448"
            )


def test_draft_is_a_dflash_laguna_without_kv_calibration(b70_mini_model: Path) -> None:
    manifest = mini.load_manifest(b70_mini_model)
    config = json.loads((b70_mini_model / "draft" / "config.json").read_text())
    assert config["architectures"] == ["DFlashLagunaForCausalLM"]
    assert "quantization_config" not in config
    assert config["dflash_config"]["target_layer_ids"] == list(mini.trained_recipe().draft.target_layer_ids)
    tok = json.loads((b70_mini_model / "draft" / "tokenizer.json").read_text())
    mask = [t for t in tok["added_tokens"] if t["content"] == "<|mask|>"]
    assert mask and config["dflash_config"]["mask_token_id"] == mask[0]["id"]
    tensors = load_file(str(b70_mini_model / "draft" / "model.safetensors"))
    assert not any(k.endswith(("k_scale", "v_scale")) for k in tensors)
    assert all(not k.startswith("model.") for k in tensors)
    assert manifest["draft"]["kv_calibrated"] is False
    assert len(manifest["draft"]["cache_layers"]) == mini.trained_recipe().draft.layers


def test_router_bias_is_stored_and_not_zero(b70_mini_model: Path) -> None:
    tensors = load_file(str(b70_mini_model / "target" / "model.safetensors"))
    biases = {k: v for k, v in tensors.items() if k.endswith("e_score_correction_bias")}
    sparse = [i for i, kind in enumerate(mini.trained_recipe().target.mlp_layer_types) if kind == "sparse"]
    assert sorted(biases) == [f"model.layers.{i}.mlp.experts.e_score_correction_bias" for i in sparse]
    assert all(float(v.abs().max()) > 0.05 for v in biases.values())


def test_verify_names_a_tampered_file(tmp_path: Path, b70_mini_model: Path) -> None:
    copy = tmp_path / b70_mini_model.name
    import shutil

    shutil.copytree(b70_mini_model, copy)
    weights = copy / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    (copy / "target" / "tokenizer.json").unlink()
    with pytest.raises(mini.MiniModelError) as err:
        mini.verify(copy)
    assert "draft/model.safetensors: sha256" in str(err.value)
    assert "missing target/tokenizer.json" in str(err.value)
    assert "b70lab mini build --force" in str(err.value)


@pytest.mark.parametrize("content", ["{not json", '{"format": 99}', "[]"])
def test_a_corrupted_manifest_is_a_clear_error(tmp_path: Path, content: str) -> None:
    (tmp_path / mini.MANIFEST).write_text(content)
    with pytest.raises(mini.MiniModelError, match="rebuild with `b70lab mini build --force`"):
        mini.load_manifest(tmp_path)


def test_cli_builds_once_and_prints_the_folder(tmp_path: Path, b70_mini_model: Path) -> None:
    cmd = [sys.executable, "-m", "pytest_b70lab.cli", "mini", "build", "--out", str(tmp_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    folder, int4_folder = (Path(line) for line in first.stdout.split())
    assert folder.parent == tmp_path and folder.name == b70_mini_model.name
    assert int4_folder.parent == tmp_path and int4_folder.name.startswith(mini.INT4_PREFIX)
    stamps = [(f / mini.MANIFEST).stat().st_mtime_ns for f in (folder, int4_folder)]
    second = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert second.stdout.split() == [str(folder), str(int4_folder)]
    assert [(f / mini.MANIFEST).stat().st_mtime_ns for f in (folder, int4_folder)] == stamps, (
        "a verified build is reused, not rebuilt"
    )


def test_cli_reports_a_broken_cache_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / mini.MANIFEST).write_text("{oops")
    run = subprocess.run(
        [sys.executable, "-m", "pytest_b70lab.cli", "mini", "verify", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and "is corrupted" in run.stderr


def test_the_served_model_is_the_committed_weights(b70_mini_model: Path) -> None:
    """The build adds configs, scales and the tokenizer; the weights themselves are the trained artifact."""
    from transformers import LagunaForCausalLM

    committed = load_file(str(mini.weights_dir() / "target.safetensors"))
    served = LagunaForCausalLM.from_pretrained(str(b70_mini_model / "reference"), dtype=torch.bfloat16).state_dict()
    assert sorted(committed) == sorted(served)
    differing = [name for name, t in committed.items() if not torch.equal(t, served[name])]
    assert not differing, f"served target tensors differ from fixtures/mini/target.safetensors: {differing[:5]}"
    assert (b70_mini_model / "draft" / "model.safetensors").read_bytes() == (
        mini.weights_dir() / "draft.safetensors"
    ).read_bytes()


def test_the_served_tokenizer_carries_the_chat_template_and_tool_tokens(b70_mini_model: Path) -> None:
    from transformers import AutoTokenizer

    from pytest_b70lab.mini import curriculum

    tok = AutoTokenizer.from_pretrained(str(b70_mini_model / "target"), local_files_only=True)
    assert tok.chat_template == curriculum.CHAT_TEMPLATE
    for token in curriculum.TOOL_TOKENS:
        ids = tok(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == token, (
            f"{token} must be one token that survives decoding (vLLM's poolside_v1 parser reads it)"
        )


def test_missing_weights_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("B70LAB_MINI_WEIGHTS", str(tmp_path))
    with pytest.raises(mini.MiniModelError, match="missing tokenizer.json, target.safetensors"):
        mini.build(tmp_path / "cache")


def test_the_trained_target_retrieves_held_out_needles(b70_mini_model: Path) -> None:
    """What training bought, in fp32 transformers: five held-out needles among 40 pairs, each copied."""
    from transformers import AutoTokenizer, LagunaForCausalLM

    from pytest_b70lab.mini import curriculum

    tok = AutoTokenizer.from_pretrained(str(b70_mini_model / "reference"), local_files_only=True)
    model = LagunaForCausalLM.from_pretrained(str(b70_mini_model / "reference"), dtype=torch.float32).eval()
    for i in range(5):
        sample = curriculum.sample("heldout", 1, i, "retrieval", n_pairs=40)
        ids = tok(sample.prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert text.split()[:1] == [sample.meta["expected"]], f"needle {sample.meta['key']}: got {text!r}"


# --- the W4A16 (INT4) build ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def int4_build(b70_mini_model: Path) -> Path:
    return mini.build_int4(b70_mini_model.parent)


def test_the_int4_build_is_deterministic_and_named_by_what_it_quantized(tmp_path: Path, int4_build: Path) -> None:
    again = mini.build_int4(tmp_path / "again")
    assert again.name == int4_build.name
    first, second = _all_files(int4_build), _all_files(again)
    assert sorted(first) == sorted(second)
    assert not [name for name in first if first[name] != second[name]], "two INT4 builds differ"
    manifest = mini.verify(int4_build)
    source = mini.verify(mini.build(int4_build.parent))
    assert manifest["quantized_from"]["model_digest"] == source["model_digest"]
    assert manifest["target"]["kv_scale_digest"] == source["target"]["kv_scale_digest"], "the same KV scales"


def test_the_int4_target_is_compressed_tensors_pack_quantized_but_for_lm_head_and_router(int4_build: Path) -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    from pytest_b70lab.in_engine.portable_int4 import dequantize
    from pytest_b70lab.mini import int4

    config = json.loads((int4_build / "target" / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and config["quant_method"] == "compressed-tensors"
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 128
    assert config["kv_cache_scheme"] == mini.KV_CACHE_SCHEME
    tensors = load_file(str(int4_build / "target" / "model.safetensors"))
    assert tensors["lm_head.weight"].dtype == torch.bfloat16, "lm_head stays in float"
    assert tensors["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16, "the router stays in float"
    assert "model.layers.1.self_attn.k_scale" in tensors
    reference = load_file(str(mini.build(int4_build.parent) / "target" / "model.safetensors"))
    layer = "model.layers.1.mlp.experts.5.up_proj"
    parts = {p: tensors[f"{layer}.{p}"] for p in int4.PARTS}
    shape = torch.Size(parts["weight_shape"].tolist())
    assert shape == reference[f"{layer}.weight"].shape
    codes = unpack_from_int32(parts["weight_packed"], 4, shape)
    assert int(codes.min()) >= -8 and int(codes.max()) <= 7
    error = (
        dequantize(parts["weight_packed"], parts["weight_scale"], torch.float32) - reference[f"{layer}.weight"].float()
    ).abs()
    step = parts["weight_scale"].float().repeat_interleave(128, dim=1)
    assert bool((error <= 0.53 * step).all()), "every weight within about half a step of its code (int4.quantize)"


def test_narrow_tensor_parallel_shards_get_a_group_that_fits(int4_build: Path) -> None:
    """The shared expert's down projection has 128 input columns: 32 per rank at TP4, so its group is 32."""
    manifest = mini.verify(int4_build)
    overrides = manifest["target"]["int4"]["group_size_overrides"]
    assert overrides and all(k.endswith("shared_expert.down_proj") and v == 32 for k, v in overrides.items())
    draft_ignore = manifest["draft"]["int4"]["ignore"]
    assert any("qkv_proj" in pattern for pattern in draft_ignore), "the draft's qkv_proj stays in float"


def test_int4_build_records_nibble_moments_and_shards_of_packed_words(int4_build: Path) -> None:
    from pytest_b70lab.in_engine import observe

    manifest = mini.verify(int4_build)
    tensors = load_file(str(int4_build / "target" / "model.safetensors"))
    name = "model.layers.0.self_attn.o_proj.weight_packed"
    entry = manifest["target"]["tensors"][name]
    assert entry["moments"] == observe.moments(tensors[name])
    halves = entry["shards"]["1"]["2"]
    columns = tensors[name].shape[1] // 2
    assert halves[1] == observe.moments(tensors[name][:, columns:].contiguous())


def test_the_int4_build_serves_the_draft_distilled_against_the_int4_target(int4_build: Path) -> None:
    from pytest_b70lab.mini.recipe import DRAFT_INT4_WEIGHTS, DRAFT_WEIGHTS

    manifest = mini.verify(int4_build)
    weights = mini.weights_dir()
    assert manifest["draft"]["weights"][DRAFT_INT4_WEIGHTS] == mini.file_sha256(weights / DRAFT_INT4_WEIGHTS)
    assert "W4A16" in manifest["draft"]["distilled_against"]
    assert mini.file_sha256(weights / "target.safetensors") in manifest["draft"]["distilled_against"]
    served = load_file(str(int4_build / "draft" / "model.safetensors"))
    own, plain = load_file(str(weights / DRAFT_INT4_WEIGHTS)), load_file(str(weights / DRAFT_WEIGHTS))
    name = "layers.0.self_attn.qkv_proj.weight"  # kept in float (DRAFT_IGNORE): the committed tensor as it is
    assert torch.equal(served[name], own[name]) and not torch.equal(served[name], plain[name])


def test_the_trainers_int4_target_holds_what_the_int4_build_packed(b70_mini_model: Path, int4_build: Path) -> None:
    """mini/int4_reference.py (what the INT4 lane's draft is distilled against) against the packed build on disk,
    unpacked by compressed-tensors' own unpacker: every quantized layer, experts and shared experts included."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    from pytest_b70lab.mini import int4_reference
    from pytest_b70lab.mini.tokenizer import load_tokenizer

    recipe = mini.trained_recipe()
    tok = load_tokenizer(mini.weights_dir(), recipe)
    state = int4_reference.int4_target_state(mini.weights_dir(), b70_mini_model / "target", recipe, tok)
    packed = load_file(str(int4_build / "target" / "model.safetensors"))
    layers = sorted(n.removesuffix(".weight_packed") for n in packed if n.endswith(".weight_packed"))
    assert len(layers) == mini.verify(int4_build)["target"]["int4"]["quantized_layers"]
    for layer in layers:
        shape = torch.Size(packed[f"{layer}.weight_shape"].tolist())
        codes = unpack_from_int32(packed[f"{layer}.weight_packed"], 4, shape).float()
        scale = packed[f"{layer}.weight_scale"].float()
        expected = codes * scale.repeat_interleave(shape[1] // scale.shape[1], dim=1)
        assert torch.equal(int4_reference._trainer_slot(state, f"{layer}.weight"), expected), layer
    plain = mini.load_target_model(mini.weights_dir(), recipe, tok).state_dict()
    assert torch.equal(state["lm_head.weight"], plain["lm_head.weight"]), "lm_head stays in float"
