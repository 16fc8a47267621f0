"""Sampling: greedy, temperature, top-k, top-p and seeded reproducibility, checked by hand."""
from __future__ import annotations

import pytest
import torch

from hwinfer.ops.sampling import mix32, sample, sampling_uniforms


def _params(b: int, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 7, step: int = 0):
    return dict(temperature=torch.full((b,), temperature), top_k=torch.full((b,), top_k, dtype=torch.int32),
                top_p=torch.full((b,), top_p), seeds=torch.full((b,), seed, dtype=torch.int64),
                steps=torch.full((b,), step, dtype=torch.int64))


def test_greedy_is_argmax_and_ties_go_to_lowest_id():
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0], [5.0, 1.0, 5.0, 0.0]])
    assert sample(logits, **_params(2, 0.0)).tolist() == [1, 0]


def test_top_k_1_and_tiny_top_p_equal_greedy():
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(-1).to(torch.int32)
    for step in range(5):
        assert torch.equal(sample(logits, **_params(16, 1.0, top_k=1, step=step)), greedy)
        assert torch.equal(sample(logits, **_params(16, 1.0, top_p=1e-6, step=step)), greedy)


def test_same_seed_and_step_same_token_other_steps_differ():
    logits = torch.zeros(1, 1000)
    a = sample(logits, **_params(1, 1.0, seed=42, step=3))
    b = sample(logits, **_params(1, 1.0, seed=42, step=3))
    draws = {int(sample(logits, **_params(1, 1.0, seed=42, step=s))) for s in range(20)}
    assert torch.equal(a, b) and len(draws) > 15


def test_a_request_draw_does_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=gen)
    p = _params(4, 0.9, top_k=20, top_p=0.8)
    p["seeds"] = torch.tensor([11, 22, 33, 44])
    together = sample(logits, **p)
    alone = [int(sample(logits[i:i + 1], **{k: v[i:i + 1] for k, v in p.items()})) for i in range(4)]
    assert together.tolist() == alone


def test_top_k_and_top_p_keep_only_allowed_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    seen_k = {int(sample(logits, **_params(1, 5.0, top_k=2, seed=s))) for s in range(200)}
    assert seen_k == {0, 1}
    # softmax([4, 3, 2, ...]) = [0.636, 0.234, 0.086, ...]: top_p 0.8 keeps tokens 0 and 1 only.
    seen_p = {int(sample(logits, **_params(1, 1.0, top_p=0.8, seed=s))) for s in range(300)}
    assert seen_p == {0, 1}


def test_draws_follow_the_softmax_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    counts = torch.zeros(3)
    n = 4000
    for s in range(n):
        counts[int(sample(logits, **_params(1, 1.0, seed=s)))] += 1
    freq = counts / n
    # Binomial standard deviation at n=4000 is <= 0.008; allow 4 sigma.
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.032), freq


def test_uniforms_are_in_the_open_interval_and_roughly_uniform():
    u = sampling_uniforms(torch.tensor([0, 1, 2**40 + 5]), torch.tensor([0, 0, 9]), 50000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    hist = torch.histc(u[0], bins=10, min=0, max=1)
    assert float(hist.min()) > 4500 and float(hist.max()) < 5500


def test_mix32_matches_a_uint32_implementation():
    def mix_uint32(x: int) -> int:
        x &= 0xFFFFFFFF
        for mul in (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39):
            x ^= x >> 16
            x = (x * mul) & 0xFFFFFFFF
        return x ^ (x >> 15)
    values = [0, 1, 12345, 0xFFFFFFFF, 0x80000000, 2**31 - 1]
    assert mix32(torch.tensor(values)).tolist() == [mix_uint32(v) for v in values]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="logits must be"):
        sample(torch.zeros(5), **_params(1, 1.0))
    with pytest.raises(ValueError, match="top_k must have shape"):
        p = _params(2, 1.0)
        p["top_k"] = torch.zeros(3, dtype=torch.int32)
        sample(torch.zeros(2, 4), **p)
