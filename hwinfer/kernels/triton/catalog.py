"""The portable Triton kernels, as (op, target, check) triples, for any backend to list.

One line per kernel. A backend whose devices run upstream-compatible Triton (Intel's XPU
backend, Triton-Ascend) builds its impls from this list with its own predicate and priority
(``hwinfer.backend.portable.triton_impls``), so a new kernel reaches those tables by adding one
line here. Kept free of imports: listing a kernel never imports Triton.
"""
from __future__ import annotations

PORTABLE_TRITON_KERNELS: tuple[tuple[str, str, str | None], ...] = (
    ("rms_norm", "hwinfer.kernels.triton.norm:rms_norm",
     "hwinfer.kernels.triton.norm:rms_norm_supported"),
    ("gdn_recurrent", "hwinfer.kernels.triton.delta_rule:gdn_recurrent",
     "hwinfer.kernels.triton.delta_rule:delta_rule_supported"),
    ("gdn_gated_recurrent", "hwinfer.kernels.triton.delta_rule:gdn_gated_recurrent",
     "hwinfer.kernels.triton.delta_rule:gdn_gated_recurrent_supported"),
    ("kda_recurrent", "hwinfer.kernels.triton.delta_rule:kda_recurrent",
     "hwinfer.kernels.triton.delta_rule:delta_rule_supported"),
    ("kda_gated_recurrent", "hwinfer.kernels.triton.delta_rule:kda_gated_recurrent",
     "hwinfer.kernels.triton.delta_rule:kda_gated_recurrent_supported"),
    ("kv_store_fp8_ds_mla", "hwinfer.kernels.triton.kv_pack:kv_store_fp8_ds_mla", None),
    ("sparse_mla_decode", "hwinfer.kernels.triton.sparse_mla:sparse_mla_decode",
     "hwinfer.kernels.triton.sparse_mla:sparse_mla_decode_supported"),
    ("block_sparse_decode", "hwinfer.kernels.triton.block_sparse:block_sparse_decode",
     "hwinfer.kernels.triton.block_sparse:block_sparse_decode_supported"),
    ("add_rms_norm_linear", "hwinfer.kernels.triton.gemv_norm:add_rms_norm_linear", None),
    ("add_rms_norm_linear_conv", "hwinfer.kernels.triton.gemv_norm:add_rms_norm_linear_conv", None),
    ("rms_norm_gated_linear", "hwinfer.kernels.triton.gemv_norm:rms_norm_gated_linear", None),
    ("paged_attention", "hwinfer.kernels.triton.paged_attention:paged_attention",
     "hwinfer.kernels.triton.paged_attention:paged_attention_supported"),
    ("causal_conv1d", "hwinfer.kernels.triton.conv:causal_conv1d",
     "hwinfer.kernels.triton.conv:causal_conv1d_supported"),
    ("moe_experts", "hwinfer.kernels.triton.moe_gemm:moe_experts",
     "hwinfer.kernels.triton.moe_gemm:moe_experts_supported"),
    ("moe_experts_fp8", "hwinfer.kernels.triton.moe_gemm:moe_experts_fp8",
     "hwinfer.kernels.triton.moe_gemm:moe_experts_fp8_supported"),
    ("moe_experts_fp4", "hwinfer.kernels.triton.moe_gemm:moe_experts_fp4",
     "hwinfer.kernels.triton.moe_gemm:moe_experts_fp4_supported"),
    ("route_topk", "hwinfer.kernels.triton.moe_route:route_topk",
     "hwinfer.kernels.triton.moe_route:route_topk_supported"),
    ("route_hash", "hwinfer.kernels.triton.moe_route:route_hash",
     "hwinfer.kernels.triton.moe_route:route_hash_supported"),
    ("sparse_mla_prefill", "hwinfer.kernels.triton.sparse_mla:sparse_mla_prefill",
     "hwinfer.kernels.triton.sparse_mla:sparse_mla_prefill_supported"),
    ("lightning_indexer", "hwinfer.kernels.triton.indexer:lightning_indexer",
     "hwinfer.kernels.triton.indexer:lightning_indexer_supported"),
    ("mhc_pre", "hwinfer.kernels.triton.mhc:mhc_pre",
     "hwinfer.kernels.triton.mhc:hc_entry_supported"),
    ("mhc_head", "hwinfer.kernels.triton.mhc:mhc_head",
     "hwinfer.kernels.triton.mhc:hc_entry_supported"),
    ("ihc_pre", "hwinfer.kernels.triton.mhc:ihc_pre",
     "hwinfer.kernels.triton.mhc:hc_entry_supported"),
    ("mhc_post", "hwinfer.kernels.triton.mhc:mhc_post",
     "hwinfer.kernels.triton.mhc:hc_exit_supported"),
    ("ihc_post", "hwinfer.kernels.triton.mhc:ihc_post",
     "hwinfer.kernels.triton.mhc:hc_exit_supported"),
    ("kv_compress_step", "hwinfer.kernels.triton.compressor:kv_compress_step",
     "hwinfer.kernels.triton.compressor:kv_compress_step_supported"),
    ("rms_norm_rope", "hwinfer.kernels.triton.norm_rope:rms_norm_rope",
     "hwinfer.kernels.triton.norm_rope:rms_norm_rope_supported"),
    ("rms_norm_rope_kv_store", "hwinfer.kernels.triton.norm_rope:rms_norm_rope_kv_store",
     "hwinfer.kernels.triton.norm_rope:rms_norm_rope_kv_store_supported"),
    ("rope_tables", "hwinfer.kernels.triton.rope:rope_tables", None),
    ("sample", "hwinfer.kernels.triton.sampling:sample",
     "hwinfer.kernels.triton.sampling:sample_supported"),
    ("gdn_chunked", "hwinfer.kernels.triton.delta_chunk:gdn_chunked",
     "hwinfer.kernels.triton.delta_chunk:delta_chunk_supported"),
    ("kda_chunked", "hwinfer.kernels.triton.delta_chunk:kda_chunked",
     "hwinfer.kernels.triton.delta_chunk:delta_chunk_supported"),
    ("rms_norm_gated", "hwinfer.kernels.triton.norm:rms_norm_gated",
     "hwinfer.kernels.triton.norm:rms_norm_supported"),
    ("gdn_gate", "hwinfer.kernels.triton.gates:gdn_gate",
     None),
    ("add_rms_norm", "hwinfer.kernels.triton.norm:add_rms_norm",
     "hwinfer.kernels.triton.norm:rms_norm_supported"),
    ("gated_act", "hwinfer.kernels.triton.activation:gated_act",
     "hwinfer.kernels.triton.activation:gated_act_supported"),
)


def ops_of_module(module: str) -> list[str]:
    """The ops whose portable kernel lives in ``module`` (e.g. ``hwinfer.kernels.triton.norm``)."""
    return [op for op, target, _ in PORTABLE_TRITON_KERNELS if target.partition(":")[0] == module]
