"""The weight stream of one Qwen3.5-0.8B batch-1 decode step, GEMVs only: 18 Gated DeltaNet
layers (in_proj 8,224 x 1,024, out_proj 1,024 x 2,048), 6 attention layers (qkv 5,120 x 1,024,
o_proj 1,024 x 2,048), every layer's MLP (gate_up 7,168 x 1,024, down 1,024 x 3,584), the
lm_head (248,320 x 1,024): 97 products over 1.50 GB of distinct bf16 weights, each product's
input a slice of the one before (so the chain is as dependent as a real step), captured in one
CUDA graph and replayed.

    python3 scripts/bench_decode_chain.py [--norms] [--persistent] [--fused] [--quick]

One line per variant: us per step, GB/s over the weights, % of the card's measured copy bandwidth (hwinfer/ci/ceilings.py), and the last
output's relative error against the F.linear chain. Variants: F.linear (cuBLAS), the measured
choice of ``linear`` (GEMV or cuBLAS per shape), the whole-row GEMV (``gemv_rows``) with and
without programmatic dependent launch (PDL: W's loads issued before waiting on the previous
kernel), at several tile sizes. ``--norms``: an RMSNorm kernel between products (as a real step
has), with PDL when the products use it. ``--persistent``: the whole-row GEMV's persistent form
(``gemv_rows(per_sm=...)``): one wave of programs, each walking its share of W's row tiles with
the next tile's loads issued before the current one is reduced. ``--fused``: the
same products as the model runs them (norms, gated activation, conv and gated norm inside the
GEMVs, hwinfer/kernels/triton/gemv_norm.py), chained and per kind against the plain GEMV on the
same weights, to price the fused prologues and epilogues. ``--quick``: F.linear and the default
whole-row GEMV only. (All 97 products in one persistent launch with grid barriers between them,
``--chain``, was measured slower than the PDL chain and removed: docs/kernels.md, thirty-third
and thirty-fourth sessions; the kernel is at 3e5fd6a, hwinfer/kernels/triton/gemv_chain.py.)
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hwinfer.ci.ceilings import copy_gbps, describe
from hwinfer.kernels.triton import gemv as G
from hwinfer.kernels.triton import gemv_norm as GN
from hwinfer.kernels.triton.pdl import pdl_enter

HIDDEN, INTER, VOCAB = 1024, 3584, 248320


@triton.jit
def _norm_kernel(x_ptr, y_ptr, K, KP: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
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


class FusedStep:
    """The 97 products as Qwen3.5's decode runs them: each layer's input norm (+ residual add) in
    its first projection's prologue (GDN: the conv as its epilogue), the GDN gated norm before
    out_proj, the MLP's norm and SwiGLU around gate_up, the final norm before lm_head."""

    def __init__(self, ws: list[torch.Tensor], dev):
        self.ws = ws
        self.nw = torch.rand(HIDDEN, device=dev) + 0.5
        self.gnw = torch.rand(128, device=dev) + 0.5
        self.conv_w = torch.randn(6144, 4, device=dev, dtype=torch.bfloat16) * 0.5
        self.pool = torch.zeros(2, 6144, 3, device=dev, dtype=torch.bfloat16)
        self.slots = torch.zeros(1, device=dev, dtype=torch.int64)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        res = torch.zeros_like(x)
        ws = self.ws
        for layer in range(24):
            w_in, w_out, w_gu, w_down = ws[4 * layer: 4 * layer + 4]
            if layer % 4 == 3:   # attention: qkv, then o_proj on a 2,048-wide slice
                y, res = GN.add_rms_norm_linear(x, res, self.nw, w_in)
                x = G.gemv_rows(y[:, :2048], w_out, pdl=True)
            else:   # GDN: in_proj + conv, gated norm + out_proj over (o, z) slices
                y, res = GN.add_rms_norm_linear_conv(x, res, self.nw, w_in, self.conv_w,
                                                     self.pool, self.slots)
                o, z = y[:, :2048].view(1, 16, 128), y[:, 6144:8192].view(1, 16, 128)
                x = GN.rms_norm_gated_linear(o, z, self.gnw, w_out)
            h, res = GN.add_rms_norm_linear(x, res, self.nw, w_gu, activation="silu")
            x = G.gemv_rows(h, w_down, pdl=True)
        y, _ = GN.add_rms_norm_linear(x, res, self.nw, ws[-1])
        return y


def fused_kinds(step: FusedStep, dev) -> None:
    """Each fused GEMV kind against the plain whole-row GEMV on the same (cold) weights."""
    x = torch.randn(1, HIDDEN, device=dev, dtype=torch.bfloat16)
    r = torch.randn(1, HIDDEN, device=dev, dtype=torch.bfloat16)
    o = torch.randn(1, 16, 128, device=dev, dtype=torch.bfloat16)
    kinds = [("in_proj + norm + conv", "conv", step.ws[0], lambda w: GN.add_rms_norm_linear_conv(
                  x, r, step.nw, w, step.conv_w, step.pool, step.slots)),
             ("in_proj + norm", "norm", step.ws[0], lambda w: GN.add_rms_norm_linear(x, r, step.nw, w)),
             ("qkv + norm", "norm", step.ws[12], lambda w: GN.add_rms_norm_linear(x, r, step.nw, w)),
             ("gate_up + norm + SwiGLU", "gated", step.ws[2], lambda w: GN.add_rms_norm_linear(
                  x, r, step.nw, w, activation="silu")),
             ("out_proj + gated norm", "gated_norm", step.ws[1], lambda w: GN.rms_norm_gated_linear(
                  o, o, step.gnw, w))]
    for name, kind, w, call in kinds:
        copies = G.cold_copies(w, 256 << 20)
        for c in copies:   # a weight's first call runs without PDL (gemv.settled): not timed
            call(c)
        xk = torch.randn(1, w.shape[1], device=dev, dtype=torch.bfloat16)
        plain_us = G.time_on(copies, lambda w: G.gemv_rows(xk, w, pdl=True)) * 1e3
        cells = []
        default = GN.TILING[kind]
        for tile_kb, warps in ((default[0] >> 10, default[1]), (16, 8), (16, 4), (32, 8), (32, 4),
                               (64, 8)):
            GN.TILING[kind] = tile_kb << 10, warps
            try:
                cells.append(f"{tile_kb}KB w{warps} {G.time_on(copies, call) * 1e3:6.2f}")
            finally:
                GN.TILING[kind] = default
        print(f"# {name:<24} N {w.shape[0]:>6} K {w.shape[1]:>5} ({w.numel() * 2 / 1e6:4.1f} MB): "
              f"plain GEMV {plain_us:6.2f} us | fused (default first): {' | '.join(cells)}", flush=True)


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
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--quick", action="store_true")
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
    variants = [("F.linear", lambda x, w: F.linear(x, w), False)]
    if not args.quick:
        variants.append(("linear (measured choice)", G.linear, False))
    for tile_kb in (16,) if args.quick else (16, 32, 64):
        for warps in (8,) if args.quick else (4, 8):
            for pdl in (True,) if args.quick else (False, True):
                def mm(x, w, _t=tile_kb, _w=warps, _p=pdl):
                    bn = G.rows_block_n(w.shape[0], w.shape[1], _t << 10)
                    return G.gemv_rows(x, w, block_n=bn, num_warps=_w, pdl=_p)
                variants.append((f"gemv_rows {tile_kb}KB w{warps}{' pdl' if pdl else ''}", mm, pdl))
    if args.persistent:
        for per_sm in (1, 2, 3, 4):
            for tile_kb in (8, 16):
                variants.append((f"persistent {per_sm}/SM {tile_kb}KB w8 pdl",
                                 lambda x, w, _p=per_sm, _t=tile_kb: G.gemv_rows(
                                     x, w, block_n=G.rows_block_n(w.shape[0], w.shape[1], _t << 10),
                                     pdl=True, per_sm=_p), True))
    ref_out = None
    for name, mm, pdl in variants:
        between = (lambda x, _p=pdl: norm(x, _p)) if args.norms else None
        us, out = time_graph(lambda: step(x0, ws, mm, between))
        out = out.float()
        if ref_out is None:
            ref_out = out
        err = ((out - ref_out).norm() / ref_out.norm()).item()
        gbs = total / (us * 1e-6) / 1e9
        print(f"{name:<28} {us:8.1f} us/step {gbs:7.0f} GB/s {100 * gbs / copy_gbps():5.1f}%  rel err {err:.1e}",
              flush=True)
    if args.fused:
        fused = FusedStep(ws, dev)
        us, _ = time_graph(lambda: fused(x0))
        gbs = total / (us * 1e-6) / 1e9
        print(f"{'fused, as the model runs':<28} {us:8.1f} us/step {gbs:7.0f} GB/s {100 * gbs / copy_gbps():5.1f}%",
              flush=True)
        fused_kinds(fused, dev)


if __name__ == "__main__":
    print(describe(("GB/s",)), file=sys.stderr)
    main()
