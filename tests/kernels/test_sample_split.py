"""The sampler split over the vocabulary (hwinfer/kernels/triton/sample_split.py), interpreted,
against the reference token for token where the conformance cases do not reach: several chunks
a row; integer logits, so many tokens tie at the top-k and top-p cuts (the cut's ties kept in id
order, only some of them); bf16 logits; k = 1, k = V, p close to 0 and 1, p <= 0; greedy and sampled
rows in one batch. After every call each per-row word is back at its start value."""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton import sample_split as ss
from hwinfer.kernels.triton.resting import held_words
from hwinfer.ops.sampling import sample as ref
g = torch.Generator().manual_seed(0)
V = 2500
def check(logits, temp, k, p):
    b = logits.shape[0]
    args = (logits, torch.tensor(temp), torch.tensor(k, dtype=torch.int32), torch.tensor(p),
            torch.randint(0, 2**62, (b,), generator=g), torch.randint(0, 4096, (b,), generator=g))
    got, want = ss.sample(*args, block=512), ref(*args)
    assert torch.equal(got, want), (temp, k, p, got.tolist(), want.tolist())
    for name, start in (("sample:best", -2**63), ("sample:state", 0), ("sample:ticket", 0),
                        ("sample:hist", 0)):
        for words in held_words(name, "cpu")[-1]:
            assert (words == start).all(), name
ties = torch.randint(-4, 5, (4, V), generator=g).float()   # ~280 tokens share each value
check(ties, [1.0, 1.0, 0.7, 0.0], [0, 10, 0, 0], [0.3, 1.0, 0.02, 1.0])
check(ties[:2], [1.0, 1.0], [300, 3], [0.5, 1.0])
check((torch.randn(3, V, generator=g) * 3).bfloat16(), [0.6, 1.0, 2.0], [50, 0, 1], [0.9, 0.8, 1.0])
check(torch.randn(3, V, generator=g) * 3, [0.8, 0.8, 0.8], [V, 0, 2499], [1.0, 0.999, 0.05])
check(ties[:2], [1.0, 1.0], [0, 7], [0.0, -1.0])   # p <= 0: the first top token, as the reference
print("ok")
"""


def test_sample_split_against_the_reference():
    run_interpreted(SCRIPT)
