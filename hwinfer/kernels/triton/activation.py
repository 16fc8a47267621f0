"""Triton gated activation (contract: :func:`hwinfer.ops.activation.gated_act`).

``act(gate) * up`` in one pass (gate and up clamped first with ``limit``): grid (rows, column
blocks); gate and up may be the two strided halves of one merged projection output. fp32 math, one rounding to the output dtype. GELU-tanh
is written through tanh(z) = 2 sigmoid(2z) - 1 (no tanh primitive needed).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok

_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # a global a kernel may read


@triton.jit
def _gated_act_kernel(g_ptr, u_ptr, y_ptr, stride_g, stride_u, stride_y, I, limit,
                      SILU: tl.constexpr, HAS_LIMIT: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr):
    pdl_enter(PDL)   # on sm_90+: the down projection's GEMV loads its weights meanwhile
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_LIMIT:  # DeepSeek-V4's clamped SwiGLU
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    if SILU:
        a = g / (1.0 + tl.exp(-g))
    else:
        z = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        a = g / (1.0 + tl.exp(-2.0 * z))   # 0.5 g (1 + tanh z) = g sigmoid(2z)
    tl.store(y_ptr + row * stride_y + cols, (a * u).to(y_ptr.dtype.element_ty), mask=mask)


def gated_act(gate: torch.Tensor, up: torch.Tensor, *, activation: str = "silu",
              limit: float | None = None) -> torch.Tensor:
    """gate, up [..., I] (last dim contiguous; rows may be strided) -> act(gate) * up [..., I],
    gate and up clamped by ``limit`` first when given."""
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"gated_act: activation must be 'silu' or 'gelu_tanh', not {activation!r}")
    if limit is not None and not limit > 0:
        raise ValueError(f"gated_act: limit must be positive, not {limit!r}")
    if up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(f"gated_act: up {up.dtype} {list(up.shape)} must match gate {gate.dtype} "
                         f"{list(gate.shape)}")
    i = gate.shape[-1]
    g2, u2 = gate.reshape(-1, i), up.reshape(-1, i)
    g2 = g2 if g2.stride(-1) == 1 else g2.contiguous()
    u2 = u2 if u2.stride(-1) == 1 else u2.contiguous()
    y = torch.empty((g2.shape[0], i), dtype=gate.dtype, device=gate.device)
    if y.numel():
        block = min(1024, triton.next_power_of_2(i))
        _gated_act_kernel[(g2.shape[0], triton.cdiv(i, block))](
            g2, u2, y, g2.stride(0), u2.stride(0), y.stride(0), i,
            float(limit) if limit is not None else 0.0, SILU=activation == "silu",
            HAS_LIMIT=limit is not None, BLOCK=block, num_warps=4, PDL=pdl_ok(gate.device),
            **launch_kwargs(gate.device))
    return y.reshape(gate.shape)


def gated_act_supported(gate: torch.Tensor, up: torch.Tensor, **_: object) -> str | None:
    """Per-call check (shapes and dtypes only)."""
    if gate.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtype {gate.dtype} not supported"
    if gate.dim() == 0:
        return "expects [..., I]"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        sig = {"g_ptr": f"*{dtype}", "u_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "stride_g": "i32",
               "stride_u": "i32", "stride_y": "i32", "I": "i32", "limit": "fp32", "SILU": "constexpr",
               "HAS_LIMIT": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"}
        for limit in (False, True):   # DeepSeek-V4's shared experts clamp
            specs.append(AotSpec(f"gated_act[{dtype}{',limit' if limit else ''}]", _gated_act_kernel,
                                 sig, {"SILU": True, "HAS_LIMIT": limit, "BLOCK": 1024, "PDL": False},
                                 {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
