"""Prefix caching: identical outputs with and without it, real hits on a shared-prefix workload
(aligned to compression blocks and state checkpoints), and nothing leaked afterwards."""
from __future__ import annotations

import pytest
import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint

ARCHS = ["qwen3_5", "deepseek_v4", "kimi_linear", "gemma4", "glm_moe_dsa", "minimax_m3"]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    return load_model(write_checkpoint(request.param, tmp_path_factory.mktemp(request.param)), device="cpu")


def _workload(model) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    vocab = model.config["vocab_size"]
    shared = torch.randint(3, vocab, (53,), generator=gen).tolist()
    return [shared + torch.randint(3, vocab, (k,), generator=gen).tolist() for k in (4, 19, 1, 30)]


def _run(model, prompts, **kw):
    engine = Engine(model, max_num_seqs=3, max_num_batched_tokens=24, num_blocks=96, **kw)
    first = engine.run([engine.add_request(prompts[0], GREEDY)])
    rest = engine.run([engine.add_request(p, GREEDY) for p in prompts[1:]])
    return engine, [o.token_ids for o in first + rest]


def test_prefix_cache_on_equals_off_and_hits(model):
    prompts = _workload(model)
    _, expected = _run(model, prompts)
    engine, got = _run(model, prompts, enable_prefix_caching=True, prefix_chunk_tokens=16,
                       prefix_checkpoints=8)
    assert got == expected
    stats = engine.prefix.stats
    # Requests 2..4 share 53 prompt tokens: 48 (three 16-token chunks) are reusable for each.
    assert stats.hit_tokens >= 3 * 48, f"hit {stats.hit_tokens} of {stats.query_tokens} tokens"
    assert engine.pool.used_slots == 0
    engine.prefix.clear()
    assert engine.pool.is_empty() and len(engine.pool.free_checkpoints) == (8 if engine.pool.has_state else 0)


def test_eviction_under_memory_pressure_keeps_outputs(model):
    prompts = _workload(model)
    _, expected = _run(model, prompts)
    bs = model.cache_block_size()
    blocks = 3 * -(-(max(map(len, prompts)) + GREEDY.max_tokens) // bs)
    engine = Engine(model, max_num_seqs=3, max_num_batched_tokens=24, num_blocks=blocks,
                    enable_prefix_caching=True, prefix_chunk_tokens=16, prefix_checkpoints=2)
    outs = engine.run([engine.add_request(p, GREEDY) for p in prompts])
    assert [o.token_ids for o in outs] == expected
    engine.prefix.clear()
    assert engine.pool.is_empty()
