"""Qwen3.5 dense and MoE against transformers 5.23.0 (fp32, CPU)."""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")

ARCHS = ["qwen3_5", "qwen3_5_moe"]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_checkpoint(request.param, path)
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = oracle.hf_load(path)
    return request.param, path, ours, hf, info


def test_published_layout_loads_in_both(pair):
    arch, _, ours, _, info = pair
    assert ours.layout_name.startswith("published")
    assert not info["missing_keys"], info["missing_keys"]
    # transformers drops the MTP head (it has no implementation): that is its only difference.
    assert all(k.startswith("mtp.") for k in info["unexpected_keys"]), info["unexpected_keys"]


def test_logits_match_transformers(pair):
    _, _, ours, hf, _ = pair
    oracle.check_logits(ours, hf, oracle.random_ids(ours.config["vocab_size"], 2, 40))


def test_greedy_tokens_match_transformers(pair):
    _, _, ours, hf, _ = pair
    oracle.check_greedy(ours, hf, oracle.random_ids(ours.config["vocab_size"], 1, 11)[0].tolist())


def test_cached_decode_equals_full_recompute(pair):
    _, _, ours, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()])


def test_transformers_save_pretrained_layout_loads(pair, tmp_path):
    _, path, ours, hf, _ = pair
    oracle.check_hf_layout(ours, hf, path, tmp_path, oracle.random_ids(ours.config["vocab_size"], 1, 20))


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_checkpoint_matches_transformers(arch, tmp_path):
    oracle.require_pinned_transformers("FP8 checkpoints on the CPU")
    write_checkpoint(arch, tmp_path, quant="fp8", shards=3)
    ours = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    assert ours.load_report.dequantized > 0
    hf, _ = oracle.hf_load(tmp_path, "Qwen3_5ForConditionalGeneration" if arch == "qwen3_5"
                           else "Qwen3_5MoeForConditionalGeneration")
    ids = oracle.random_ids(ours.config["vocab_size"], 1, 16)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    assert oracle.rel_err(ours(ids), ref) <= oracle.LOGIT_RTOL
