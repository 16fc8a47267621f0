"""Tencent HY4 (hy_v4) against transformers 5.23.0 HYV4ForCausalLM (fp32, CPU, eager)."""
from __future__ import annotations

import pytest

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")

ARCH = "hy_v4"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp(ARCH)
    write_checkpoint(ARCH, path)
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = oracle.hf_load(path)
    return path, ours, hf, info


def test_published_layout_loads_in_both(pair):
    _, ours, hf, info = pair
    assert ours.layout_name == "published"
    assert ours.indexer_types == list(hf.config.indexer_types) == ["full", "full", "shared", "shared"]
    # transformers drops the MTP layer (model.mtp_layers.*) silently, as hwinfer does.
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert ours.load_report.ignored and all(k.startswith("model.mtp_layers.") for k in ours.load_report.ignored)


def test_logits_match_transformers(pair):
    _, ours, hf, _ = pair
    oracle.check_logits(ours, hf, oracle.random_ids(ours.config["vocab_size"], 2, 40))


def test_swiglu_limit_and_selection_matter(pair, tmp_path):
    """The clamp cuts (same weights without it differ) and index_topk 8 < 40 really selects."""
    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 40)
    got = ours(ids)
    for name, override in (("no clamp", {"swiglu_limit": 0.0}), ("all keys", {"index_topk": 64})):
        write_checkpoint(ARCH, tmp_path / name, overrides=override)
        assert oracle.rel_err(load_model(tmp_path / name, device=oracle.DEVICE, dtype=oracle.DTYPE)(ids), got) > 1e-2, name


def test_greedy_tokens_match_transformers(pair):
    _, ours, hf, _ = pair
    oracle.check_greedy(ours, hf, oracle.random_ids(ours.config["vocab_size"], 1, 11)[0].tolist())


def test_cached_decode_equals_full_recompute(pair):
    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()])


def test_chunked_prefill_equals_full_forward(pair):
    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 50, seed=7)
    oracle.check_chunked_prefill(ours, [ids[0, :37].tolist(), ids[1, :50].tolist()], [20, 9])


def test_transformers_save_pretrained_layout_loads(pair, tmp_path):
    """save_pretrained renames in reverse (hc_pre.hc_attn_layer.*, model.hc_pre.hc_head.*,
    linear_gate for every gate_proj): a layout of its own."""
    path, ours, hf, _ = pair
    oracle.check_hf_layout(ours, hf, path, tmp_path, oracle.random_ids(ours.config["vocab_size"], 1, 20))
    assert load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE).layout_name == "transformers save_pretrained"


def test_bf16_runs_and_tracks_fp32(pair):
    """bf16 weights and caches run (full forward and cached generation); before the indexer can
    drop keys (positions < index_topk) the logits stay near fp32. Later positions are not
    compared: bf16 rounding flips top-k picks (transformers' own bf16 run differs as much)."""
    path, ours, _, _ = pair
    low = load_model(path, device=oracle.DEVICE, dtype="bfloat16")
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 24)
    topk = ours.config["index_topk"]
    assert oracle.rel_err(low(ids)[:, :topk], ours(ids)[:, :topk]) < 0.1
    assert len(low.generate(ids[0].tolist(), max_new_tokens=4, temperature=0).token_ids) >= 1
