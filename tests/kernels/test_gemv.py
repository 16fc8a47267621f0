"""The decode GEMVs (hwinfer/kernels/triton/gemv.py) under the Triton interpreter, against F.linear
in fp32 on the same bf16 values: every split count (including a last split shorter than the
others), N and K off the tile sizes, 1-4 rows, bias, strided x; the whole-row kernel likewise;
fp32 outputs (out_dtype) equal to the bf16 ones converted.
On a CUDA device, the whole-row kernel with programmatic dependent launch in a dependent chain
(each product's input written by the kernel just before it), eager and in a CUDA graph."""
from __future__ import annotations

import pytest

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
# the whole-row kernel (no split K): every row count, N and K off the tiles, bias, strided x
from hwinfer.kernels.triton.gemv import gemv_rows
for m, n, k, bias, bn, strided in ((1, 70, 600, True, None, False), (4, 33, 1000, False, 4, True),
                                   (3, 64, 256, True, 16, False), (2, 5, 3584, False, None, False)):
    x = torch.randn(m, 2 * k if strided else k, generator=g).to(torch.bfloat16)
    x = x[:, :k] if strided else x
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    y = gemv_rows(x, w, b, block_n=bn, pdl=True)   # pdl is ignored off sm_90+
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    err = (y.float() - ref).abs().max().item()
    assert y.dtype == torch.bfloat16 and y.shape == (m, n), (y.dtype, y.shape)
    assert err <= 2e-2 * max(1.0, ref.abs().max().item()), ("rows", m, n, k, err)
# persistent: 4 programs (the interpreter's SM count) walk 5-9 row tiles, the last one partial
for m, n, k, bias, bn in ((1, 70, 600, True, 8), (4, 33, 1000, False, 4), (2, 36, 256, True, 4)):
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    y = gemv_rows(x, w, b, block_n=bn, per_sm=1)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    err = (y.float() - ref).abs().max().item()
    assert err <= 2e-2 * max(1.0, ref.abs().max().item()), ("persistent", m, n, k, err)
# the op wrapper: decode rows go to the kernel, larger M and fp32 to F.linear
x = torch.randn(2, 128, generator=g).to(torch.bfloat16); w = torch.randn(40, 128, generator=g).to(torch.bfloat16)
assert torch.allclose(linear(x, w).float(), F.linear(x.float(), w.float()), atol=0.1, rtol=2e-2)
xf = torch.randn(9, 128, generator=g)
assert torch.equal(linear(xf, w.float()), F.linear(xf, w.float()))
# out_dtype (the lm_head's fp32 logits): stored in fp32 from the bf16 rounding, by each kernel
# (whole, split + reduce, whole rows) and by the F.linear path, equal to the bf16 result cast.
x = torch.randn(3, 384, generator=g).to(torch.bfloat16)
w = (torch.randn(70, 384, generator=g) * 384 ** -0.5).to(torch.bfloat16)
b = torch.randn(70, generator=g).to(torch.bfloat16)
for run in (lambda **o: gemv(x, w, b, split=1, **o), lambda **o: gemv(x, w, b, block_k=128, split=3, **o),
            lambda **o: gemv_rows(x, w, b, **o), lambda **o: linear(x, w, b, **o)):
    y16, y32 = run(), run(out_dtype=torch.float32)
    assert y32.dtype == torch.float32 and torch.equal(y32, y16.float()), (y32 - y16.float()).abs().max()
x9 = torch.randn(9, 384, generator=g).to(torch.bfloat16)
assert torch.equal(linear(x9, w, b, out_dtype=torch.float32), F.linear(x9, w, b).float())
print("ok")
"""


def test_gemv_interpreted():
    run_interpreted(SCRIPT)


@pytest.mark.parametrize("per_sm", [0, 3])
def test_pdl_chain_on_cuda(per_sm, monkeypatch):
    """On sm_90+ ``linear`` loads a settled weight before waiting on the previous kernel: a chain
    where every input is written by the kernel right before must still read the new values
    (fails if the GEMV read x before its wait); one program a tile and persistent (3 an SM)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import torch.nn.functional as F

    import hwinfer.kernels.triton.gemv as gemv_module
    monkeypatch.setattr(gemv_module, "PERSIST_PER_SM", per_sm)

    from hwinfer.kernels.triton.gemv import linear
    from hwinfer.kernels.triton.pdl import pdl_ok

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(n, k, device=dev, generator=gen, dtype=torch.bfloat16) * k ** -0.5
          for n, k in ((4096, 1024), (1024, 4096), (3000, 1024), (1024, 3000))] * 3
    x0 = torch.randn(1, 1024, device=dev, generator=gen, dtype=torch.bfloat16)

    def chain(mm):
        # Products straight after products (the previous GEMV lets this one launch before it
        # has written x: only the wait keeps x right), and after a torch multiply.
        x = x0
        for i, w in enumerate(ws):
            xi = x[:, : w.shape[1]]
            x = mm(xi * 1.5 if i % 2 else xi, w)
        return x.float()

    ref = chain(lambda x, w: F.linear(x.float(), w.float()).to(torch.bfloat16))
    for _ in range(3):   # the first call of each weight is unsettled, later ones use PDL
        out = chain(linear)
        torch.cuda.synchronize()
        assert ((out - ref).norm() / ref.norm()).item() < 3e-2, "eager chain"
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = chain(linear)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        x0.copy_(torch.randn(1, 1024, device=dev, generator=gen, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref = chain(lambda x, w: F.linear(x.float(), w.float()).to(torch.bfloat16))
        assert ((out - ref).norm() / ref.norm()).item() < 3e-2, f"graph replay (pdl {pdl_ok(dev)})"
