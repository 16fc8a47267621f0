"""Triton RMSNorm, residual add + RMSNorm and gated RMSNorm (contracts:
:func:`hwinfer.ops.norm.rms_norm`, :func:`~hwinfer.ops.norm.add_rms_norm`,
:func:`~hwinfer.ops.norm.rms_norm_gated`).

One program normalises one row; the row is loaded once (BLOCK >= D), upcast to fp32 right after
the load (the interpreter computes bf16 wrongly otherwise, and fp32 is the contract anyway).
On sm_90+ they are programmatic dependent launches (:mod:`.pdl`): in decode they sit between
the weight GEMVs, which can then start loading their weights while the norm runs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, D, eps, offset,
                     HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * inv
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = y * (w + offset)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
             weight_offset: float = 0.0) -> torch.Tensor:
    """Triton RMSNorm over the last dim; x [..., D] -> [..., D] in x.dtype."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    if x2.shape[0] == 0:
        return y.reshape(x.shape)
    block = triton.next_power_of_2(d)
    w = weight if weight is not None else x2  # dummy pointer when unweighted
    _rms_norm_kernel[(x2.shape[0],)](
        x2, w, y, x2.stride(0), y.stride(0), d, eps, weight_offset,
        HAS_WEIGHT=weight is not None, BLOCK=block, num_warps=4 if block <= 2048 else 8,
        PDL=pdl_ok(x.device), **launch_kwargs(x.device))
    return y.reshape(x.shape)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, stride_x, stride_r, stride_y, stride_s,
                         D, eps, offset, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    # The residual stream is rounded to its dtype, and the norm reads the rounded values (as
    # the unfused add then norm would).
    s_lo = (x + r).to(s_ptr.dtype.element_ty)
    tl.store(s_ptr + row * stride_s + cols, s_lo, mask=mask)
    s = s_lo.to(tl.float32)
    y = s / tl.sqrt(tl.sum(s * s, axis=0) / D + eps)
    if HAS_WEIGHT:
        y = y * (tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + offset)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, *,
                 eps: float = 1e-6, weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton residual add + RMSNorm: x, residual [..., D] -> (rms_norm(x + residual), x +
    residual), both in x.dtype; one program per row, each input read once."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: residual {residual.dtype} {list(residual.shape)} must match "
                         f"x {x.dtype} {list(x.shape)}")
    d = x.shape[-1]
    x2, r2 = _rows(x, d), _rows(residual, d)
    y = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    s = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(d)
        _add_rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight if weight is not None else x2, y, s, x2.stride(0), r2.stride(0),
            y.stride(0), s.stride(0), d, eps, weight_offset, HAS_WEIGHT=weight is not None,
            BLOCK=block, num_warps=4 if block <= 2048 else 8, PDL=pdl_ok(x.device),
            **launch_kwargs(x.device))
    return y.reshape(x.shape), s.reshape(x.shape)


@triton.jit
def _rms_norm_gated_kernel(x_ptr, z_ptr, w_ptr, y_ptr, stride_x, stride_z, stride_y, D, eps,
                           HAS_WEIGHT: tl.constexpr, SILU: tl.constexpr, BLOCK: tl.constexpr,
                           PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * stride_z + cols, mask=mask, other=0.0).to(tl.float32)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-z))
    if SILU:
        y = y * z * sig
    else:
        y = y * sig
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    """[..., D] as [rows, D] with unit column stride (a view when possible)."""
    t2 = t.reshape(-1, d)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None = None, *,
                   eps: float = 1e-6, activation: str = "silu") -> torch.Tensor:
    """Triton gated RMSNorm: x, gate [..., D] -> rms_norm(x) * weight * act(gate) in x.dtype,
    one program per row (the GDN / KDA output norm: one launch instead of a chain of ops)."""
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"rms_norm_gated: activation must be 'silu' or 'sigmoid', not {activation!r}")
    if gate.shape != x.shape:
        raise ValueError(f"rms_norm_gated: gate {list(gate.shape)} must match x {list(x.shape)}")
    d = x.shape[-1]
    x2, z2 = _rows(x, d), _rows(gate, d)
    y = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(d)
        _rms_norm_gated_kernel[(x2.shape[0],)](
            x2, z2, weight if weight is not None else x2, y, x2.stride(0), z2.stride(0), y.stride(0),
            d, eps, HAS_WEIGHT=weight is not None, SILU=activation == "silu", BLOCK=block,
            num_warps=4 if block <= 2048 else 8, PDL=pdl_ok(x.device), **launch_kwargs(x.device))
    return y.reshape(x.shape)


def rms_norm_supported(x: torch.Tensor, weight: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check: one program holds a whole row, so rows wider than 65536 go elsewhere."""
    if x.shape[-1] > 65536:
        return f"row width {x.shape[-1]} > 65536"
    if weight is not None and weight.stride(-1) != 1:
        return "weight must be contiguous"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        for block, warps in ((1024, 4), (4096, 8)):
            sig = {"x_ptr": f"*{dtype}", "w_ptr": "*fp32", "y_ptr": f"*{dtype}", "stride_x": "i32",
                   "stride_y": "i32", "D": "i32", "eps": "fp32", "offset": "fp32",
                   "HAS_WEIGHT": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"}
            specs.append(AotSpec(f"rms_norm[{dtype},{block}]", _rms_norm_kernel, sig,
                                 {"HAS_WEIGHT": True, "BLOCK": block, "PDL": False}, {"num_warps": warps}))
    for dtype in ("fp32", "bf16"):
        sig = {"x_ptr": f"*{dtype}", "r_ptr": f"*{dtype}", "w_ptr": "*fp32", "y_ptr": f"*{dtype}",
               "s_ptr": f"*{dtype}", "stride_x": "i32", "stride_r": "i32", "stride_y": "i32",
               "stride_s": "i32", "D": "i32", "eps": "fp32", "offset": "fp32",
               "HAS_WEIGHT": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"}
        for pdl in (False, True):   # PDL: what sm_90+ launches (NVIDIA only)
            specs.append(AotSpec(f"add_rms_norm[{dtype}{',pdl' if pdl else ''}]", _add_rms_norm_kernel,
                                 sig, {"HAS_WEIGHT": True, "BLOCK": 1024, "PDL": pdl},
                                 {"num_warps": 4}, ("sm_90", "sm_100") if pdl else None))
    for dtype in ("fp32", "bf16"):
        sig = {"x_ptr": f"*{dtype}", "z_ptr": f"*{dtype}", "w_ptr": "*fp32", "y_ptr": f"*{dtype}",
               "stride_x": "i32", "stride_z": "i32", "stride_y": "i32", "D": "i32", "eps": "fp32",
               "HAS_WEIGHT": "constexpr", "SILU": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"}
        specs.append(AotSpec(f"rms_norm_gated[{dtype}]", _rms_norm_gated_kernel, sig,
                             {"HAS_WEIGHT": True, "SILU": True, "BLOCK": 128, "PDL": False},
                             {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
