"""Tiny Gemma 4 dense, shaped like the E2B/E4B releases (VLM layout: model_type gemma4 with a
text_config): per-layer input embeddings, the last layers sharing KV (with the double-wide MLP),
global layers with a wider head and proportional RoPE, final logit soft-capping, tied embeddings.
The sliding window is 8 so that test sequences of 40+ tokens slide."""
from __future__ import annotations

from typing import Any

import torch

# Six layers, two sliding : one global; the last three reuse the KV of layers 1 (sliding) and 2.
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2
ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=16, global_head_dim=32, hidden_size_per_layer_input=8),
    "small": dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=1,
                  head_dim=32, global_head_dim=64, hidden_size_per_layer_input=16),
}


def text_config(size: str) -> dict[str, Any]:
    return {
        "model_type": "gemma4_text", "vocab_size": 512, "vocab_size_per_layer_input": 512,
        "num_hidden_layers": len(LAYER_TYPES), "layer_types": list(LAYER_TYPES), "num_kv_shared_layers": 3,
        "num_global_key_value_heads": None, "attention_k_eq_v": False, "use_double_wide_mlp": True,
        "sliding_window": 8, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "attention_bias": False,
        "enable_moe_block": False, "rope_parameters": {k: dict(v) for k, v in ROPE.items()},
        "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": True, **SIZES[size],
    }


# The towers are present in the releases; hwinfer ignores them (tests add their tensors).
VISION = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "patch_size": 4,
          "pooling_kernel_size": 2, "position_embedding_size": 64, "use_clipped_linears": True}
AUDIO = {"model_type": "gemma4_audio", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
         "subsampling_conv_channels": [4, 4], "conv_kernel_size": 3, "attention_chunk_size": 4,
         "attention_context_left": 5, "attention_context_right": 0, "output_proj_dims": 16}


def config(size: str) -> dict[str, Any]:
    return {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
            "text_config": text_config(size), "vision_config": dict(VISION), "audio_config": dict(AUDIO),
            "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


# Gemma 4 is released in bf16 only (no FP8 / FP4 checkpoints from Google).
QUANT: dict[str, dict] = {}


def quant_scheme(key: str, quant: str) -> str | None:
    return None


def extra_tensors(config: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The original E2B/E4B releases also ship k_proj / v_proj / k_norm for the KV-shared layers,
    which no computation reads (transformers drops them at load; so does hwinfer)."""
    text = config["text_config"]
    n, shared = text["num_hidden_layers"], text.get("num_kv_shared_layers") or 0
    h, kv = text["hidden_size"], text["num_key_value_heads"]
    out = {}
    for i in range(n - shared, n):
        d = text["global_head_dim"] if text["layer_types"][i] == "full_attention" else text["head_dim"]
        stem = f"model.language_model.layers.{i}.self_attn"
        out[f"{stem}.k_proj.weight"] = torch.randn(kv * d, h, generator=gen) / h ** 0.5
        out[f"{stem}.v_proj.weight"] = torch.randn(kv * d, h, generator=gen) / h ** 0.5
        out[f"{stem}.k_norm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
    return out
