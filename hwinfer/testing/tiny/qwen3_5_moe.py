"""Tiny Qwen3.5-MoE (VLM layout, per-expert tensors)."""
from __future__ import annotations

from typing import Any

from hwinfer.testing.tiny import qwen3_5

QUANT = qwen3_5.QUANT
quant_scheme = qwen3_5.quant_scheme


def config(size: str) -> dict[str, Any]:
    text = qwen3_5.text_config(size)
    text.pop("intermediate_size")
    text.update(model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32 if size == "tiny" else 128,
                shared_expert_intermediate_size=32 if size == "tiny" else 128,
                tie_word_embeddings=False)
    return {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "text_config": text, "tie_word_embeddings": False,
            "vision_config": {"depth": 1, "hidden_size": 32}, "torch_dtype": "bfloat16"}
