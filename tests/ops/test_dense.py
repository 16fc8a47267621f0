"""The ``linear`` reference's ``out_dtype``: y rounded to x.dtype, then returned in out_dtype (the
lm_head's fp32 logits equal the bf16 ones converted); a non-float out_dtype and mismatched shapes
are refused with messages naming them."""
from __future__ import annotations

import pytest
import torch

from hwinfer.kernels.torch.dense import linear as torch_linear
from hwinfer.ops.dense import linear


def test_out_dtype_keeps_the_input_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(50, 64, generator=g).to(torch.bfloat16)
    y16 = linear(x, w)
    y32 = linear(x, w, out_dtype=torch.float32)
    assert y16.dtype == torch.bfloat16 and y32.dtype == torch.float32
    assert torch.equal(y32, y16.float())
    # the unrounded fp32 product differs: the rounding is really there
    assert not torch.equal(y32, x.float() @ w.float().T)
    assert torch_linear(x, w, out_dtype=torch.float32).dtype == torch.float32


def test_bad_calls_are_named():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="out_dtype"):
        linear(x, w, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="K = 8"):
        linear(torch.randn(2, 7), w)
    with pytest.raises(ValueError, match="bias"):
        linear(x, w, torch.randn(3))
