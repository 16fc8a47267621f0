"""Issue 2's list of ops the target models need: each must be declared with a reference, a
docstring giving shapes, test cases and tolerances, and must resolve on the CPU."""
from __future__ import annotations

import inspect

import pytest

from hwinfer.backend import fake_device, select
from hwinfer.ops import all_ops

REQUIRED = {
    # attention
    "sparse_mla_prefill", "sparse_mla_decode",      # DeepSeek-V4 (also GLM-5 DSA, HY4 absorbed)
    "attention", "paged_attention",                 # Qwen3.5 gated GQA, Gemma 4, Kimi MLA, HY4
    "block_sparse_indexer", "block_sparse_attention",  # MiniMax-M3
    # compressor and indexer
    "kv_compress", "kv_compress_step", "lightning_indexer",
    # hyper-connections
    "mhc_pre", "mhc_post", "mhc_head", "ihc_pre", "ihc_post",
    # MoE and quantized weights
    "route_topk", "route_hash", "moe_experts", "moe_experts_fp8", "moe_experts_fp4", "latent_moe",
    "dequant_fp8_block", "dequant_fp4", "linear_fp8_block", "linear_fp4",
    # linear attention and conv
    "gdn_chunked", "gdn_recurrent", "kda_chunked", "kda_recurrent", "gdn_gate", "kda_gate",
    "causal_conv1d",
    # norms, rope, sampling
    "rms_norm", "rms_norm_gated", "rope_tables", "apply_rope", "sample",
}


def test_every_required_op_is_declared():
    missing = REQUIRED - set(all_ops())
    assert not missing, f"ops without a contract: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_contract_is_complete(name):
    spec = all_ops()[name]
    doc = inspect.cleandoc(spec.doc)
    assert len(doc.splitlines()) >= 3, "the docstring must give the math, shapes and dtypes"
    assert "[" in doc, "the docstring must give shapes like [T, H, D]"
    assert spec.cases and spec.dtypes and spec.tolerance
    assert set(spec.dtypes) <= set(spec.tolerance) | {d for d in spec.dtypes if spec.tol(d)}


def test_every_op_resolves_on_this_cpu_without_fallback():
    table = select(fake_device("cpu"), strict=True)
    assert set(table.choices) == set(all_ops())
