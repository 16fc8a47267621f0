"""The decode GEMV (hwinfer/kernels/triton/gemv.py) under the Triton interpreter, against F.linear
in fp32 on the same bf16 values: every split count (including a last split shorter than the
others), N and K off the tile sizes, 1-4 rows, bias, strided x. On a GPU the same checks run with
HWINFER_GEMV=always through the conformance suite (``linear``)."""
from __future__ import annotations

from tests.kernels.interpreted import run_interpreted

SCRIPT = r"""
import torch, torch.nn.functional as F
from hwinfer.kernels.triton.gemv import gemv, linear
g = torch.Generator().manual_seed(0)
def case(m, n, k, split, bias, bn=32, bk=256, strided=False):
    x = torch.randn(m, 2 * k if strided else k, generator=g).to(torch.bfloat16)
    x = x[:, :k] if strided else x
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    y = gemv(x, w, b, block_n=bn, block_k=bk, split=split)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    err = (y.float() - ref).abs().max().item()
    assert y.dtype == torch.bfloat16 and y.shape == (m, n), (y.dtype, y.shape)
    assert err <= 2e-2 * max(1.0, ref.abs().max().item()), (m, n, k, split, err)
case(1, 96, 512, 1, False)
case(3, 70, 600, 3, True)             # last split shorter, N and K off the tiles
case(4, 33, 1000, 2, False, bn=16, bk=128, strided=True)
case(2, 64, 256, 4, True, bn=64, bk=64)
# the op wrapper: decode rows go to the kernel, larger M and fp32 to F.linear
x = torch.randn(2, 128, generator=g).to(torch.bfloat16); w = torch.randn(40, 128, generator=g).to(torch.bfloat16)
assert torch.allclose(linear(x, w).float(), F.linear(x.float(), w.float()), atol=0.1, rtol=2e-2)
xf = torch.randn(9, 128, generator=g)
assert torch.equal(linear(xf, w.float()), F.linear(xf, w.float()))
print("ok")
"""


def test_gemv_interpreted():
    run_interpreted(SCRIPT)
