"""DeepSeek-V3.2 (model_type ``deepseek_v32``, deepseek-ai/DeepSeek-V3.2): GLM-5's structure.

transformers builds GLM-5 (``glm_moe_dsa``) from DeepSeek-V3.2's pieces, so the published V3.2
config.json and checkpoint map field for field and tensor for tensor onto
:class:`~hwinfer.models.glm5.GlmMoeDsaForCausalLM`: MLA (q_lora 1536, kv_lora 512, nope 128,
rope 64, v 128) with a DSA lightning indexer on every layer (no shared selections: V3.2 has no
``index_topk_pattern``), three dense layers, then a sigmoid noaux MoE with group-limited routing
(``n_group`` 8, ``topk_group`` 4), MTP layer 61 stored as ``model.layers.61.*`` (not used).

The one difference in the math: V3.2's indexer applies RoPE to its first ``qk_rope_head_dim``
channels in the half-split (rotate-half) form, where GLM-5 pairs channels (2i, 2i+1); the main
attention is interleaved in both (transformers ``DeepseekV32Indexer`` vs ``GlmMoeDsaIndexer``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from hwinfer.backend.select import OpTable
from hwinfer.models.glm5 import DEFAULTS, GlmMoeDsaForCausalLM, with_defaults

# transformers' DeepseekV32Config defaults where they differ from GLM-5's.
V32_DEFAULTS: dict[str, Any] = {**DEFAULTS, "n_group": 8, "topk_group": 4, "rms_norm_eps": 1e-6}


class DeepseekV32ForCausalLM(GlmMoeDsaForCausalLM):
    """GLM-5's model with V3.2's defaults and a half-split RoPE in every indexer."""

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__(with_defaults(config, V32_DEFAULTS), ops, dtype)
        for layer in self.layers:
            indexer = layer.self_attn.indexer
            if indexer is not None:
                indexer.c = replace(indexer.c, rope_interleaved=False)
