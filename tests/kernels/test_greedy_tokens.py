"""The Triton greedy argmax's per-row words, interpreted: after each call they are back at their
start values (the next call, with a lower maximum, still gets its own winner); a larger batch
grows them while the old pair stays held (captured graphs keep its address); a non-contiguous
``out`` is written; a wrong ``out`` is refused with a message naming it."""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton import sampling as ks
from hwinfer.kernels.triton.resting import held_words
torch.manual_seed(0)
dev = torch.device("cpu")
first = torch.randn(3, 5000) + 100.0          # a high maximum in every row
second = torch.randn(3, 5000)                 # lower everywhere: stale winners would show
for logits in (first, second, first[:, :4097]):
    out = torch.full((3,), -1, dtype=torch.int64)
    assert torch.equal(ks.greedy_tokens(logits, out, block=512), logits.argmax(-1))
best, ticket = held_words("greedy_tokens", dev)[-1]
assert (best == -2**63).all() and (ticket == 0).all()
big = torch.randn(300, 700)
cols = torch.full((300, 2), -1, dtype=torch.int64)
ks.greedy_tokens(big, cols[:, 1], block=256)   # strided out
assert torch.equal(cols[:, 1], big.argmax(-1)) and (cols[:, 0] == -1).all()
held = held_words("greedy_tokens", dev)
assert len(held) == 2 and held[0][0] is best and held[1][0].numel() >= 300
for bad in (torch.empty(3, dtype=torch.int32), torch.empty(4, dtype=torch.int64)):
    try:
        ks.greedy_tokens(first, bad)
        raise SystemExit(f"accepted out {bad.dtype} {tuple(bad.shape)}")
    except ValueError as err:
        assert "out" in str(err), err
print("ok")
"""


def test_greedy_words_rest_between_calls_and_grow():
    run_interpreted(SCRIPT)
