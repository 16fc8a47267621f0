"""Gemma 4 dense (E2B-like: PLE, KV-shared layers, double-wide MLP) and MoE (26B-A4B-like:
attention_k_eq_v, parallel MoE) against transformers 5.23.0 (fp32, CPU).

The published VLM checkpoint is checked against Gemma4ForConditionalGeneration (what
AutoModelForCausalLM gives for a gemma4 config); Gemma4ForCausalLM does not read the
``model.language_model.*`` names, so it is checked on its own text layout. Gemma 4 has no
quantized release (bf16 only), so there is no quantized-checkpoint check.
"""
from __future__ import annotations

import pytest

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint
from tests.models import oracle

pytest.importorskip("transformers")

ARCHS = ["gemma4", "gemma4_moe"]
VLM = "Gemma4ForConditionalGeneration"


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_checkpoint(request.param, path)
    towers = oracle.add_hf_towers(path, VLM, keep=("model.language_model.", "lm_head."))
    ours = load_model(path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    hf, info = oracle.hf_load(path, VLM)
    return request.param, path, ours, hf, info, towers


def test_published_layout_loads_in_both(pair):
    arch, _, ours, _, info, towers = pair
    assert ours.layout_name == "published"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    # hwinfer ignores the towers and, for the E2B-like release, the unused K/V weights of the
    # KV-shared layers (transformers drops those too).
    ignored = set(ours.load_report.ignored)
    assert set(towers) <= ignored
    unused_kv = ignored - set(towers)
    shared = [i for i, s in enumerate(ours.specs) if s.kv_source is not None]
    assert {int(k.split(".")[3]) for k in unused_kv} == set(shared)
    assert len(unused_kv) == 3 * len(shared)


def test_only_kv_owners_have_a_cache(pair):
    _, _, ours, _, _, _ = pair
    for spec, cache in zip(ours.specs, ours.cache_specs()):
        assert bool(cache) == (spec.kv_source is None)


def test_logits_match_transformers(pair):
    _, _, ours, hf, _, _ = pair
    # 40 tokens against a sliding window of 8: the window slides.
    oracle.check_logits(ours, hf, oracle.random_ids(ours.config["vocab_size"], 2, 40))


def test_greedy_tokens_match_transformers(pair):
    _, _, ours, hf, _, _ = pair
    oracle.check_greedy(ours, hf, oracle.random_ids(ours.config["vocab_size"], 1, 11)[0].tolist())


def test_cached_decode_equals_full_recompute(pair):
    _, _, ours, _, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 3, 70, seed=3)
    oracle.check_cached_equals_full(ours, [ids[0, :5].tolist(), ids[1, :70].tolist(), ids[2, :33].tolist()])


def test_chunked_prefill_equals_full(pair):
    _, _, ours, _, _, _ = pair
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 45, seed=5)
    oracle.check_chunked_prefill(ours, [ids[0].tolist(), ids[1, :30].tolist()], first=[19, 7])


def test_transformers_save_pretrained_layout_loads(pair, tmp_path):
    _, path, ours, hf, _, _ = pair
    oracle.check_hf_layout(ours, hf, path, tmp_path, oracle.random_ids(ours.config["vocab_size"], 1, 20))


def test_text_class_layout_matches_gemma4_for_causal_lm(pair, tmp_path):
    """Gemma4ForCausalLM's save (model_type gemma4_text, ``model.*``, per_layer_config)."""
    _, _, ours, hf, _, _ = pair
    transformers = __import__("transformers")
    text = transformers.Gemma4ForCausalLM(hf.config.text_config)
    state = {f"model.{k}": v for k, v in hf.model.language_model.state_dict().items()}
    missing, unexpected = text.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    text.tie_weights()
    text.save_pretrained(str(tmp_path))
    again = load_model(tmp_path, device=oracle.DEVICE, dtype=oracle.DTYPE)
    assert again.layout_name.startswith("text-only")
    ref, info = oracle.hf_load(tmp_path, "Gemma4ForCausalLM")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = oracle.random_ids(ours.config["vocab_size"], 2, 40, seed=7)
    oracle.check_logits(again, ref, ids)
    assert oracle.rel_err(again(ids), ours(ids)) <= oracle.LOGIT_RTOL
