"""Tiny Qwen3.5 dense (VLM layout, as released: model_type qwen3_5 with a text_config)."""
from __future__ import annotations

from typing import Any

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, linear_num_key_heads=2, linear_key_head_dim=16,
                 linear_num_value_heads=4, linear_value_head_dim=16, intermediate_size=128),
    "small": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=64, linear_num_key_heads=4, linear_key_head_dim=32,
                  linear_num_value_heads=8, linear_value_head_dim=32, intermediate_size=512),
    # About 0.9 GB of fp32 weights: the load-time benchmark (scripts/bench_load.py).
    "bench": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=128, linear_num_key_heads=8, linear_key_head_dim=128,
                  linear_num_value_heads=16, linear_value_head_dim=64, intermediate_size=4096),
}


def text_config(size: str) -> dict[str, Any]:
    dims = SIZES[size]
    return {
        "model_type": "qwen3_5_text", "vocab_size": 512, "rms_norm_eps": 1e-6,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                            "mrope_interleaved": True},
        "attn_output_gate": True, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "max_position_embeddings": 4096, "tie_word_embeddings": True, **dims,
    }


def config(size: str) -> dict[str, Any]:
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": text_config(size), "tie_word_embeddings": True,
            "vision_config": {"depth": 1, "hidden_size": 32}, "torch_dtype": "bfloat16"}


QUANT = {"fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                 "weight_block_size": [128, 128]}}


def quant_scheme(key: str, quant: str) -> str | None:
    """Qwen3.5-FP8 releases: every projection e4m3 with fp32 ``weight_scale_inv`` blocks."""
    return "fp8_fp32" if quant == "fp8" and "mlp.gate.weight" not in key else None
