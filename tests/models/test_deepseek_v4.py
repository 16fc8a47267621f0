"""DeepSeek-V4 against transformers 5.23.0 (fp32, CPU, eager attention).

The tiny config (hwinfer/testing/tiny/deepseek_v4.py) has sliding / CSA (m 4, indexer top-3) /
HCA (m 8) / CSA layers with an 8-token window, 2 hash-routed layers and an MTP block, so the
~40-70 token sequences here complete many windows and make the indexer choose.
"""
from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch

from hwinfer import load_model
from hwinfer.loader.config import load_config
from hwinfer.models.deepseek_v4 import attention_kinds, hash_layers, ropes
from hwinfer.runtime.batch import ForwardBatch
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")

FLASH = {"num_hidden_layers": 43, "num_nextn_predict_layers": 1, "num_hash_layers": 3, "head_dim": 512,
         "qk_rope_head_dim": 64, "rope_theta": 10000, "compress_rope_theta": 160000,
         "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                          "original_max_position_embeddings": 65536, "type": "yarn"},
         "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0]}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = write_checkpoint("deepseek_v4", tmp_path_factory.mktemp("deepseek_v4"))
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = oracle.hf_load(path)
    return path, ours, hf, info


def test_config_fields_published_and_transformers():
    kinds = attention_kinds(FLASH)
    assert kinds[:4] == [(0, False), (0, False), (4, True), (128, False)] and len(kinds) == 44
    assert kinds[42] == (4, True) and kinds[43] == (0, False)  # last entry: the MTP block
    assert hash_layers(FLASH) == [True] * 3 + [False] * 40
    r = ropes(FLASH)
    assert (r["main"].dim, r["main"].base, r["main"].scaling) == (64, 10000.0, None)
    assert r["compress"].base == 160000.0 and r["compress"].scaling["attention_factor"] == 1.0
    hf_style = {"num_hidden_layers": 3, "head_dim": 512, "partial_rotary_factor": 0.125,
                "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
                "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 64},
                "mlp_layer_types": ["hash_moe", "moe", "moe"],
                "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4},
                                    "compress": {"rope_type": "yarn", "rope_theta": 1.6e5, "factor": 16,
                                                 "original_max_position_embeddings": 65536, "beta_fast": 32,
                                                 "beta_slow": 1, "attention_factor": 1.0}}}
    assert attention_kinds(hf_style) == [(0, False), (4, True), (64, False)]
    assert hash_layers(hf_style) == [True, False, False]
    assert ropes(hf_style)["compress"] == ropes(FLASH)["compress"]


def test_published_layout_loads_in_both(pair):
    _, ours, _, info = pair
    assert ours.layout_name == "published" and ours.mtp is not None
    assert ours.load_report.loaded > 0 and not ours.load_report.ignored
    # transformers drops mtp.* through _keys_to_ignore_on_load_unexpected: not even "unexpected".
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float(ours.mtp[0].e_proj.weight.abs().sum()) > 0


def test_cache_declarations(pair):
    _, ours, _, _ = pair
    specs = [{s.name: s for s in layer} for layer in ours.cache_specs()]
    assert set(specs[0]) == {"swa"} and specs[0]["swa"].per == "ring" and specs[0]["swa"].rows == 8
    csa, hca = specs[1], specs[2]
    assert (csa["comp"].per, csa["comp"].ratio, csa["comp"].shape) == ("token", 4, (64,))
    assert (csa["comp_kv"].rows, csa["comp_kv"].shape, csa["comp_kv"].dtype) == (8, (128,), torch.float32)
    assert (csa["idx"].ratio, csa["idx"].shape, csa["idx_score"].rows) == (4, (32,), 8)
    assert (hca["comp"].ratio, hca["comp_kv"].rows, hca["comp_kv"].shape) == (8, 8, (64,)) and "idx" not in hca
    assert ours.cache_block_size() == 16


def test_logits_match_transformers(pair):
    _, ours, hf, _ = pair
    oracle.check_logits(ours, hf, oracle.random_ids(512, 2, 44))


def test_greedy_tokens_match_transformers(pair):
    _, ours, hf, _ = pair
    oracle.check_greedy(ours, hf, oracle.random_ids(512, 1, 11)[0].tolist(), steps=24)


def test_cached_decode_equals_full_recompute(pair):
    _, ours, _, _ = pair
    ids = oracle.random_ids(512, 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()],
                                    steps=14)


def _run_schedule(model, seqs: list[list[int]], plan: list[list[int]]) -> list[torch.Tensor]:
    """Feed each request its tokens in the planned chunks (0 = idle that step); logits per request."""
    n = len(seqs)
    cache, alloc = model.new_cache(n, max(map(len, seqs)))
    table, slots = alloc.block_table(model.device), torch.arange(n, device=model.device)
    done, out = [0] * n, [[] for _ in range(n)]
    for counts in plan:
        act = [i for i in range(n) if counts[i]]
        ids = torch.tensor([t for i in act for t in seqs[i][done[i]:done[i] + counts[i]]], device=model.device)
        batch = ForwardBatch.step(ids, [counts[i] for i in act], [done[i] for i in act], cache, slots[act],
                                  table[act])
        logits = model.logits(model.forward_batch(batch)).split([counts[i] for i in act])
        for i, lg in zip(act, logits):
            out[i].append(lg)
            done[i] += counts[i]
    assert done == list(map(len, seqs))
    return [torch.cat(o) for o in out]


def test_chunked_prefill_and_decode_logits_equal_full(pair):
    """Prefill, then a mixed step (chunks after a prefix + a decode), then batched decode:
    every position's logits equal the full forward's (no prefix is ever recomputed)."""
    _, ours, _, _ = pair
    ids = oracle.random_ids(512, 3, 52, seed=5)
    seqs = [ids[0, :45].tolist(), ids[1, :40].tolist(), ids[2].tolist()]
    plan = [[13, 29, 20], [9, 1, 17]]
    left = [len(s) - sum(p[i] for p in plan) for i, s in enumerate(seqs)]
    plan += [[int(k < left[i]) for i in range(3)] for k in range(max(left))]
    for seq, got in zip(seqs, _run_schedule(ours, seqs, plan)):
        assert oracle.rel_err(got, ours(torch.tensor(seq))) <= oracle.LOGIT_RTOL


@contextmanager
def _spy(ops, names):
    calls, saved = [], {n: getattr(ops, n) for n in names}

    def wrap(name, fn):
        def call(*args, **kwargs):
            calls.append((name, args[0].shape[0]))
            return fn(*args, **kwargs)
        return call
    for name, fn in saved.items():
        setattr(ops, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)


def test_decode_touches_only_the_new_token(pair):
    """A decode step runs the step ops on one row per request: no prefix recompute."""
    _, ours, _, _ = pair
    seqs = oracle.random_ids(512, 2, 30, seed=7).tolist()
    names = ["kv_compress", "kv_compress_step", "sparse_mla_prefill", "sparse_mla_decode", "lightning_indexer"]
    cache, alloc = ours.new_cache(2, 31)
    table, slots = alloc.block_table(ours.device), torch.arange(2, device=ours.device)
    on = {"device": ours.device}
    ours.forward_batch(ForwardBatch.step(torch.tensor(seqs[0] + seqs[1], **on), [30, 30], [0, 0], cache, slots, table))
    with _spy(ours.ops, names) as calls:
        ours.forward_batch(ForwardBatch.step(torch.tensor([5, 6], **on), [1, 1], [30, 30], cache, slots, table))
    used = {name for name, _ in calls}
    assert used == {"kv_compress_step", "sparse_mla_decode", "lightning_indexer"}
    assert all(rows == 2 for _, rows in calls)
    assert sum(name == "sparse_mla_decode" for name, _ in calls) == len(ours.layers)


def test_transformers_save_pretrained_layout_loads(pair, tmp_path):
    path, ours, hf, _ = pair
    oracle.check_hf_layout(ours, hf, path, tmp_path, oracle.random_ids(512, 1, 20))
    again = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    assert again.layout_name.startswith("transformers") and again.mtp is None
    assert load_config(tmp_path).get("layer_types") and "compress_ratios" not in json.loads(
        (tmp_path / "config.json").read_text())


def test_fp8_fp4_checkpoint_as_released_matches_transformers(pair, tmp_path):
    oracle.require_pinned_transformers("FP8 checkpoints on the CPU")
    _, fp32_model, _, _ = pair
    write_checkpoint("deepseek_v4", tmp_path, quant="fp8", shards=3)
    ours = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    # FP8: 5 attention projections x 4 layers + 2 indexers + 3 shared x 4 + MTP (5 + 3 + 2);
    # FP4: 3 x 8 experts x 5 MoE blocks.
    assert ours.load_report.dequantized == 20 + 2 + 12 + 10 + 120
    hf, info = oracle.hf_load(tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = oracle.random_ids(512, 2, 40)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    assert oracle.rel_err(ours(ids), ref) <= oracle.LOGIT_RTOL
    assert oracle.rel_err(ours(ids), fp32_model(ids)) > 1e-3  # the weights really were quantized
