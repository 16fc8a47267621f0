"""Triton Gated DeltaNet decay gate (contract: :func:`hwinfer.ops.linear_attention.gdn_gate`).

``g = -exp(A_log) * softplus(a + dt_bias)`` over [rows, Hv]: one launch instead of the five
elementwise kernels the torch expression runs (it sits in every GDN layer's decode step).
softplus = log(1 + e^x), x itself above 20 (the contract's threshold); log(1 + e^x) is computed
as max(x, 0) + log(1 + e^-|x|), which neither overflows nor loses the small values.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok


@triton.jit
def _gdn_gate_kernel(a_ptr, alog_ptr, dt_ptr, g_ptr, n, stride_a, H, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row, h = offs // H, offs % H
    a = tl.load(a_ptr + row * stride_a + h, mask=mask, other=0.0).to(tl.float32)
    alog = tl.load(alog_ptr + h, mask=mask, other=0.0).to(tl.float32)
    x = a + tl.load(dt_ptr + h, mask=mask, other=0.0).to(tl.float32)
    soft = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
    soft = tl.where(x > 20.0, x, soft)
    tl.store(g_ptr + offs, -tl.exp(alog) * soft, mask=mask)


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """a [..., Hv] -> g [..., Hv] fp32 (see the module docstring)."""
    if a.dim() < 1 or not a.is_floating_point():
        raise ValueError(f"gdn_gate: a must be a float tensor [..., Hv], got {a.dtype} {list(a.shape)}")
    hv = a.shape[-1]
    if tuple(A_log.shape) != (hv,) or tuple(dt_bias.shape) != (hv,):
        raise ValueError(f"gdn_gate: A_log and dt_bias must be [{hv}] (Hv), got "
                         f"{list(A_log.shape)} and {list(dt_bias.shape)}")
    a2 = a.reshape(-1, hv)
    if a2.stride(-1) != 1:
        a2 = a2.contiguous()
    g = torch.empty(a2.shape, dtype=torch.float32, device=a.device)
    n = g.numel()
    if n:
        block = 256
        _gdn_gate_kernel[(triton.cdiv(n, block),)](a2, A_log.contiguous(), dt_bias.contiguous(), g, n,
                                                   a2.stride(0), hv, BLOCK=block, num_warps=2,
                                                   PDL=pdl_ok(a.device), **launch_kwargs(a.device))
    return g.reshape(a.shape)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        sig = {"a_ptr": f"*{dtype}", "alog_ptr": "*fp32", "dt_ptr": "*fp32", "g_ptr": "*fp32",
               "n": "i32", "stride_a": "i32", "H": "i32", "BLOCK": "constexpr", "PDL": "constexpr"}
        specs.append(AotSpec(f"gdn_gate[{dtype}]", _gdn_gate_kernel, sig, {"BLOCK": 256, "PDL": False},
                             {"num_warps": 2}))
    return specs


AOT_SPECS = _aot_specs()
