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


def test_many_programs_a_row_on_cuda():
    """On a CUDA device: a 248,320-token vocabulary (122 programs a row, so the rows' tickets
    and atomics really race), random and integer logits (thousands of ties at every cut),
    greedy and sampled rows, token for token against the reference, over several draws."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from hwinfer.kernels.triton.sample_split import sample
    from hwinfer.ops.sampling import sample as reference

    g = torch.Generator(device="cuda").manual_seed(0)
    v = 248_320
    temp = torch.tensor([0.0, 0.7, 1.0, 0.8, 1.2, 0.6], device="cuda")
    top_k = torch.tensor([0, 50, 0, 1000, 0, 5], device="cuda", dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.95, 0.8], device="cuda")
    for trial in range(8):
        if trial % 2:
            logits = torch.randint(-20, 21, (6, v), device="cuda", generator=g).float()
        else:
            logits = torch.randn(6, v, device="cuda", generator=g) * 3
        seeds = torch.randint(0, 2**62, (6,), device="cuda", generator=g)
        steps = torch.randint(0, 4096, (6,), device="cuda", generator=g)
        args = (logits, temp, top_k, top_p, seeds, steps)
        got, want = sample(*args), reference(*args)
        assert torch.equal(got, want), (trial, got.tolist(), want.tolist())
