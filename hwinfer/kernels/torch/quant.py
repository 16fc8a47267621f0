"""Vectorised torch dequantization (contracts: :mod:`hwinfer.ops.quant`).

Every decode is one ``index_select`` with int32 byte indices into a small fp32 table built from
the reference decoders: FP4 from a 256 x 2 table (a byte -> its two e2m1 values, low nibble
first), e4m3 from a 256-entry table (~10x faster on CPU than torch's own e4m3 -> fp32 cast),
UE8M0 scales from a 256-entry table. Scales are then applied by a broadcast multiply over whole
groups / tiles instead of a materialised full-size scale tensor (FP8 edge tiles use their own
scale, as in the reference). Products are formed in fp32 and cast once, as the contract says,
so results are bit-identical to the references.
"""
from __future__ import annotations

import functools

import torch

from hwinfer.ops.quant import (
    check_fp8_grid, decode_e2m1, fp4_bytes, fp8_bytes_to_float, scale_to_float,
)


@functools.lru_cache(maxsize=None)
def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 tables on ``device``: FP4 pairs [256, 2] (low nibble first), UE8M0 [256], e4m3 [256]."""
    byte = torch.arange(256, dtype=torch.int32)
    pairs = torch.stack([decode_e2m1(byte & 0xF), decode_e2m1(byte >> 4)], dim=-1)
    e8m0 = scale_to_float(byte.to(torch.uint8))
    e4m3 = fp8_bytes_to_float(byte.to(torch.uint8))
    return pairs.to(device), e8m0.to(device), e4m3.to(device)


def _lookup(table: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """table[b] for uint8 b: [*b.shape, *table.shape[1:]] (int32 index_select: the fast gather)."""
    return table.index_select(0, b.reshape(-1).to(torch.int32)).view(*b.shape, *table.shape[1:])


def scale32(scale: torch.Tensor) -> torch.Tensor:
    """Scales as fp32 multipliers (UE8M0 bytes through the table; fp32 as is)."""
    if scale.dtype == torch.float32:
        return scale
    if scale.dtype == torch.float8_e8m0fnu:
        scale = scale.view(torch.uint8)
    if scale.dtype != torch.uint8:
        raise ValueError(f"scale must be float32, float8_e8m0fnu or uint8 (UE8M0 bytes), not {scale.dtype}")
    return _lookup(_tables(scale.device)[1], scale)


def dequant_fp4(w: torch.Tensor, scale: torch.Tensor, *,
                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Table-gather FP4 dequantization; same contract as :func:`hwinfer.ops.quant.dequant_fp4`."""
    b = fp4_bytes(w)
    if b.dim() < 2 or (2 * b.shape[-1]) % 32:
        raise ValueError(f"dequant_fp4: w must be [..., N, K/2] with K % 32 == 0, got {tuple(w.shape)}")
    n, k = b.shape[-2], 2 * b.shape[-1]
    if tuple(scale.shape) != (*b.shape[:-2], n, k // 32):
        raise ValueError(f"dequant_fp4: scale shape {tuple(scale.shape)} != {(*b.shape[:-2], n, k // 32)}")
    vals = _lookup(_tables(b.device)[0], b)  # [..., N, K/2, 2]
    vals = vals.view(*b.shape[:-1], k // 32, 32).mul_(scale32(scale).unsqueeze(-1))
    return vals.view(*b.shape[:-1], k).to(out_dtype)


def dequant_fp8_block(w: torch.Tensor, scale: torch.Tensor, *, block: tuple[int, int] = (128, 128),
                      out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Broadcast-multiply FP8 dequantization; same contract as
    :func:`hwinfer.ops.quant.dequant_fp8_block`."""
    b0, b1 = check_fp8_grid(w, scale, block)
    n, k = w.shape[-2:]
    if w.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(f"dequant_fp8_block: w must be float8_e4m3fn (or its bytes as uint8), not {w.dtype}")
    q = _lookup(_tables(w.device)[2], w.view(torch.uint8))
    # Scale rows expanded to N (small: N x ceil(K/b1)); columns broadcast over each full tile.
    s = scale32(scale).repeat_interleave(b0, dim=-2)[..., :n, :]
    full = k // b1
    if full:
        q[..., : full * b1].view(*q.shape[:-1], full, b1).mul_(s[..., :full, None])
    if k % b1:
        q[..., full * b1:].mul_(s[..., full:])
    return q.to(out_dtype)


def _linear(x: torch.Tensor, w32: torch.Tensor, bias: torch.Tensor | None, op: str) -> torch.Tensor:
    if x.shape[-1] != w32.shape[-1]:
        raise ValueError(f"{op}: x last dim {x.shape[-1]} != weight K {w32.shape[-1]}")
    b32 = bias.float() if bias is not None else None
    return torch.nn.functional.linear(x.float(), w32, b32).to(x.dtype)


def linear_fp8_block(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None = None, *,
                     block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """fp32 matmul with the table-dequantized weight (contract: ``hwinfer.ops.quant.linear_fp8_block``)."""
    if w.dim() != 2:
        raise ValueError(f"linear_fp8_block: w must be [N, K], got shape {tuple(w.shape)}")
    return _linear(x, dequant_fp8_block(w, scale, block=block), bias, "linear_fp8_block")


def linear_fp4(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 matmul with the table-dequantized weight (contract: ``hwinfer.ops.quant.linear_fp4``)."""
    if w.dim() != 2:
        raise ValueError(f"linear_fp4: w must be [N, K/2], got shape {tuple(w.shape)}")
    return _linear(x, dequant_fp4(w, scale), bias, "linear_fp4")
