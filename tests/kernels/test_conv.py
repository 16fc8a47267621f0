"""The Triton causal conv's ``out=`` argument, interpreted: written in place over its own input
with a state pool (as ``add_rms_norm_linear_conv``'s unfused form runs it), equal to the
out-of-place call; aliasing x without a pool, or an ``out`` of another dtype, is refused with a
message that names ``out``."""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton.conv import causal_conv1d
torch.manual_seed(0)
T, C, K, S = 3, 40, 4, 5
y = torch.randn(T, 1, 64)          # a projection's output; the conv takes its first C columns
w = torch.randn(C, K)
pool = torch.randn(S, C, K - 1)
slots = torch.tensor([4, 0, 2], dtype=torch.int32)
pool2 = pool.clone()
want, _ = causal_conv1d(y[..., :C].clone(), w, None, pool2, state_slots=slots)
head = y[..., :C]
rest = y[..., C:].clone()
got, _ = causal_conv1d(head, w, None, pool, state_slots=slots, out=head)
assert got.data_ptr() == y.data_ptr()
assert torch.allclose(y[..., :C], want, atol=1e-6) and torch.equal(pool, pool2)
assert torch.equal(y[..., C:], rest)   # columns past C untouched
for bad in (dict(x=y[..., :C], out=y[..., :C]),                       # aliasing without a pool
            dict(x=y[..., :C].clone(), out=torch.empty(T, 1, C, dtype=torch.float64))):
    try:
        causal_conv1d(bad["x"], w, None, pool[:T].clone(), out=bad["out"])
        raise SystemExit(f"accepted {list(bad)}")
    except ValueError as err:
        assert "out" in str(err), err
print("ok")
"""


def test_out_in_place_over_the_input_interpreted():
    run_interpreted(SCRIPT)
