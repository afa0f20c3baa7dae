"""The embedded default model: build (served folders and manifest), curriculum and training.

`from pytest_b70lab import mini` keeps one flat surface; the parts live in their own modules.
"""

from .build import (  # noqa: F401  (the package's public surface)
    BUILDER_VERSION, EXPORT_MARK, EXPORTED_PARTS, FP8_E4M3_MAX, KV_CACHE_SCHEME, MANIFEST, SPECIAL_TOKENS,
    WEIGHT_FILES, DraftRecipe, MiniModelError, MiniRecipe, TargetRecipe, build, calibrate_kv_scales,
    calibration_texts, default_cache_root, draft_config, engine_attention_layer, export_plain, file_sha256,
    folder_for, kv_scale_digest, library_versions, load_manifest, load_target_model, recipe_digest,
    sha256_canonical, target_config, tensor_digests, trained_recipe, verify, weight_digests, weights_dir,
    write_draft, write_target,
)
