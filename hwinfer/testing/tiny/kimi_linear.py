"""Tiny Kimi-Linear (published config.json field names, as moonshotai/Kimi-Linear-48B-A3B-Instruct).

5 layers: KDA, KDA, MLA, KDA, MLA (``linear_attn_config`` is 1-indexed), layer 0 dense, the
rest MoE (8 experts, top-2, 1 shared expert). Kimi-Linear is released in bf16 only: no QUANT.
"""
from __future__ import annotations

from typing import Any

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                 kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                 linear_heads=4, linear_head_dim=16),
    "small": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_attention_heads=8,
                  kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                  linear_heads=8, linear_head_dim=32),
}


def config(size: str) -> dict[str, Any]:
    dims = dict(SIZES[size])
    heads, head_dim = dims.pop("linear_heads"), dims.pop("linear_head_dim")
    return {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
        "vocab_size": 512, "num_hidden_layers": 5, "num_key_value_heads": dims["num_attention_heads"],
        "q_lora_rank": None, "mla_use_nope": True,
        "linear_attn_config": {"full_attn_layers": [3, 5], "kda_layers": [1, 2, 4], "head_dim": head_dim,
                               "num_heads": heads, "short_conv_kernel_size": 4},
        "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
        "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "model_max_length": 1048576,
        "tie_word_embeddings": False, "bos_token_id": 1, "pad_token_id": 0, "torch_dtype": "bfloat16",
        **dims,
    }


QUANT: dict[str, dict] = {}


def quant_scheme(key: str, quant: str) -> str | None:
    return None
