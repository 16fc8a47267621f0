"""Kimi-Linear against transformers 5.23.0 ``KimiLinearForCausalLM`` (fp32, CPU)."""
from __future__ import annotations

import inspect
import sys

import pytest
import torch

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")


def hf_load(path):
    """oracle.hf_load, plus transformers' recurrent KDA (decode path): its name has none of the
    prefixes oracle.force_torch_paths unwraps, so it would stay bound to fla's Triton kernel."""
    hf, info = oracle.hf_load(path)
    module = sys.modules[type(hf).__module__]
    module.recurrent_kimi_delta_attention = inspect.unwrap(module.recurrent_kimi_delta_attention)
    return hf, info


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = write_checkpoint("kimi_linear", tmp_path_factory.mktemp("kimi_linear"))
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = hf_load(path)
    return path, ours, hf, info


def test_published_layout_loads_in_both(pair):
    _, ours, _, info = pair
    assert ours.layout_name == "published"
    assert ours.args.layer_types == ["linear_attention", "linear_attention", "full_attention",
                                     "linear_attention", "full_attention"]
    assert ours.args.mlp_types == ["dense"] + ["sparse"] * 4
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info


def test_logits_match_transformers(pair):
    # 70 tokens: the KDA prefill crosses its 64-token chunk boundary.
    _, ours, hf, _ = pair
    oracle.check_logits(ours, hf, oracle.random_ids(ours.config["vocab_size"], 2, 70))


def test_greedy_tokens_match_transformers(pair):
    _, ours, hf, _ = pair
    oracle.check_greedy(ours, hf, oracle.random_ids(ours.config["vocab_size"], 1, 11)[0].tolist())


def test_cached_decode_equals_full_recompute(pair):
    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()])


def test_chunked_prefill_equals_one_prefill(pair):
    """Prefill in two pieces (KDA state + conv state carried, MLA over the cached latent rows in
    absorbed form) gives the logits of a single prefill."""
    from hwinfer.runtime.batch import ForwardBatch

    _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 90, seed=7)[0].to(ours.device)
    full = ours(ids)
    cache, alloc = ours.new_cache(1, 96)
    table, slots = alloc.block_table(ours.device), torch.arange(1, device=ours.device)
    first = ForwardBatch.step(ids[:37], [37], [0], cache, slots, table)
    ours.forward_batch(first)
    second = ForwardBatch.step(ids[37:], [53], [37], cache, slots, table)
    got = ours.logits(ours.forward_batch(second))
    assert oracle.rel_err(got, full[37:]) <= oracle.LOGIT_RTOL


def test_transformers_save_pretrained_layout_loads(pair, tmp_path):
    path, ours, hf, _ = pair
    oracle.check_hf_layout(ours, hf, path, tmp_path, oracle.random_ids(ours.config["vocab_size"], 1, 20))
    again = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    assert again.layout_name == "transformers save_pretrained"
