"""The engine: continuous batching, chunked prefill, preemption and abort never change a
request's tokens, and the pool is empty again afterwards (no leaked blocks or state slots)."""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.engine.pool import CacheBytes
from hwinfer.testing.checkpoints import write_checkpoint

ARCHS = ["qwen3_5", "deepseek_v4", "kimi_linear", "gemma4", "glm_moe_dsa", "minimax_m3"]


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    return load_model(write_checkpoint(request.param, tmp_path_factory.mktemp(request.param)), device="cpu")


def _prompts(model, n: int = 5) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    lengths = [3, 29, 11, 41, 17, 6, 23][:n]
    return [torch.randint(3, model.config["vocab_size"], (k,), generator=gen).tolist() for k in lengths]


def _alone(model, prompts, params) -> list[list[int]]:
    outs = []
    for p in prompts:
        engine = Engine(model, max_num_seqs=1, num_blocks=64)
        outs.append(engine.run([engine.add_request(p, params)])[0].token_ids)
        assert engine.pool.is_empty()
    return outs


GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def test_batched_continuous_and_chunked_equal_single_requests(model):
    prompts = _prompts(model)
    expected = _alone(model, prompts, GREEDY)
    # A small token budget forces chunked prefill mixed with decodes; requests arrive over time.
    engine = Engine(model, max_num_seqs=3, max_num_batched_tokens=12, num_blocks=64)
    reqs = [engine.add_request(p, GREEDY) for p in prompts[:2]]
    engine.step()
    engine.step()
    reqs += [engine.add_request(p, GREEDY) for p in prompts[2:]]
    outs = engine.run(reqs)
    assert [o.token_ids for o in outs] == expected
    assert engine.pool.is_empty()


def test_preemption_recomputes_without_changing_tokens(model):
    prompts = _prompts(model, 4)
    expected = _alone(model, prompts, GREEDY)
    bs = model.cache_block_size()
    # Room for barely two requests at full length: later requests must preempt earlier ones.
    blocks = 2 * -(-(max(map(len, prompts)) + GREEDY.max_tokens) // bs)
    engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=blocks)
    reqs = [engine.add_request(p, GREEDY) for p in prompts]
    outs = engine.run(reqs)
    assert [o.token_ids for o in outs] == expected
    assert engine.pool.is_empty()
    assert sum(r.num_preemptions for r in reqs) > 0, "the pool was large enough: nothing was preempted"


def test_seeded_sampling_is_batch_independent(model):
    prompts = _prompts(model, 3)
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.95, seed=123, ignore_eos=True)
    expected = _alone(model, prompts, params)
    engine = Engine(model, max_num_seqs=3, max_num_batched_tokens=16, num_blocks=64)
    outs = engine.run([engine.add_request(p, params) for p in prompts])
    assert [o.token_ids for o in outs] == expected


def test_abort_frees_everything_at_once(model):
    engine = Engine(model, max_num_seqs=2, num_blocks=64)
    a = engine.add_request(_prompts(model, 1)[0], SamplingParams(max_tokens=50, temperature=0))
    b = engine.add_request(_prompts(model, 2)[1], SamplingParams(max_tokens=50, temperature=0))
    c = engine.add_request([5, 6, 7], SamplingParams(max_tokens=50, temperature=0))  # waits: 2 slots
    engine.step()
    engine.step()
    assert engine.pool.used_slots == 2 and engine.pool.used_blocks > 0
    for r in (a, b, c):
        engine.abort(r.id)
    assert engine.pool.is_empty() and not engine.has_unfinished()
    assert engine.output(a).finish_reason == "abort"


def test_cache_bytes_are_declared(model):
    cost = CacheBytes.of(model)
    assert cost.per_token > 0 or cost.per_request > 0


def test_request_tokens_slices_prompt_and_output_without_all_ids():
    from hwinfer.engine.request import Request

    req = Request("r", list(range(10)), SamplingParams(max_tokens=8))
    req.output_ids = [100, 101, 102]
    for start in range(14):
        for stop in range(start, 15):
            assert req.tokens(start, stop) == req.all_ids[start:stop], (start, stop)
