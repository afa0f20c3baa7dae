"""The embedded default model: build (served folders and manifest), curriculum and training.

`from pytest_b70lab import mini` keeps one flat surface; the parts live in their own modules.
"""

from .build import (  # noqa: F401  (the package's public surface)
    BUILDER_VERSION, CALIBRATION_TEXTS, EXPORT_MARK, EXPORTED_PARTS, FP8_E4M3_MAX, KV_CACHE_SCHEME, MANIFEST,
    SPECIAL_TOKENS, DraftRecipe, MiniModelError, MiniRecipe, TargetRecipe, build, build_target_model,
    build_tokenizer, calibrate_kv_scales, default_cache_root, engine_attention_layer, export_plain, file_sha256,
    folder_for, kv_scale_digest, library_versions, load_manifest, recipe_digest, sha256_canonical,
    target_config, tensor_digests, verify, write_draft, write_target,
)
