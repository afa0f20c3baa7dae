"""Checkpoint tensor tables from real files: the mini's folders against its manifest, the per-file cache, bad
inputs, a pack-quantized INT4 checkpoint written with compressed-tensors' own packing, a hub cache snapshot,
and the `contract derive` / `mini export` commands."""

from __future__ import annotations

import json
import math
import os
import shutil
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pytest_b70lab import cli, digests, mini
from pytest_b70lab.engine import starts
from pytest_b70lab.evidence import checkpoint
from pytest_b70lab.evidence.checkpoint import CheckpointError

REPO = Path(__file__).resolve().parents[2]


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def _same_moments(seen: dict, want: dict) -> bool:
    return seen["numel"] == want["numel"] and _close(seen["sum"], want["sum"]) and _close(seen["sumsq"], want["sumsq"])


def _without_read(table: dict) -> dict:
    return {k: v for k, v in table.items() if k != "read"}


def _cache_entries(cache: Path) -> list[Path]:
    return sorted((cache / checkpoint.CACHE_SUBDIR).glob("*.json"))


@pytest.fixture
def target_copy(tmp_path: Path, b70_mini_model: Path) -> Path:
    """A copy of the mini target that a test may edit."""
    return Path(shutil.copytree(b70_mini_model / "target", tmp_path / "target"))


# --- the mini: folder against manifest --------------------------------------------------------------------


@pytest.mark.parametrize("part", ["target", "draft"])
def test_table_of_a_mini_folder_equals_the_manifest_table(part: str, tmp_path: Path, b70_mini_model: Path) -> None:
    manifest = mini.load_manifest(b70_mini_model)
    read = checkpoint.read_table(b70_mini_model / part, tmp_path / "cache")
    pinned = checkpoint.table_from_mini_manifest(manifest, part)

    assert read["format"] == pinned["format"] == checkpoint.TABLE_FORMAT
    assert sorted(read["tensors"]) == sorted(pinned["tensors"])
    for name, tensor in read["tensors"].items():
        want = pinned["tensors"][name]
        assert (tensor["dtype"], tensor["shape"], tensor["file"]) == (want["dtype"], want["shape"], want["file"]), name
        assert _same_moments(tensor["moments"], want["moments"]), name
    assert read["kv_scales"] == pinned["kv_scales"]
    assert read["kv_scale_count"] == pinned["kv_scale_count"]
    assert read["kv_scale_digest"] == pinned["kv_scale_digest"]
    # file ids are sha256 of the bytes, the same the manifest records, so the folder digests agree too
    assert read["files"] == pinned["files"] and read["digest"] == pinned["digest"]
    assert read["read"]["files_read"] == len(read["files"]) and read["read"]["files_cached"] == 0
    if part == "target":
        assert read["kv_scale_count"] == 8 and len(read["kv_scales"]) == 4
        assert read["quantization"]["kv_cache_scheme"]["num_bits"] == 8
    else:
        assert read["kv_scales"] == {} and read["kv_scale_digest"] is None and read["quantization"] is None


def test_the_table_is_plain_json_and_torch_keeps_its_threads(tmp_path: Path, b70_mini_model: Path) -> None:
    threads = torch.get_num_threads()
    table = checkpoint.read_table(b70_mini_model / "target", None)
    assert json.loads(json.dumps(table)) == table
    assert torch.get_num_threads() == threads


def test_large_tensors_are_summed_in_row_chunks(monkeypatch: pytest.MonkeyPatch, b70_mini_model: Path) -> None:
    """Chunked moments agree with whole-tensor moments, and the file's sha256 (hashed from the chunks in file
    order) is still the file's."""
    whole = checkpoint.read_table(b70_mini_model / "target", None)
    monkeypatch.setattr(checkpoint, "WHOLE_TENSOR_MAX", 1000)
    monkeypatch.setattr(checkpoint, "CHUNK_ELEMENTS", 3000)
    chunked = checkpoint.read_table(b70_mini_model / "target", None)
    assert any(math.prod(t["shape"]) > 1000 for t in whole["tensors"].values())
    for name, tensor in chunked["tensors"].items():
        assert _same_moments(tensor["moments"], whole["tensors"][name]["moments"]), name
    assert chunked["files"] == whole["files"]
    assert chunked["files"]["model.safetensors"] == digests.file_sha256(b70_mini_model / "target" / "model.safetensors")


# --- the per-file cache -----------------------------------------------------------------------------------


def _file_count(folder: Path) -> int:
    """Files a table reads: every file of the checkpoint folder (config, tokenizer, chat template, weights)."""
    return sum(1 for p in folder.iterdir() if p.is_file())


def test_a_second_read_comes_from_the_cache(tmp_path: Path, b70_mini_model: Path) -> None:
    cache = tmp_path / "cache"
    first = checkpoint.read_table(b70_mini_model / "target", cache)
    second = checkpoint.read_table(b70_mini_model / "target", cache)
    n = _file_count(b70_mini_model / "target")
    assert first["read"]["files_read"] == n and first["read"]["bytes"] > 10_000_000
    assert second["read"] == {**second["read"], "files_read": 0, "files_cached": n, "bytes": 0}
    assert _without_read(second) == _without_read(first)


def test_two_readers_at_once_read_each_file_once(tmp_path: Path, b70_mini_model: Path) -> None:
    """What two pytest-xdist workers do: the file lock lets one read a file while the other waits for its entry."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        tables = list(
            pool.map(lambda _: checkpoint.read_table(b70_mini_model / "target", tmp_path / "cache"), range(2))
        )
    n = _file_count(b70_mini_model / "target")
    assert sum(t["read"]["files_read"] for t in tables) == n
    assert sum(t["read"]["files_cached"] for t in tables) == n
    assert _without_read(tables[0]) == _without_read(tables[1])


def test_a_corrupted_cache_entry_is_read_again(tmp_path: Path, b70_mini_model: Path) -> None:
    cache = tmp_path / "cache"
    first = checkpoint.read_table(b70_mini_model / "target", cache)
    entries = _cache_entries(cache)
    n = _file_count(b70_mini_model / "target")
    assert len(entries) == n
    weights = next(p for p in entries if "tensors" in json.loads(p.read_bytes()))
    others = [p for p in entries if p != weights]
    others[0].write_bytes(others[0].read_bytes()[:40])  # cut short
    others[1].write_text(json.dumps({"format": checkpoint.CACHE_FORMAT, "key": "someone else's"}))
    others[2].write_bytes(b"\x00\xff not json")
    weights.write_text(json.dumps({**json.loads(weights.read_bytes()), "tensors": {"x": 5}}))  # right key, bad body
    again = checkpoint.read_table(b70_mini_model / "target", cache)
    assert again["read"]["files_read"] == 4 and again["read"]["files_cached"] == n - 4
    assert _without_read(again) == _without_read(first)
    assert checkpoint.read_table(b70_mini_model / "target", cache)["read"]["files_read"] == 0, "entries rewritten"


def test_an_unusable_cache_folder_costs_time_not_the_table(tmp_path: Path, b70_mini_model: Path) -> None:
    (tmp_path / "not-a-folder").write_text("")
    table = checkpoint.read_table(b70_mini_model / "target", tmp_path / "not-a-folder")
    assert table["read"]["files_read"] == _file_count(b70_mini_model / "target") and table["kv_scale_count"] == 8


def test_an_edited_file_is_read_again(tmp_path: Path, target_copy: Path) -> None:
    cache = tmp_path / "cache"
    first = checkpoint.read_table(target_copy, cache)

    weights = target_copy / "model.safetensors"
    tensors = load_file(str(weights))
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(weights), metadata={"format": "pt"})
    edited = checkpoint.read_table(target_copy, cache)
    assert edited["read"]["files_read"] == 1 and edited["read"]["files_cached"] == _file_count(target_copy) - 1
    assert edited["files"]["model.safetensors"] == digests.file_sha256(weights) != first["files"]["model.safetensors"]
    assert edited["digest"] != first["digest"]
    assert _close(edited["tensors"][name]["moments"]["sumsq"], 4 * first["tensors"][name]["moments"]["sumsq"])
    others = [n for n in first["tensors"] if n != name]
    assert all(edited["tensors"][n] == first["tensors"][n] for n in others)

    config = target_copy / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touched, same bytes
    touched = checkpoint.read_table(target_copy, cache)
    assert touched["read"]["files_read"] == 1 and touched["digest"] == edited["digest"]


# --- bad inputs: a CheckpointError naming the file --------------------------------------------------------


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=str(tmp_path / "nowhere")):
        checkpoint.read_table(tmp_path / "nowhere", None)


def test_a_folder_without_safetensors_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=rf"{tmp_path}: no \*\.safetensors"):
        checkpoint.read_table(tmp_path, None)


@pytest.mark.parametrize("keep", [4, 100, "half"])
def test_a_truncated_safetensors_file_is_named(keep, tmp_path: Path, target_copy: Path) -> None:
    weights = target_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2 if keep == "half" else keep])
    with pytest.raises(CheckpointError, match=str(weights)):
        checkpoint.read_table(target_copy, tmp_path / "cache")


def test_an_index_naming_a_missing_shard_is_named(target_copy: Path) -> None:
    (target_copy / checkpoint.INDEX_FILE).write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        checkpoint.read_table(target_copy, None)


def test_a_corrupted_config_is_named(target_copy: Path) -> None:
    (target_copy / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=str(target_copy / "config.json")):
        checkpoint.read_table(target_copy, None)


# --- a pack-quantized INT4 checkpoint ---------------------------------------------------------------------


def _pack_quantized(folder: Path) -> dict[str, torch.Tensor]:
    """A two-layer compressed-tensors pack-quantized checkpoint (INT4, group 32, symmetric), packed by the
    compressed-tensors library itself, with KV scales under the older `k_proj.output_scale` names. Returns the
    int4 values of each packed weight."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    generator = torch.Generator().manual_seed(7)
    tensors: dict[str, torch.Tensor] = {}
    int4: dict[str, torch.Tensor] = {}
    for i in range(2):
        for proj, shape in (("q_proj", (64, 128)), ("k_proj", (32, 128)), ("v_proj", (32, 128))):
            prefix = f"model.layers.{i}.self_attn.{proj}"
            weight = torch.randn(*shape, generator=generator)
            groups = weight.reshape(shape[0], -1, 32)
            scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            scale = scale.to(torch.bfloat16)
            int4[prefix] = quantize(weight, scale, zero_point, args, dtype=torch.int8)
            packed = PackedQuantizationCompressor.compress({"weight": weight, "weight_scale": scale}, scheme)
            tensors.update({f"{prefix}.{k}": v.contiguous() for k, v in packed.items()})
        tensors[f"model.layers.{i}.self_attn.k_proj.output_scale"] = torch.tensor([0.011 + i / 64], dtype=torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_proj.output_scale"] = torch.tensor([0.021 + i / 64], dtype=torch.float32)
        tensors[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(128, dtype=torch.bfloat16)
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    quantization = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": args.model_dump(mode="json"),
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
    }
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": quantization})
    )
    return int4


def test_a_pack_quantized_checkpoint_is_tabled_in_its_checkpoint_form(tmp_path: Path) -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    folder = tmp_path / "int4"
    int4 = _pack_quantized(folder)
    table = checkpoint.read_table(folder, tmp_path / "cache")

    assert table["quantization"]["format"] == "pack-quantized"
    assert table["quantization"]["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    stored = load_file(str(folder / "model.safetensors"))
    assert sorted(table["tensors"]) == sorted(stored)
    for prefix, values in int4.items():
        packed = table["tensors"][f"{prefix}.weight_packed"]
        assert packed["dtype"] == "int32" and packed["shape"] == [values.shape[0], values.shape[1] // 8]
        assert table["tensors"][f"{prefix}.weight_scale"]["dtype"] == "bfloat16"
        assert table["tensors"][f"{prefix}.weight_shape"]["dtype"] == "int64"
        assert table["tensors"][f"{prefix}.weight_shape"]["moments"]["sum"] == sum(values.shape)
        # the packed int32 words hold exactly the int4 values that went in
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            words = f.get_tensor(f"{prefix}.weight_packed")
            shape = torch.Size(f.get_tensor(f"{prefix}.weight_shape").tolist())
        assert torch.equal(unpack_from_int32(words, 4, shape), values)
        assert int(values.min()) >= -8 and int(values.max()) <= 7
    for name, tensor in stored.items():  # moments against an independent float64 computation
        as_float64 = (
            tensor.numpy().astype("float64")
            if tensor.dtype != torch.bfloat16
            else tensor.float().numpy().astype("float64")
        )
        want = {"sum": float(as_float64.sum()), "sumsq": float((as_float64**2).sum()), "numel": as_float64.size}
        assert _same_moments(table["tensors"][name]["moments"], want), name
    assert any(abs(t["moments"]["sum"]) > 2**31 for n, t in table["tensors"].items() if n.endswith("_packed"))

    expected = {
        f"model.layers.{i}.self_attn.attn": (
            float(stored[f"model.layers.{i}.self_attn.k_proj.output_scale"]),
            float(stored[f"model.layers.{i}.self_attn.v_proj.output_scale"]),
        )
        for i in range(2)
    }
    assert table["kv_scales"] == {layer: {"k_scale": k, "v_scale": v} for layer, (k, v) in expected.items()}
    assert table["kv_scale_count"] == 4 and table["kv_scale_digest"] == digests.kv_scale_digest(expected)


@pytest.mark.parametrize(
    ("name", "engine"),
    [
        ("model.layers.3.self_attn.k_scale", ("model.layers.3.self_attn.attn", "k_scale")),
        ("model.layers.3.self_attn.attn.v_scale", ("model.layers.3.self_attn.attn", "v_scale")),
        ("model.layers.3.self_attn.v_proj.output_scale", ("model.layers.3.self_attn.attn", "v_scale")),
        ("model.layers.3.self_attn.q_proj.output_scale", None),
        ("model.layers.3.self_attn.k_proj.weight_scale", None),
    ],
)
def test_kv_scale_names_map_to_the_engine_attention_layer(name: str, engine) -> None:
    assert checkpoint.engine_kv_scale(name) == engine


# --- a Hugging Face cache snapshot ------------------------------------------------------------------------


def test_a_model_absent_from_the_hub_cache_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError) as e:
        checkpoint.hub_snapshot("poolside/Laguna-S-2.1-INT4", "4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb")
    message = str(e.value)
    assert f"not in the Hugging Face cache at {tmp_path}" in message
    assert "hf download poolside/Laguna-S-2.1-INT4 --revision 4bbfc285" in message and "local folder" in message


def _lay_hub_snapshot(cache: Path, hub_id: str, commit: str, files: Path) -> Path:
    """A snapshot as `hf download` leaves it: blobs named by sha256 (LFS files) or git blob hash (the rest),
    snapshots/<commit>/ linking into them, refs/main naming the commit."""
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils.sha import git_hash

    repo = cache / repo_folder_name(repo_id=hub_id, repo_type="model")
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(files.iterdir()):
        data = path.read_bytes()
        blob = digests.file_sha256(path) if path.suffix == ".safetensors" else git_hash(data)
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_a_hub_snapshot_is_read_with_its_blob_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, b70_mini_model: Path
) -> None:
    from huggingface_hub import scan_cache_dir

    hub, commit, hub_id = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567", "b70lab/mini-target"
    snapshot = _lay_hub_snapshot(hub, hub_id, commit, b70_mini_model / "target")
    cached = {repo.repo_id: repo for repo in scan_cache_dir(hub).repos}
    assert {r.commit_hash for r in cached[hub_id].revisions} == {commit}, "huggingface_hub sees the snapshot"

    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert checkpoint.hub_snapshot(hub_id, "main") == snapshot
    assert checkpoint.hub_snapshot(hub_id, commit) == snapshot
    assert checkpoint.locate(f"{hub_id}@main") == snapshot

    table = checkpoint.read_table(snapshot, tmp_path / "cache", source=f"{hub_id}@main")
    plain = checkpoint.read_table(b70_mini_model / "target", None)
    blob = (snapshot / "model.safetensors").resolve().name
    assert table["files"]["model.safetensors"] == blob
    assert table["files"] == plain["files"] and table["digest"] == plain["digest"], "same bytes, same identity"
    assert _without_read(table) == {**_without_read(plain), "source": f"{hub_id}@main"}
    assert (tmp_path / "cache" / checkpoint.CACHE_SUBDIR / f"blob-{blob}.json").is_file()
    again = checkpoint.read_table(snapshot, tmp_path / "cache")
    assert again["read"]["files_read"] == 0 and again["read"]["bytes"] == 0


# --- the command line -------------------------------------------------------------------------------------


def test_contract_derive_prints_the_mini_contracts_pins(
    tmp_path: Path, b70_mini_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pinned = tomllib.loads((REPO / "fixtures" / "contracts" / "mini-laguna-cpu.toml").read_text())["expect"]
    assert cli.main(["contract", "derive", str(b70_mini_model / "target"), "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    derived = tomllib.loads(out)["expect"]
    assert derived["target_kv_scale_count"] == pinned["target_kv_scale_count"] == 8
    assert derived["target_kv_scale_digest"] == pinned["target_kv_scale_digest"]
    manifest = mini.load_manifest(b70_mini_model)
    files = [f for f in manifest["files"] if f.startswith("target/")]
    assert f"tensors: {len(manifest['target']['tensors'])}" in out and f"{len(files)} files read" in out

    assert cli.main(["contract", "derive", str(b70_mini_model / "target"), "--cache-dir", str(tmp_path), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["kv_scale_digest"] == pinned["target_kv_scale_digest"] and table["read"]["files_cached"] == len(files)


@pytest.mark.parametrize("spec", ["{tmp}/nowhere", "someone/absent@main"])
def test_contract_derive_of_a_missing_checkpoint_exits_2(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert cli.main(["contract", "derive", spec.format(tmp=tmp_path), "--cache-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("b70lab: ") and "Traceback" not in captured.err


def test_mini_export_writes_plain_folders(
    tmp_path: Path, b70_cache_root: Path, b70_mini_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    assert cli.main(["mini", "export", str(out), "--cache-dir", str(b70_cache_root)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    for part in ("target", "draft"):
        names = sorted(p.name for p in (out / part).iterdir())
        assert mini.MANIFEST not in names and "model.safetensors" in names and "config.json" in names
        exported = checkpoint.read_table(out / part, None)
        assert exported["digest"] == checkpoint.read_table(b70_mini_model / part, None)["digest"]
    assert not list(tmp_path.glob(".export.*-*")), "no staging folder left behind"

    stamp = (out / "target" / "model.safetensors").stat().st_mtime_ns
    assert mini.export_plain(b70_mini_model, out) == out
    assert (out / "target" / "model.safetensors").stat().st_mtime_ns == stamp, "an identical export is kept"

    (out / "draft" / "config.json").write_text("{}")  # damaged: exported again
    assert mini.export_plain(b70_mini_model, out) == out
    assert (
        digests.file_sha256(out / "draft" / "config.json")
        == mini.load_manifest(b70_mini_model)["files"]["draft/config.json"]
    )


def test_mini_export_refuses_a_folder_it_did_not_write(tmp_path: Path, b70_mini_model: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(mini.MiniModelError, match="not a b70lab mini export"):
        mini.export_plain(b70_mini_model, tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_a_stale_mini_export_is_refreshed_and_a_foreign_folder_is_not(
    tmp_path: Path, b70_cache_root: Path, b70_mini_model: Path
) -> None:
    """An export left by an earlier mini (its mark says it is ours) is replaced by the current mini's; a
    folder without the mark is somebody's checkpoint and is served as it is."""
    from pytest_b70lab.contract import schema as contract

    text = contract.resolve_path("mini-laguna-cpu-path").read_text()
    export = tmp_path / "export"
    spec = tmp_path / "path.toml"
    spec.write_text(text.replace('"data/mini-export/', f'"{export}/'))
    mini.export_plain(b70_mini_model, export)
    stale = export / "target" / "config.json"
    stale.write_text(stale.read_text().replace('"hidden_size"', '"hidden_size" ', 1))  # an older mini's file
    models = starts.resolve_models(contract.load(spec), b70_cache_root)
    assert models.tables["target"]["digest"] == checkpoint.read_table(b70_mini_model / "target", None)["digest"]

    (export / mini.EXPORT_MARK).unlink()  # now a plain folder the harness did not write
    stale.write_text(stale.read_text().replace('"hidden_size"', '"hidden_size" ', 1))
    edited = digests.file_sha256(stale)
    starts.resolve_models(contract.load(spec), b70_cache_root)
    assert digests.file_sha256(stale) == edited, "a folder without the export mark must never be rewritten"
