"""Triton ``kv_store_fp8_ds_mla`` (contract: :func:`hwinfer.ops.kv_pack.kv_store_fp8_ds_mla`).

One program per row: load the 512 channels, the 7 NoPE groups' amax, UE8M0 exponents
``ceil(log2(amax / 448))`` read off the fp32 bits (exact at powers of two, as the reference's
frexp), the e4m3 bytes rounded to nearest-even with integer ops (no fp8 type: every target and
the interpreter), the RoPE channels as bf16 bits, then one store of the 584-byte row at
``rows[i]`` (skipped where ``mask[i]`` is false). Replaces the dozen elementwise kernels, the
gather and the scatter of the torch composition in every DeepSeek-V4 decode step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.ops.kv_pack import FP8_DS_BYTES, _flat_store


@triton.jit
def _e4m3_bytes(v):
    """|v| <= 448 fp32 -> e4m3fn bytes, round to nearest even (torch's cast after the clamp)."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 128
    mag = tl.abs(v)
    # subnormal range (< 2^-6): the byte is round(|v| * 2^9); 8 there is the smallest normal
    sub = (mag * 512.0).to(tl.int32)            # truncation; then round half to even
    frac = mag * 512.0 - sub.to(tl.float32)       # exact: |v| * 2^9 < 8 has 21 fraction bits
    sub = sub + ((frac > 0.5) | ((frac == 0.5) & ((sub & 1) == 1))).to(tl.int32)
    # normal range: exponent E in [-6, 8], 3 mantissa bits kept, the carry may bump E
    e = ((bits >> 23) & 255) - 127
    m = bits & 0x7FFFFF
    keep = m >> 20
    rest = m & 0xFFFFF
    up = (rest > 0x80000) | ((rest == 0x80000) & ((keep & 1) == 1))
    normal = ((e + 7) << 3) + keep + up.to(tl.int32)
    return (sign | tl.where(mag < 0.015625, sub, normal)).to(tl.uint8)


@triton.jit
def _ceil_log2(y):
    """Exact ceil(log2(y)) for y > 0 fp32, clamped to [-127, 127] as the UE8M0 scale is."""
    bits = y.to(tl.int32, bitcast=True)
    e = (bits >> 23) & 255
    m = bits & 0x7FFFFF
    normal = e - 127 + (m != 0).to(tl.int32)
    tiny = tl.where(m > 0x400000, -126, -127)  # subnormal y: above 2^-127 or not
    return tl.minimum(tl.where(e == 0, tiny, normal), 127)


@triton.jit
def _kv_store_kernel(x_ptr, store_ptr, rows_ptr, mask_ptr, stride_x, stride_row,
                     HAS_MASK: tl.constexpr):
    i = tl.program_id(0)
    if HAS_MASK:
        if tl.load(mask_ptr + i) == 0:
            return
    cols = tl.arange(0, 512)
    x = tl.load(x_ptr + i.to(tl.int64) * stride_x + cols).to(tl.float32)
    groups = tl.reshape(x, (8, 64))
    amax = tl.max(tl.abs(groups), axis=1)                        # [8]; group 7 is the RoPE part
    y = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    exp = tl.where(amax > 0, _ceil_log2(y), 0)                   # zero groups: scale 1
    inv = ((127 - exp) << 23).to(tl.float32, bitcast=True)      # 2^-exp, exact (|exp| <= 127)
    q = tl.reshape(groups * inv[:, None], (512,))
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    dest = store_ptr + tl.load(rows_ptr + i).to(tl.int64) * stride_row
    tl.store(dest + cols, _e4m3_bytes(q), mask=cols < 448)
    # RoPE channels 448..511: bf16, rounded to nearest even from fp32 (exact for bf16 input)
    bits = x.to(tl.int32, bitcast=True)
    half = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16)
    rope = (dest + 448).to(tl.pointer_type(tl.int16))
    tl.store(rope + (cols - 448), half, mask=cols >= 448)
    g = tl.arange(0, 8)
    tl.store(dest + 576 + g, tl.where(g < 7, exp + 127, 0).to(tl.uint8))  # byte 583: 0


def kv_store_fp8_ds_mla(x: torch.Tensor, store: torch.Tensor, rows: torch.Tensor,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, 512] float, store uint8 [..., 584], rows [N] integer, mask [N] bool or None ->
    store, with the rows written in place (see the module docstring)."""
    flat = _flat_store("kv_store_fp8_ds_mla", x, store, rows, mask)
    n = x.shape[0]
    if n:
        xc = x if x.stride(-1) == 1 else x.contiguous()
        m = mask if mask is not None else rows
        _kv_store_kernel[(n,)](xc, flat, rows, m, xc.stride(0), flat.stride(0),
                               HAS_MASK=mask is not None, num_warps=4)
    return store


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype, masked in (("bf16", False), ("bf16", True), ("fp32", True)):
        sig = {"x_ptr": f"*{dtype}", "store_ptr": "*u8", "rows_ptr": "*i64", "mask_ptr": "*i1",
               "stride_x": "i32", "stride_row": "i32", "HAS_MASK": "constexpr"}
        specs.append(AotSpec(f"kv_store_fp8_ds_mla[{dtype}{',mask' if masked else ''}]",
                             _kv_store_kernel, sig, {"HAS_MASK": masked}))
    return specs


AOT_SPECS = _aot_specs()
assert FP8_DS_BYTES == 584  # the kernel's byte offsets (448, 576) are this layout's
