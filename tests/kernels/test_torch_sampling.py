"""The torch sampler without full sorts (hwinfer/kernels/torch/sampling.py) against the reference,
token for token: random, bf16 and integer logits (ties at the top-k and top-p cuts), every mix
of greedy / top-k / top-p rows; the candidate set grown (first try too small, then the row)."""
from __future__ import annotations

import pytest
import torch

from hwinfer.kernels.torch import sampling as ts
from hwinfer.ops.sampling import sample as reference


def _draw(g, logits, temp, k, p):
    b = logits.shape[0]
    return (logits, torch.tensor(temp), torch.tensor(k), torch.tensor(p),
            torch.randint(0, 2**62, (b,), generator=g), torch.randint(0, 4096, (b,), generator=g))


@pytest.mark.parametrize("first", [1024, 3])
def test_same_tokens_as_the_reference(first, monkeypatch):
    monkeypatch.setattr(ts, "FIRST_CANDIDATES", first)   # 3: the growth path on every row
    g = torch.Generator().manual_seed(first)
    for trial in range(24):
        v = int(torch.randint(50, 3000, (1,), generator=g))
        if trial % 3 == 0:
            logits = torch.randint(-5, 6, (4, v), generator=g).float()      # many ties
        elif trial % 3 == 1:
            logits = (torch.randn(4, v, generator=g) * 3).bfloat16()
        else:
            logits = torch.randn(4, v, generator=g) * float(torch.rand(1, generator=g) * 10)
        temp = [0.0] + (torch.rand(3, generator=g) * 2 + 0.05).tolist()
        k = [0, 0] + torch.randint(1, v + 2, (2,), generator=g).tolist()
        p = [1.0, float(torch.rand(1, generator=g)), 1.0, 0.9 + 0.1 * float(torch.rand(1, generator=g))]
        args = _draw(g, logits, temp, k, p)
        assert torch.equal(ts.sample(*args), reference(*args)), (trial, temp, k, p)


def test_flat_distribution_needs_the_whole_row():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 40_000, generator=g) * 0.1   # top-p 0.99 keeps most of the row
    args = _draw(g, logits, [1.0, 2.0], [0, 0], [0.99, 0.999])
    assert torch.equal(ts.sample(*args), reference(*args))
