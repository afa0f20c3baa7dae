"""The embedded default model: its recipe, build (served folders and manifest), curriculum and training.

`from pytest_b70lab import mini` keeps one flat surface; the parts live in their own modules.
"""

from .build import (  # noqa: F401  (the package's public surface)
    BUILDER_VERSION,
    EXPORT_MARK,
    EXPORTED_PARTS,
    FP8_E4M3_MAX,
    INT4_PREFIX,
    KV_CACHE_SCHEME,
    MANIFEST,
    MiniModelError,
    build,
    build_int4,
    calibrate_kv_scales,
    calibration_texts,
    default_cache_root,
    engine_attention_layer,
    export_plain,
    file_sha256,
    folder_for,
    int4_distilled_against,
    int4_draft_digests,
    kv_scale_digest,
    load_manifest,
    load_target_model,
    recipe_digest,
    sha256_canonical,
    tensor_digests,
    trained_recipe,
    verify,
    weight_digests,
    weights_dir,
    write_draft,
    write_target,
)
from .recipe import (  # noqa: F401
    SPECIAL_TOKENS,
    WEIGHT_FILES,
    DraftRecipe,
    MiniRecipe,
    TargetRecipe,
    draft_config,
    library_versions,
    target_config,
)
