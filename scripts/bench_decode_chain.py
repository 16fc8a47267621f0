"""The weight stream of one Qwen3.5-0.8B batch-1 decode step, GEMVs only: 18 Gated DeltaNet
layers (in_proj 8,224 x 1,024, out_proj 1,024 x 2,048), 6 attention layers (qkv 5,120 x 1,024,
o_proj 1,024 x 2,048), every layer's MLP (gate_up 7,168 x 1,024, down 1,024 x 3,584), the
lm_head (248,320 x 1,024): 97 products over 1.50 GB of distinct bf16 weights, each product's
input a slice of the one before (so the chain is as dependent as a real step), captured in one
CUDA graph and replayed.

    python3 scripts/bench_decode_chain.py [--norms]

One line per variant: us per step, GB/s over the weights, % of 4,270 GB/s, and the last
output's relative error against the F.linear chain. Variants: F.linear (cuBLAS), the measured
choice of ``linear`` (GEMV or cuBLAS per shape), the whole-row GEMV (``gemv_rows``) with and
without programmatic dependent launch (PDL: W's loads issued before waiting on the previous
kernel), at several tile sizes. ``--norms``: an RMSNorm kernel between products (as a real step
has), with PDL when the products use it.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hwinfer.kernels.triton import gemv as G

HIDDEN, INTER, VOCAB = 1024, 3584, 248320


@triton.jit
def _norm_kernel(x_ptr, y_ptr, K, KP: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    r = tl.arange(0, KP)
    x = tl.load(x_ptr + r, mask=r < K, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / K + 1e-6)
    tl.store(y_ptr + r, y.to(y_ptr.dtype.element_ty), mask=r < K)


def norm(x: torch.Tensor, pdl: bool) -> torch.Tensor:
    y = torch.empty_like(x)
    k = x.shape[-1]
    _norm_kernel[(1,)](x, y, k, KP=triton.next_power_of_2(k), PDL=pdl, num_warps=4,
                       **({"launch_pdl": True} if pdl else {}))
    return y


def weights(dev) -> list[torch.Tensor]:
    shapes = []
    for layer in range(24):
        attn = layer % 4 == 3
        shapes += [(5120 if attn else 8224, HIDDEN), (HIDDEN, 2048), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    shapes.append((VOCAB, HIDDEN))
    return [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5 for n, k in shapes]


def step(x: torch.Tensor, ws: list[torch.Tensor], mm, between=None) -> torch.Tensor:
    for w in ws:
        x = mm(x[:, : w.shape[1]], w)
        if between is not None:
            x = between(x)
    return x


def time_graph(fn, reps: int = 10) -> float:
    """Microseconds per ``fn()`` replayed from a CUDA graph (median of ``reps``)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        out = fn()
    torch.cuda.current_stream().wait_stream(s)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2], out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--norms", action="store_true")
    args = parser.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ws = weights(dev)
    total = sum(w.numel() * w.element_size() for w in ws)
    x0 = torch.randn(1, HIDDEN, device=dev, dtype=torch.bfloat16)
    # Per-shape check of the whole-row kernel against fp32 F.linear, 1 and 4 rows.
    for w in {tuple(w.shape): w for w in ws}.values():
        for m in (1, 4):
            x = torch.randn(m, w.shape[1], device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            for pdl in (False, True):
                y = G.gemv_rows(x, w, pdl=pdl).float()
                err = ((y - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (tuple(w.shape), m, pdl, err)
    print(f"# {len(ws)} products, {total / 1e9:.3f} GB of weights; whole-row GEMV checked on every shape")
    variants = [("F.linear", lambda x, w: F.linear(x, w), False),
                ("linear (measured choice)", G.linear, False)]
    for tile_kb in (16, 32, 64):
        for warps in (4, 8):
            for pdl in (False, True):
                def mm(x, w, _t=tile_kb, _w=warps, _p=pdl):
                    bn = G.rows_block_n(w.shape[0], w.shape[1], _t << 10)
                    return G.gemv_rows(x, w, block_n=bn, num_warps=_w, pdl=_p)
                variants.append((f"gemv_rows {tile_kb}KB w{warps}{' pdl' if pdl else ''}", mm, pdl))
    ref_out = None
    for name, mm, pdl in variants:
        between = (lambda x, _p=pdl: norm(x, _p)) if args.norms else None
        us, out = time_graph(lambda: step(x0, ws, mm, between))
        out = out.float()
        if ref_out is None:
            ref_out = out
        err = ((out - ref_out).norm() / ref_out.norm()).item()
        gbs = total / (us * 1e-6) / 1e9
        print(f"{name:<28} {us:8.1f} us/step {gbs:7.0f} GB/s {100 * gbs / 4270:5.1f}%  rel err {err:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
