"""Vectorised torch implementations that run on any device torch supports.

Each module names the op contract it implements. ``KERNELS`` lists them (op -> target, per-call
check) as plain data; backends turn it into impl records with their own predicates and
priorities (:func:`hwinfer.backend.portable.portable_impls`).
"""

_P = "hwinfer.kernels.torch"

KERNELS: dict[str, tuple[str, str | None]] = {
    "attention": (f"{_P}.attention:attention", f"{_P}.attention:check_attention_impl"),
    "paged_attention": (f"{_P}.attention:paged_attention", None),
    "sparse_mla_prefill": (f"{_P}.sparse_mla:sparse_mla_prefill", None),
    "sparse_mla_decode": (f"{_P}.sparse_mla:sparse_mla_decode", None),
    "block_sparse_indexer": (f"{_P}.block_sparse:block_sparse_indexer", None),
    "block_sparse_attention": (f"{_P}.block_sparse:block_sparse_attention", None),
    "block_sparse_decode": (f"{_P}.block_sparse:block_sparse_decode", None),
    "kv_compress": (f"{_P}.compressor:kv_compress", None),
    "kv_compress_step": (f"{_P}.compressor:kv_compress_step", None),
    "lightning_indexer": (f"{_P}.indexer:lightning_indexer", None),
    "mhc_pre": (f"{_P}.hyper_connection:mhc_pre", None),
    "mhc_post": (f"{_P}.hyper_connection:mhc_post", None),
    "mhc_head": (f"{_P}.hyper_connection:mhc_head", None),
    "ihc_pre": (f"{_P}.hyper_connection:ihc_pre", None),
    "ihc_post": (f"{_P}.hyper_connection:ihc_post", None),
    "moe_experts": (f"{_P}.moe:moe_experts", None),
    "moe_experts_fp8": (f"{_P}.moe:moe_experts_fp8", None),
    "moe_experts_fp4": (f"{_P}.moe:moe_experts_fp4", None),
    "latent_moe": (f"{_P}.moe:latent_moe", None),
    "dequant_fp8_block": (f"{_P}.quant:dequant_fp8_block", None),
    "dequant_fp4": (f"{_P}.quant:dequant_fp4", None),
    "linear_fp8_block": (f"{_P}.quant:linear_fp8_block", None),
    "linear_fp4": (f"{_P}.quant:linear_fp4", None),
    "gdn_recurrent": (f"{_P}.linear_attention:gdn_recurrent", None),
    "gdn_gated_recurrent": (f"{_P}.linear_attention:gdn_gated_recurrent", None),
    "gdn_chunked": (f"{_P}.linear_attention:gdn_chunked", None),
    "kda_recurrent": (f"{_P}.linear_attention:kda_recurrent", None),
    "kda_chunked": (f"{_P}.linear_attention:kda_chunked", None),
    "kda_gated_recurrent": (f"{_P}.linear_attention:kda_gated_recurrent", None),
    "causal_conv1d": (f"{_P}.conv:causal_conv1d", None),
    "rms_norm": (f"{_P}.norm:rms_norm", None),
    "rms_norm_gated": (f"{_P}.norm:rms_norm_gated", None),
    "add_rms_norm": (f"{_P}.norm:add_rms_norm", None),
    "rms_norm_rope": (f"{_P}.norm:rms_norm_rope", None),
    "rms_norm_rope_kv_store": (f"{_P}.norm:rms_norm_rope_kv_store", None),
    "apply_rope": (f"{_P}.rope:apply_rope", None),
    "sample": (f"{_P}.sampling:sample", None),
    "linear": (f"{_P}.dense:linear", None),
    "add_rms_norm_linear": (f"{_P}.dense:add_rms_norm_linear", None),
    "add_rms_norm_linear_conv": (f"{_P}.dense:add_rms_norm_linear_conv", None),
    "rms_norm_gated_linear": (f"{_P}.dense:rms_norm_gated_linear", None),
}

# Ops whose reference is already what plain torch does best (a score, a top-k and a gather; a
# few vector ops computed once per forward): backends choose the reference for them on purpose.
REFERENCE_IS_BEST: dict[str, str] = {
    "route_topk": "score function, one top-k and a gather",
    "route_hash": "score function and a table gather",
    "gdn_gate": "one fused elementwise expression",
    "gated_act": "one activation and one product",
    "kda_gate": "one fused elementwise expression",
    "rope_tables": "a few vector ops, once per forward; bit-identical to transformers",
    "kv_store_fp8_ds_mla": "the pack arithmetic and one scatter",
    "paged_rows": "a few index ops, once per forward",
    "greedy_tokens": "one argmax kernel written into the output",
}
