"""Triton RoPE tables (contract: :func:`hwinfer.ops.rope.rope_tables`).

The reference is four torch kernels (positions to fp32, the outer product with the inverse
frequencies, cos, sin; five with a magnitude). In a decode step each is a separate launch that
programmatic dependent launch cannot overlap (docs/engine.md, tenth session), so here they are
one kernel. The inverse frequencies come from the same host computation as the reference
(``rope_inv_freq``, bit-identical to transformers, cached per device); the angle is the same
single fp32 multiply, and ``tl.cos`` / ``tl.sin`` lower to the full-range library functions
(``__nv_cosf`` on NVIDIA, checked in the sm_90 LLVM IR; not the ``.approx`` instructions, which
lose all accuracy at the angles of long contexts).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.ops.rope import _device_inv_freq


@triton.jit
def _rope_tables_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, T, HALF, magnitude,
                        BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, SCALED: tl.constexpr):
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rh = tl.arange(0, BLOCK_H)
    tmask = rt < T
    hmask = rh < HALF
    p = tl.load(pos_ptr + rt, mask=tmask, other=0).to(tl.float32)
    f = tl.load(inv_ptr + rh, mask=hmask, other=0.0)
    angle = p[:, None] * f[None, :]
    c = tl.cos(angle)
    s = tl.sin(angle)
    if SCALED:
        c = c * magnitude
        s = s * magnitude
    offs = rt[:, None].to(tl.int64) * HALF + rh[None, :]
    mask = tmask[:, None] & hmask[None, :]
    tl.store(cos_ptr + offs, c, mask=mask)
    tl.store(sin_ptr + offs, s, mask=mask)


def rope_tables(positions: torch.Tensor, *, rotary_dim: int, base: float,
                scaling: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``rope_tables``: positions [T] integer -> (cos, sin), each [T, rotary_dim / 2]
    fp32 on positions' device, in one launch."""
    if positions.dim() != 1 or positions.is_floating_point() or positions.is_complex():
        raise ValueError(f"rope_tables: positions must be a 1-D integer tensor, got "
                         f"{positions.dtype} of shape {tuple(positions.shape)}")
    inv_freq, magnitude = _device_inv_freq(rotary_dim, base, scaling, positions.device)
    t, half = positions.shape[0], inv_freq.shape[0]
    cos = torch.empty((t, half), dtype=torch.float32, device=positions.device)
    sin = torch.empty_like(cos)
    if t == 0:
        return cos, sin
    pos = positions if positions.stride(0) == 1 else positions.contiguous()
    block_h = triton.next_power_of_2(half)
    block_t = max(1, min(64, 4096 // block_h))
    _rope_tables_kernel[(triton.cdiv(t, block_t),)](
        pos, inv_freq, cos, sin, t, half, float(magnitude),
        BLOCK_T=block_t, BLOCK_H=block_h, SCALED=magnitude != 1.0, num_warps=4)
    return cos, sin


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    sig = {"pos_ptr": "*i64", "inv_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
           "T": "i32", "HALF": "i32", "magnitude": "fp32", "BLOCK_T": "constexpr",
           "BLOCK_H": "constexpr", "SCALED": "constexpr"}
    # Qwen3.5 (32 frequencies), DeepSeek-V4's compressed layers (YaRN magnitude path)
    return [AotSpec("rope_tables[half32]", _rope_tables_kernel, sig,
                    {"BLOCK_T": 64, "BLOCK_H": 32, "SCALED": False}),
            AotSpec("rope_tables[half32,scaled]", _rope_tables_kernel, sig,
                    {"BLOCK_T": 64, "BLOCK_H": 32, "SCALED": True})]


AOT_SPECS = _aot_specs()
