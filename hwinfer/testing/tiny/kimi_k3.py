"""Tiny Kimi-K3 (published config.json layout: model_type kimi_k3 with a kimi_linear text_config).

Field names and values as in the released moonshotai/Kimi-K3 config.json (as quoted by public
ports), shrunk: 5 layers (KDA, KDA, MLA, KDA, MLA; 1-indexed ``linear_attn_config``), dense
layer 0, latent MoE after (8 experts, top-2, 2 shared experts, latent 32), SiTU-GLU, gated
MLA with low-rank queries, lower-bounded full-rank-gated KDA, attention residuals with
``attn_res_block_size`` 2 (block starts at layers 0, 2, 4: the final mix sees 4 candidates).
MXFP4 (``QUANT["mxfp4"]``): the routed experts only, as in the release.
"""
from __future__ import annotations

from typing import Any

import torch

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, routed_expert_hidden_size=32,
                 num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                 qk_rope_head_dim=8, v_head_dim=16, linear_heads=4, linear_head_dim=16),
    "small": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, routed_expert_hidden_size=128,
                  num_attention_heads=8, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32,
                  qk_rope_head_dim=16, v_head_dim=32, linear_heads=8, linear_head_dim=32),
}


def text_config(size: str) -> dict[str, Any]:
    dims = dict(SIZES[size])
    heads, head_dim = dims.pop("linear_heads"), dims.pop("linear_head_dim")
    return {
        "model_type": "kimi_linear", "vocab_size": 512, "num_hidden_layers": 5,
        "num_key_value_heads": dims["num_attention_heads"], "mla_use_nope": True, "mla_use_output_gate": True,
        "linear_attn_config": {"full_attn_layers": [3, 5], "kda_layers": [1, 2, 4], "head_dim": head_dim,
                               "num_heads": heads, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                               "use_full_rank_gate": True},
        "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 2, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "latent_moe_use_norm": True, "hidden_act": "situ", "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0, "attn_res_block_size": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1048576, "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
        "bos_token_id": 1, "pad_token_id": 0, **dims,
    }


def config(size: str) -> dict[str, Any]:
    return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
            "text_config": text_config(size), "tie_word_embeddings": False, "bos_token_id": 1,
            "pad_token_id": 0, "vision_config": {"patch_size": 14, "vt_hidden_size": 32},
            "torch_dtype": "bfloat16"}


# The release's quantization_config (compressed-tensors); the routed experts are the only
# tensors stored packed. The ignore list is abbreviated: hwinfer decides per tensor from the
# presence of weight_packed / weight_scale, not from this list.
QUANT = {"mxfp4": {
    "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
    "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                  "input_activations": None,
                                  "weights": {"num_bits": 4, "group_size": 32, "type": "float"}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
               "re:.*routed_expert_(down|up)_proj.*", "re:.*block_sparse_moe\\.gate$"],
}}


def quant_scheme(key: str, quant: str) -> str | None:
    """Kimi-K3 MXFP4 release: routed experts' w1/w3/w2 only."""
    return "mxfp4_ct" if quant == "mxfp4" and ".block_sparse_moe.experts." in key else None


def extra_tensors(config: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Stand-ins for the vision tower and projector of the VLM release (Kimi-K2.5-style names,
    not verified for K3): hwinfer must skip them."""
    return {"vision_tower.encoder.blocks.0.norm0.weight": torch.ones(32),
            "mm_projector.pre_norm.weight": torch.ones(32)}


def init(model: torch.nn.Module, gen: torch.Generator) -> None:
    """A_log holds one value per head in its first h entries; the release pads the rest with 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("self_attn.A_log"):
                heads = model.args.lin_heads
                p[heads:] = 0.0
