"""Tiny Tencent HY4 (``hy_v4``) with the published config.json field names (Hy4-preview style).

``index_topk`` 8 so selection drops keys on ~40-token sequences; ``indexer_types`` full, full,
shared, shared (the published rule: layer 0 and every 4th from layer 1); the routed experts'
gate/up weights are scaled up in ``init`` so the ``swiglu_limit`` clamp really cuts; a few MTP
tensors (``model.mtp_layers.0.*``, unused by both libraries) ride along.
"""
from __future__ import annotations

from typing import Any

import torch

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, head_dim=16,
                 v_head_dim=16, index_n_heads=16, index_head_dim=32, index_topk=8, intermediate_size=128,
                 moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2),
    "small": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
                  q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32, head_dim=32,
                  v_head_dim=32, index_n_heads=16, index_head_dim=64, index_topk=64, intermediate_size=512,
                  moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4),
}


def config(size: str) -> dict[str, Any]:
    n = SIZES[size]["num_hidden_layers"]
    return {
        "architectures": ["HYV4ForCausalLM"], "model_type": "hy_v4", "dtype": "bfloat16",
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.006,
        "gated_mla": True, "gating_type": "elementwise", "learnable_sink": True, "learnable_sink_init": 0.0,
        "use_dsa": True, "layer_types": ["deepseek_sparse_attention"] * n,
        "indexer_types": ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(n)],
        "enable_ihc": True, "hc_mult": 4, "hc_magnitude": 2.0, "hc_eps": 1e-06,
        "mlp_layer_types": ["dense"] + ["sparse"] * (n - 1), "n_shared_experts": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1,
        "swiglu_limit": 10.0, "num_nextn_predict_layers": 1, "mtp_loss_factor": 0.1,
        "enable_lm_head_fp32": True, "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default"},
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "use_cache": True,
        "vocab_size": 512, **SIZES[size],
    }


# No quantized Hy4-preview release that transformers 5.23.0 can read is known (see the report).
QUANT: dict[str, dict] = {}


def quant_scheme(key: str, quant: str) -> str | None:
    return None


def init(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Scale the routed experts' gate/up rows up so |gate|, |up| often exceed swiglu_limit."""
    with torch.no_grad():
        for layer in model.layers:
            experts = getattr(layer.mlp, "experts", None)
            if experts is not None:
                experts.w13.mul_(8.0)


def extra_tensors(config: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    h = config["hidden_size"]
    return {"model.mtp_layers.0.eh_proj.weight": torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5,
            "model.mtp_layers.0.enorm.weight": torch.ones(h), "model.mtp_layers.0.hnorm.weight": torch.ones(h)}
