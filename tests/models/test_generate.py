"""generate(): sampling options, seeds, stop strings, eos, batches; tokenizer and chat template."""
from __future__ import annotations

import pytest

from hwinfer import load_model
from hwinfer.testing.checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(write_checkpoint("qwen3_5", tmp_path_factory.mktemp("gen")), device="cpu")


def test_defaults_come_from_generation_config(model):
    d = model.generation_defaults
    assert d.temperature == 0.7 and d.top_p == 0.9 and d.top_k == 20
    assert model.tokenizer.token_id("<|im_end|>") in d.eos_token_ids


def test_seeded_sampling_is_reproducible_and_seeds_differ(model):
    a = model.generate("Hello", max_new_tokens=12, temperature=1.0, seed=5)
    b = model.generate("Hello", max_new_tokens=12, temperature=1.0, seed=5)
    others = {tuple(model.generate("Hello", max_new_tokens=12, temperature=1.0, seed=s).token_ids)
              for s in range(6, 12)}
    assert a.token_ids == b.token_ids and len(others) > 1


def test_greedy_ignores_seed(model):
    a = model.generate("The quick", max_new_tokens=10, temperature=0, seed=1)
    b = model.generate("The quick", max_new_tokens=10, temperature=0, seed=2)
    assert a.token_ids == b.token_ids and a.finish_reason in ("length", "stop")


def test_stop_string_cuts_the_text(model):
    full = model.generate("Numbers", max_new_tokens=12, temperature=0)
    assert len(full.text) > 2
    stop = full.text[2:4]
    out = model.generate("Numbers", max_new_tokens=12, temperature=0, stop=[stop])
    assert out.finish_reason == "stop" and stop not in out.text and full.text.startswith(out.text)


def test_eos_ends_generation(model):
    greedy = model.generate([7, 8, 9], max_new_tokens=6, temperature=0).token_ids
    saved = model.generation_defaults
    model.generation_defaults = type(saved)(eos_token_ids=(greedy[2],))
    try:
        out = model.generate([7, 8, 9], max_new_tokens=6, temperature=0)
    finally:
        model.generation_defaults = saved
    assert out.finish_reason == "stop" and out.token_ids == greedy[:2]


def test_batch_of_strings_equals_one_by_one(model):
    prompts = ["Hello there", "What is the capital", "def add(a, b):"]
    batch = model.generate(prompts, max_new_tokens=8, temperature=0)
    single = [model.generate(p, max_new_tokens=8, temperature=0) for p in prompts]
    assert [b.token_ids for b in batch] == [s.token_ids for s in single]


def test_tokenizer_round_trip_and_chat_template(model):
    tok = model.tokenizer
    text = "Hello! How are you today?"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert model.generate(prompt, max_new_tokens=4, temperature=0).finish_reason in ("length", "stop")
