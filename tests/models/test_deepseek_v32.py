"""DeepSeek-V3.2 (deepseek_v32, GLM-5's class with a half-split indexer RoPE) against
transformers 5.23.0 DeepseekV32ForCausalLM (fp32, CPU), on the tiny GLM-5 checkpoint with V3.2's
model_type and every layer running its own indexer (V3.2 has no shared selections)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")

V32 = {"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"], "index_topk_freq": 1}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek_v32")
    write_checkpoint("glm_moe_dsa", path, overrides=V32)
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = oracle.hf_load(path)
    return path, ours, hf, info


def test_loads_as_deepseek_v32(pair):
    _, ours, hf, info = pair
    assert type(ours).__name__ == type(hf).__name__ == "DeepseekV32ForCausalLM"
    assert ours.indexer_types == ["full"] * 4
    assert not info["missing_keys"], info["missing_keys"]
    assert all(not layer.self_attn.indexer.c.rope_interleaved for layer in ours.layers)
    assert all(layer.self_attn.c.rope_interleaved for layer in ours.layers)


def test_logits_match_transformers(pair):
    _, ours, hf, _ = pair
    oracle.check_logits(ours, hf, oracle.random_ids(ours.config["vocab_size"], 2, 40))


def test_indexer_rope_form_matters(pair):
    """The same weights through GLM-5's interleaved indexer RoPE select other keys."""
    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 40, seed=2)
    half_split = ours(ids)
    indexers = [layer.self_attn.indexer for layer in ours.layers]
    try:
        for indexer in indexers:
            indexer.c = replace(indexer.c, rope_interleaved=True)
        interleaved = ours(ids)
    finally:
        for indexer in indexers:
            indexer.c = replace(indexer.c, rope_interleaved=False)
    assert oracle.rel_err(interleaved, half_split) > 1e-3


def test_cached_decode_equals_full_recompute(pair):
    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 45, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :9].tolist(), ids[1, :45].tolist()])
