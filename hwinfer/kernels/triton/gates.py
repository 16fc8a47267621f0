"""Triton decay gates (contracts: :func:`hwinfer.ops.linear_attention.gdn_gate`, ``kda_gate``).

``g = -exp(A_log) * softplus(a + dt_bias)`` over [rows, Hv]: one launch instead of the five
elementwise kernels the torch expression runs (it sits in every GDN layer's decode step).
softplus = log(1 + e^x), x itself above 20 (the contract's threshold); log(1 + e^x) is computed
as max(x, 0) + log(1 + e^-|x|), which neither overflows nor loses the small values.
``kda_gate``: KDA's gate per key channel over [rows, H * Dk], in either form (Kimi-Linear's
``-A softplus(x)``, K3 / GLM-5.3's ``lb * sigmoid(A x)``), one launch in place of the torch
expression's five or six kernels in every KDA layer's prefill.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok
from hwinfer.ops.linear_attention import check_kda_gate


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


def _rows_and_out(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x as rows [R, width] with unit column stride (row-strided views taken as they are) and
    the fp32 gate output [R, width] the kernels write."""
    x2 = x.reshape(-1, width)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, torch.empty(x2.shape, dtype=torch.float32, device=x.device)


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """a [..., Hv] -> g [..., Hv] fp32 (see the module docstring)."""
    if a.dim() < 1 or not a.is_floating_point():
        raise ValueError(f"gdn_gate: a must be a float tensor [..., Hv], got {a.dtype} {list(a.shape)}")
    hv = a.shape[-1]
    if tuple(A_log.shape) != (hv,) or tuple(dt_bias.shape) != (hv,):
        raise ValueError(f"gdn_gate: A_log and dt_bias must be [{hv}] (Hv), got "
                         f"{list(A_log.shape)} and {list(dt_bias.shape)}")
    a2, g = _rows_and_out(a, hv)
    n = g.numel()
    if n:
        block = 256
        _gdn_gate_kernel[(triton.cdiv(n, block),)](a2, A_log.contiguous(), dt_bias.contiguous(), g, n,
                                                   a2.stride(0), hv, BLOCK=block, num_warps=2,
                                                   PDL=pdl_ok(a.device), **launch_kwargs(a.device))
    return g.reshape(a.shape)


@triton.jit
def _kda_gate_kernel(f_ptr, alog_ptr, dt_ptr, g_ptr, n, stride_f, HD, DK, lb, BLOCK: tl.constexpr,
                     BOUNDED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row, c = offs // HD, offs % HD
    x = (tl.load(f_ptr + row.to(tl.int64) * stride_f + c, mask=mask, other=0.0).to(tl.float32)
         + tl.load(dt_ptr + c, mask=mask, other=0.0).to(tl.float32))
    a = tl.exp(tl.load(alog_ptr + c // DK, mask=mask, other=0.0).to(tl.float32))
    if BOUNDED:   # lb * sigmoid(A x)
        g = lb / (1.0 + tl.exp(-(a * x)))
    else:         # -A softplus(x), softplus as in _gdn_gate_kernel
        soft = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
        g = -a * tl.where(x > 20.0, x, soft)
    tl.store(g_ptr + offs, g, mask=mask)


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *,
             lower_bound: float | None = None) -> torch.Tensor:
    """f [..., H, Dk] (rows may be strided) -> g [..., H, Dk] fp32 in one launch (contract:
    :func:`hwinfer.ops.linear_attention.kda_gate`; the torch expression is five to six
    elementwise kernels, in every KDA layer's prefill)."""
    h, dk = check_kda_gate(f, A_log, dt_bias, lower_bound)
    f2, g = _rows_and_out(f, h * dk)
    n = g.numel()
    if n:
        block = 1024
        _kda_gate_kernel[(triton.cdiv(n, block),)](
            f2, A_log.reshape(-1).float().contiguous(), dt_bias.reshape(-1).float().contiguous(), g,
            n, f2.stride(0), h * dk, dk, float(lower_bound or 0.0), BLOCK=block,
            BOUNDED=lower_bound is not None, num_warps=4)
    return g.reshape(f.shape)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        sig = {"a_ptr": f"*{dtype}", "alog_ptr": "*fp32", "dt_ptr": "*fp32", "g_ptr": "*fp32",
               "n": "i32", "stride_a": "i32", "H": "i32", "BLOCK": "constexpr", "PDL": "constexpr"}
        specs.append(AotSpec(f"gdn_gate[{dtype}]", _gdn_gate_kernel, sig, {"BLOCK": 256, "PDL": False},
                             {"num_warps": 2}))
    for bounded in (False, True):   # Kimi-Linear's softplus form, K3 / GLM-5.3's bounded one
        specs.append(AotSpec(f"kda_gate[bf16{',bounded' if bounded else ''}]", _kda_gate_kernel,
                             {"f_ptr": "*bf16", "alog_ptr": "*fp32", "dt_ptr": "*fp32",
                              "g_ptr": "*fp32", "n": "i32", "stride_f": "i32", "HD": "i32",
                              "DK": "i32", "lb": "fp32", "BLOCK": "constexpr",
                              "BOUNDED": "constexpr"},
                             {"BLOCK": 1024, "BOUNDED": bounded}, {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
