"""Tiny DeepSeek-V4 (published config.json field names, as in the Flash release).

Layers sliding / CSA (m 4) / HCA / CSA plus one sliding MTP block (the last ``compress_ratios``
entry). The HCA rate is lowered to 8 through ``compress_rate_hca`` (a field transformers folds
into ``compress_rates``; it rejects other values inside ``compress_ratios``), so 40-token
sequences complete several HCA windows; ``sliding_window`` 8 and ``index_topk`` 3 make the window
and the indexer's top-k actually bind. 8 indexer heads keep exact-zero score ties rare
(MODELS.md §9). ``tiny_d512``: the same at the released head widths (attention 512 with 64 RoPE
channels, indexer 128), which the packed ``fp8_ds_mla`` cache (``kv_format="fp8"``) needs.
"""
from __future__ import annotations

from typing import Any

import torch

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=64, qk_rope_head_dim=16,
                 q_lora_rank=32, o_groups=2, o_lora_rank=32, sliding_window=8, index_n_heads=8,
                 index_head_dim=32, index_topk=3, n_routed_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, num_hash_layers=2, compress_ratios=[0, 4, 128, 4, 0],
                 compress_rate_hca=8),
    "small": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, head_dim=128, qk_rope_head_dim=32,
                  q_lora_rank=128, o_groups=4, o_lora_rank=128, sliding_window=32, index_n_heads=8,
                  index_head_dim=64, index_topk=16, n_routed_experts=16, num_experts_per_tok=4,
                  moe_intermediate_size=64, num_hash_layers=2, compress_ratios=[0, 0, 4, 128, 4, 128, 0]),
}
SIZES["tiny_d512"] = {**SIZES["tiny"], "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}


def config(size: str) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 512,
        "num_key_value_heads": 1, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "compress_rope_theta": 160000, "max_position_embeddings": 1048576,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                         "original_max_position_embeddings": 65536, "type": "yarn"},
        "num_nextn_predict_layers": 1, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
        "use_cache": True, **SIZES[size],
    }


# The Flash release: FP8 e4m3 dense projections with UE8M0 128x128 block scales, FP4 experts.
QUANT = {"fp8": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                 "weight_block_size": [128, 128], "expert_dtype": "fp4"}}


def quant_scheme(key: str, quant: str) -> str | None:
    """Called for the layout's quantizable tensors only: routed experts FP4 (int8 pairs + UE8M0
    per 32), every other (wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b, shared experts, MTP
    e_proj / h_proj) FP8 with a UE8M0 ``.scale``."""
    if quant != "fp8":
        return None
    return "fp4" if ".ffn.experts." in key else "fp8_ue8m0"


def init(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Hash tables: k distinct random experts per token id (random init leaves zeros)."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):
                vocab, k = buf.shape
                experts = model.config["n_routed_experts"]
                buf.copy_(torch.rand(vocab, experts, generator=gen).argsort(dim=1)[:, :k])
