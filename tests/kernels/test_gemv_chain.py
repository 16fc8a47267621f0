"""The persistent GEMV chain (hwinfer/kernels/triton/gemv_chain.py). Under the Triton interpreter
(one program: programs run one after another there, so a grid barrier only opens for a grid of
one): every product's output against fp32 products of the chain's own previous output, N off the
tiles, three K; a barrier that never opens sets the error flag instead of hanging. On a CUDA
device: the whole grid, eager and replayed from a CUDA graph (captured as the engine does, no
host sync) with new inputs, every barrier's count read back."""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

SCRIPT = r"""
import torch
import hwinfer.kernels.triton.gemv_chain as gc
g = torch.Generator().manual_seed(0)
# K 32 / 96 / 80 (three distinct), each N >= the next K, N off the row tiles
shapes = [(96, 32), (80, 96), (200, 80), (40, 32), (100, 32), (90, 80)]
ws = [(torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16) for n, k in shapes]
x = torch.randn(1, 32, generator=g).to(torch.bfloat16)
for sync in ("counter", "data"):
    chain = gc.GemvChain(ws, sync=sync)
    assert chain.programs == 1
    chain.act.fill_(float("nan"))   # poisoned: every output must be written
    y = chain(x)
    assert y.shape == (1, 90) and y.dtype == torch.bfloat16, (y.shape, y.dtype)
    prev = x.reshape(-1).float()
    for j, w in enumerate(ws):
        n, k = w.shape
        at = chain.desc[j + 1, 3].item()
        out = chain.act[at: at + n].float()
        ref = w.float() @ prev[:k]
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (sync, j, err)
        prev = out
    assert torch.equal(y.reshape(-1).float(), prev)
    assert chain.error.item() == 0
    assert chain.counters.tolist() == ([1] * len(ws) if sync == "counter" else [0] * len(ws))
# a barrier that cannot open (two programs, run one after the other; tiles of a few rows, so
# that program 1 owns part of every output): flagged, no hang
gc.SPIN_MAX, gc.TILE_BYTES = 4, 256
for sync in ("counter", "data"):
    two = gc.GemvChain(ws, programs=2, sync=sync)
    two(x)
    assert two.error.item() == 1, (sync, two.error)
# bad chains are refused with the reason
for bad, why in (([ws[3], ws[1]], "gives only N=40"), ([], "no weights"),
                 ([ws[0], ws[1].float()], "must be 2-D")):
    try:
        gc.GemvChain(bad)
    except ValueError as e:
        assert why in str(e), e
    else:
        raise AssertionError(why)
print("ok")
"""


def test_gemv_chain_interpreted():
    run_interpreted(SCRIPT)


@pytest.mark.parametrize("sync", ["counter", "data"])
def test_gemv_chain_on_cuda(sync):
    """The whole grid on a CUDA device: eager and graph replays against the F.linear chain."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from hwinfer.engine.graphs import capture
    from hwinfer.kernels.triton.gemv_chain import GemvChain

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(n, k, device=dev, generator=gen, dtype=torch.bfloat16) * k ** -0.5
          for n, k in ((4096, 1024), (1024, 2048), (7168, 1024), (1024, 3584))] * 4
    chain = GemvChain(ws, sync=sync)
    x0 = torch.randn(1, 1024, device=dev, generator=gen, dtype=torch.bfloat16)

    def ref():
        x = x0.float()
        for w in ws:
            x = (x[:, : w.shape[1]] @ w.float().t()).to(torch.bfloat16).float()
        return x

    def check(out, what):
        torch.cuda.synchronize()
        r = ref()
        assert ((out.float() - r).norm() / r.norm()).item() < 3e-2, what
        counts = [chain.programs] * len(ws) if sync == "counter" else [0] * len(ws)
        assert chain.error.item() == 0 and chain.counters.tolist() == counts, what

    check(chain(x0), "eager")
    # (the engine's capture: also fails if the launch syncs with the host)
    graph, out = capture(lambda: chain(x0), None, "GEMV chain")
    for _ in range(3):
        x0.copy_(torch.randn(1, 1024, device=dev, generator=gen, dtype=torch.bfloat16))
        graph.replay()
        check(out, "graph replay")
