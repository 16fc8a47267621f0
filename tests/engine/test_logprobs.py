"""Logprobs: asking for them never changes a request's tokens (plain and speculative decoding),
and the recorded values are the model's own log_softmax at each position."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen3_5", "deepseek_v4"])
def model(request, tmp_path_factory):
    return load_model(write_checkpoint(request.param, tmp_path_factory.mktemp(request.param)), device="cpu")


def _prompts(model) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, model.config["vocab_size"], (k,), generator=gen).tolist() for k in (4, 19, 33)]


def _run(model, params: SamplingParams, k: int = 0):
    engine = Engine(model, max_num_seqs=2, max_num_batched_tokens=24, num_blocks=96, num_speculative_tokens=k)
    return engine.run([engine.add_request(p, params) for p in _prompts(model)])


@pytest.mark.parametrize("base", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("k", [0, 2], ids=["plain", "spec"])
def test_logprobs_do_not_change_tokens(model, base, k):
    if k and getattr(model, "mtp", None) is None:
        pytest.skip("no MTP head")
    plain = _run(model, base, k)
    asked = _run(model, dataclasses.replace(base, logprobs=3), k)
    assert [o.token_ids for o in asked] == [o.token_ids for o in plain]
    assert all(o.logprobs is None for o in plain)
    for o in asked:
        assert [lp.token_id for lp in o.logprobs] == o.token_ids
        assert all(len(lp.top) == 3 for lp in o.logprobs)


@pytest.mark.parametrize("k", [0, 2], ids=["plain", "spec"])
def test_logprobs_match_the_full_forward(model, k):
    if k and getattr(model, "mtp", None) is None:
        pytest.skip("no MTP head")
    outs = _run(model, dataclasses.replace(GREEDY, logprobs=2), k)
    for prompt, out in zip(_prompts(model), outs):
        ids = torch.tensor(prompt + out.token_ids)
        ref = torch.log_softmax(model.forward(ids).float(), dim=-1)[len(prompt) - 1:-1]
        for pos, lp in enumerate(out.logprobs):
            assert lp.logprob == pytest.approx(float(ref[pos, lp.token_id]), abs=1e-4)
            assert lp.top[0][0] == lp.token_id  # greedy: the sampled token is the most likely
            assert lp.top[0][1] >= lp.top[1][1]
            assert lp.top[1][1] == pytest.approx(float(ref[pos].topk(2).values[1]), abs=1e-4)


def test_logprobs_zero_records_only_the_sampled_token(model):
    out = _run(model, dataclasses.replace(GREEDY, logprobs=0))[0]
    assert len(out.logprobs) == len(out.token_ids) and all(lp.top == [] for lp in out.logprobs)
    with pytest.raises(ValueError):
        SamplingParams(logprobs=21)
