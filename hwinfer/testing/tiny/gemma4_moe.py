"""Tiny Gemma 4 MoE, shaped like the 26B-A4B release: a dense gelu-tanh MLP and a softmax top-k
MoE (router scale / per_expert_scale, fused ``experts.gate_up_proj``) in parallel in every layer;
global layers with ``attention_k_eq_v`` (no v_proj) and fewer KV heads; no PLE, no KV sharing."""
from __future__ import annotations

from typing import Any

from hwinfer.testing.tiny import gemma4

QUANT = gemma4.QUANT
quant_scheme = gemma4.quant_scheme

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def config(size: str) -> dict[str, Any]:
    text = gemma4.text_config(size)
    text.update(num_hidden_layers=len(LAYER_TYPES), layer_types=list(LAYER_TYPES), num_key_value_heads=2,
                num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=0,
                use_double_wide_mlp=False, hidden_size_per_layer_input=0, enable_moe_block=True,
                num_experts=8, top_k_experts=2, moe_intermediate_size=32 if size == "tiny" else 128)
    return {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
            "vision_config": dict(gemma4.VISION), "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
