"""Tiny GLM-5 (``glm_moe_dsa``) with the published config.json field names.

The tiny model keeps every code path busy on ~40-token sequences: ``index_topk`` 8 (selection
really drops keys), GLM-5.2-style indexer sharing (``index_topk_freq`` 2 with
``index_skip_topk_offset`` 1 gives full, shared, full, shared), group-limited routing (2 groups,
1 kept), one dense layer, and an MTP layer in the checkpoint (``model.layers.4.*``, unused).
Every FP8-quantized matrix has both dimensions <= 128 or a multiple of 128, so a 128x128 block
grid reads the same in hwinfer and in transformers (which infers the block size from the grid).
"""
from __future__ import annotations

from typing import Any

import torch

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, head_dim=16,
                 v_head_dim=16, index_n_heads=16, index_head_dim=32, index_topk=8, intermediate_size=128,
                 moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1),
    "small": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
                  q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32, head_dim=32,
                  v_head_dim=32, index_n_heads=16, index_head_dim=64, index_topk=64, intermediate_size=512,
                  moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2),
}


def config(size: str) -> dict[str, Any]:
    return {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
        "attention_bias": False, "attention_dropout": 0.0, "dtype": "bfloat16", "hidden_act": "silu",
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_shared_experts": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "index_topk_freq": 2, "index_skip_topk_offset": 1, "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "max_position_embeddings": 4096, "initializer_range": 0.02, "tie_word_embeddings": False,
        "use_cache": True, "vocab_size": 512, **SIZES[size],
    }


# GLM-5-FP8: DeepSeek-V3-style block FP8 (e4m3 weights, fp32 ``weight_scale_inv`` per 128x128).
QUANT = {"fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                 "weight_block_size": [128, 128]}}


def quant_scheme(key: str, quant: str) -> str | None:
    """Every linear projection (attention, indexer wq_b / wk, MLPs, experts) in FP8; the router,
    the indexer's fp32 ``weights_proj``, norms, embeddings and lm_head stay unquantized."""
    if quant != "fp8" or key.endswith(("mlp.gate.weight", "weights_proj.weight")):
        return None
    return "fp8_fp32"


def extra_tensors(config: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A few tensors of the MTP layer (``num_nextn_predict_layers``), which hwinfer does not use."""
    h, p = config["hidden_size"], f"model.layers.{config['num_hidden_layers']}"
    return {f"{p}.eh_proj.weight": torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5,
            f"{p}.enorm.weight": torch.ones(h), f"{p}.hnorm.weight": torch.ones(h),
            f"{p}.shared_head.norm.weight": torch.ones(h), f"{p}.input_layernorm.weight": torch.ones(h)}
