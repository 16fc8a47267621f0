"""Time gdn_recurrent / kda_recurrent decode on the GPU: reference vs portable torch vs Triton
(a few block shapes) vs fla-core's fused recurrent kernels when fla is importable.

Shapes: Qwen3.5-0.8B GDN (Hk = Hv = 16, Dk = Dv = 128) and Kimi-Linear KDA (H = 32, D = 128),
decode T=1 at batch 1, 32, 256, plus a 4-token step (speculative verification) and a packed
(cu_seqlens) decode. q/k/v bf16, g/beta fp32, a given fp32 state.

Bytes per call: state read + write (2 * N * Hv * Dk * Dv * 4) + q, k, v, o (bf16) + g, beta
(fp32). The state dominates, so GB/s against the card's measured copy bandwidth (4,270 on the H200) says how close to the
memory roofline a kernel gets; at batch 1 launch latency dominates instead.
"""
from __future__ import annotations

import sys

import torch
import triton.testing

from hwinfer.backend import resolve_device, select
from hwinfer.ci.ceilings import copy_gbps, describe
from hwinfer.kernels.torch import linear_attention as torch_la
from hwinfer.kernels.triton import delta_rule as triton_la
from hwinfer.ops import linear_attention as ref_la


try:  # fla-core is on the machine only if the lead carried its wheel there
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_gdn
    from fla.ops.kda import fused_recurrent_kda as fla_kda
    FLA = True
except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
    print(f"fla not available ({type(exc).__name__}: {str(exc)[:120]})")
    FLA = False

dev = resolve_device("cuda")
table = select(dev)
print(describe(("GB/s",)), file=sys.stderr)
print(f"device: {dev.describe()}; chosen gdn_recurrent: {table.chosen('gdn_recurrent')}, "
      f"kda_recurrent: {table.chosen('kda_recurrent')}")


def make(kind: str, B: int, T: int, varlen: bool):
    hk, hv, d = (16, 16, 128) if kind == "gdn" else (32, 32, 128)
    g_shape = (B, T, hv) if kind == "gdn" else (B, T, hv, d)
    n = B
    if varlen:  # the same tokens packed as one row of B sequences
        n, B, T = B, 1, B * T
        g_shape = (1, T) + g_shape[2:]
    bf = dict(device="cuda", dtype=torch.bfloat16)
    inputs = {
        "q": torch.randn(B, T, hk, d, **bf), "k": torch.randn(B, T, hk, d, **bf),
        "v": torch.randn(B, T, hv, d, **bf),
        "g": -torch.rand(*g_shape, device="cuda") * 2 - 0.01,
        "beta": torch.rand(B, T, hv, device="cuda") * 0.9 + 0.05,
        "initial_state": torch.randn(n, hv, d, d, device="cuda") * 0.5,
    }
    if varlen:
        steps = T // n
        inputs["cu_seqlens"] = torch.arange(0, T + 1, steps, device="cuda", dtype=torch.int32)
    nbytes = (2 * n * hv * d * d * 4 + 2 * B * T * hk * d * 2 + 2 * B * T * hv * d * 2
              + inputs["g"].numel() * 4 + inputs["beta"].numel() * 4)
    return inputs, nbytes


def fla_call(kind: str):
    fn = fla_gdn if kind == "gdn" else fla_kda

    def call(q, k, v, g, beta, initial_state, cu_seqlens=None):
        # fla wants cu_seqlens as int64 (LongTensor) and returns the state only when asked.
        cu = cu_seqlens.long() if cu_seqlens is not None else None
        return fn(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                  output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return call


def rel_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


for kind in ("gdn", "kda"):
    op = f"{kind}_recurrent"
    ref = getattr(ref_la, op)
    impls = [("reference", ref), ("torch", getattr(torch_la, op))]
    tri = getattr(triton_la, op)
    for bv, warps in ((None, None), (16, 1), (32, 4), (64, 4)):
        label = "triton" if bv is None else f"triton bv{bv}w{warps}"
        impls.append((label, lambda *a, _f=tri, _b=bv, _w=warps, **kw: _f(*a, block_v=_b,
                                                                           num_warps=_w, **kw)))
    if FLA:
        impls.append(("fla", fla_call(kind)))
    for B, T, varlen in ((1, 1, False), (32, 1, False), (256, 1, False), (32, 4, False),
                         (256, 1, True)):
        inputs, nbytes = make(kind, B, T, varlen)
        o_ref, s_ref = ref(**inputs)
        shape = f"{op} B={B} T={T}{' packed' if varlen else ''}"
        for name, fn in impls:
            try:
                o, s = fn(**inputs)
                err = f"o {rel_rmse(o, o_ref):.1e} S {rel_rmse(s, s_ref):.1e}"
                ms = triton.testing.do_bench(lambda: fn(**inputs), warmup=25, rep=100)
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                print(f"{shape:<36} {name:<16} FAILED {type(exc).__name__}: {str(exc)[:100]}")
                continue
            gbs = nbytes / ms / 1e6
            print(f"{shape:<36} {name:<16} {ms * 1e3:9.1f} us {gbs:7.0f} GB/s "
                  f"({100 * gbs / copy_gbps():4.1f}% of peak)  rel-rmse vs ref: {err}")
