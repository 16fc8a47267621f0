"""MiniMax-M3 text (full + block-sparse attention, SwiGLU-OAI MoE) against transformers 5.23.0
(fp32, CPU).

The published VLM checkpoint (``language_model.*``, per-expert ``block_sparse_moe`` tensors,
``index_*`` projections) is checked against MiniMaxM3SparseForConditionalGeneration, the class that
applies the renames of conversion_mapping.py; MiniMaxM3VLForCausalLM (model_type
minimax_m3_vl_text) has no renames and is checked on its own save layout. The tiny indexer keeps 3
blocks of 8 keys, so 40-token sequences (5 blocks) really select.
"""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")

VLM = "MiniMaxM3SparseForConditionalGeneration"
KEEP = ("language_model.",)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("minimax_m3")
    write_checkpoint("minimax_m3", path)
    towers = oracle.add_hf_towers(path, VLM, keep=KEEP)
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = oracle.hf_load(path, VLM)
    return path, ours, hf, info, towers


def test_published_layout_loads_in_both(pair):
    _, ours, _, info, towers = pair
    assert ours.layout_name == "published"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert towers and set(ours.load_report.ignored) == set(towers)
    assert all(k.startswith(("vision_tower.", "multi_modal_projector.", "patch_merge_mlp.")) for k in towers)


def test_logits_match_transformers(pair):
    _, ours, hf, _, _ = pair
    oracle.check_logits(ours, hf, oracle.random_ids(ours.config["vocab_size"], 2, 40))


def test_block_selection_is_sparse(pair):
    """With every block kept the logits change: the 3-of-5 block selection is doing something."""
    _, ours, _, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 40)
    sparse = ours(ids)
    attns = [layer.self_attn for layer in ours.layers if layer.self_attn.indexer is not None]
    assert attns and all(40 > a.block_size * a.topk_blocks for a in attns)
    saved = [a.topk_blocks for a in attns]
    try:
        for a in attns:
            a.topk_blocks = 40
        dense = ours(ids)
    finally:
        for a, k in zip(attns, saved):
            a.topk_blocks = k
    assert oracle.rel_err(sparse, dense) > 1e-3


def test_greedy_tokens_match_transformers(pair):
    _, ours, hf, _, _ = pair
    oracle.check_greedy(ours, hf, oracle.random_ids(ours.config["vocab_size"], 1, 30)[0].tolist())


def test_cached_decode_equals_full_recompute(pair):
    _, ours, _, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()])


def test_chunked_prefill_equals_full(pair):
    _, ours, _, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 45, seed=5)
    oracle.check_chunked_prefill(ours, [ids[0].tolist(), ids[1, :30].tolist()], first=[19, 7])


def test_transformers_save_pretrained_layout_loads(pair, tmp_path):
    oracle.require_pinned_transformers("its MiniMax-M3 names the dense first layer's MLP differently")
    path, ours, hf, _, _ = pair
    oracle.check_hf_layout(ours, hf, path, tmp_path, oracle.random_ids(ours.config["vocab_size"], 1, 20))


def test_text_class_layout_matches_minimax_m3_vl_for_causal_lm(pair, tmp_path):
    """MiniMaxM3VLForCausalLM's save (model_type minimax_m3_vl_text, fused gate_up_proj tensors,
    ``mlp.gate.*``, ``self_attn.indexer.*``)."""
    _, ours, hf, _, _ = pair
    transformers = __import__("transformers")
    text = transformers.MiniMaxM3VLForCausalLM(hf.config.text_config)
    state = {f"model.{k}": v for k, v in hf.model.language_model.state_dict().items()}
    state["lm_head.weight"] = hf.lm_head.weight
    text.load_state_dict(state, strict=True)
    text.save_pretrained(str(tmp_path))
    again = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    assert again.layout_name.startswith("text-only")
    ref, info = oracle.hf_load(tmp_path, "MiniMaxM3VLForCausalLM")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 40, seed=7)
    oracle.check_logits(again, ref, ids)
    assert oracle.rel_err(again(ids), ours(ids)) <= oracle.LOGIT_RTOL


def test_fp8_checkpoint_matches_transformers(tmp_path):
    oracle.require_pinned_transformers("FP8 checkpoints on the CPU")
    write_checkpoint("minimax_m3", tmp_path, quant="fp8", shards=3)
    oracle.add_hf_towers(tmp_path, VLM, keep=KEEP)
    ours = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    assert ours.load_report.dequantized > 0
    hf, info = oracle.hf_load(tmp_path, VLM)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 40)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    assert oracle.rel_err(ours(ids), ref) <= oracle.LOGIT_RTOL
