"""Tiny MiniMax-M3 (VLM layout as released: model_type minimax_m3_vl with a text_config using the
published field names). Layer 0 is full attention with a dense MLP, the others block-sparse with
MoE, as in the release's leading dense layers. The indexer's key blocks are 8 tokens and 3 are
kept, so sequences of 40+ tokens have more blocks than the selection and it really selects."""
from __future__ import annotations

from typing import Any

SIZES = {
    "tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, rotary_dim=16,
                 intermediate_size=32, shared_intermediate_size=32, dense_intermediate_size=128,
                 index_dim=32),
    "small": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=64, rotary_dim=32,
                  intermediate_size=128, shared_intermediate_size=128, dense_intermediate_size=512,
                  index_dim=64),
}
SPARSE_FREQ = [0, 1, 1, 1]
MOE_FREQ = [0, 1, 1, 1]


def text_config(size: str) -> dict[str, Any]:
    dims = dict(SIZES[size])
    index_dim = dims.pop("index_dim")
    n = len(SPARSE_FREQ)
    return {
        "model_type": "minimax_m3_vl_text", "vocab_size": 512, "num_hidden_layers": n,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "use_gemma_norm": True,
        "attention_output_gate": False, "rope_theta": 5000000, "partial_rotary_factor":
        dims["rotary_dim"] / dims["head_dim"], "hidden_act": "swigluoai", "use_qk_norm": True,
        "qk_norm_type": "per_head", "tie_word_embeddings": False, "num_local_experts": 8,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "scoring_func": "sigmoid", "use_routing_bias": True,
        "moe_layer_freq": list(MOE_FREQ), "num_mtp_modules": 1, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
        "routed_scaling_factor": 2.0, "bos_token_id": 1, "eos_token_id": 2,  # ids inside the tiny vocab
        "sparse_attention_config": {
            "use_sparse_attention": True, "sparse_index_dim": index_dim,
            "sparse_num_index_heads": dims["num_key_value_heads"], "sparse_topk_blocks": 3,
            "sparse_block_size": 8, "sparse_init_block": 0, "sparse_local_block": 1, "sparse_score_type": "max",
            "sparse_disable_index_value": list(SPARSE_FREQ), "sparse_attention_freq": list(SPARSE_FREQ)},
        **dims,
    }


# The vision tower is present in the release; hwinfer ignores it (tests add its tensors).
VISION = {"model_type": "minimax_m3_vl_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 2, "patch_size": 4, "image_size": 32, "spatial_merge_size": 2,
          "temporal_patch_size": 2}


def config(size: str) -> dict[str, Any]:
    return {"model_type": "minimax_m3_vl", "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
            "text_config": text_config(size), "vision_config": dict(VISION), "projector_hidden_size": 64,
            "image_token_index": 200025, "video_token_index": 200026, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


# DeepSeek-V3-style block FP8; MiniMax names the skip list ``ignored_layers``.
QUANT = {"fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                 "weight_block_size": [128, 128],
                 "ignored_layers": ["lm_head", "model.embed_tokens", "block_sparse_moe.gate", "vision_tower",
                                    "multi_modal_projector", "patch_merge_mlp"]}}


def quant_scheme(key: str, quant: str) -> str | None:
    """Every linear of the language model is e4m3 with fp32 128x128 ``weight_scale_inv`` except
    the router (``block_sparse_moe.gate``), which the loader never offers for quantization."""
    return "fp8_fp32" if quant == "fp8" else None

