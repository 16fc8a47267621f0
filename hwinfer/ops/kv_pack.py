"""Packed latent-cache entries (plain functions, not ops): DeepSeek-V4's FP8 layout.

``fp8_ds_mla`` (vLLM's name; ENGINES.md "Cache layouts and bytes per token"): one 512-channel
latent entry (448 NoPE channels, then the 64 RoPE channels) in 584 bytes instead of 1,024:

* bytes 0-447: the NoPE channels as e4m3, channel c divided by the scale of its group c // 64;
* bytes 448-575: the RoPE channels as bf16 (little-endian, two bytes each);
* bytes 576-582: the 7 group scales as UE8M0 exponents (scale = 2^(byte - 127)); byte 583: 0.

Scales follow :mod:`hwinfer.ops.quant_pack`: ``2^ceil(log2(amax / 448))`` per group (nothing
saturates; an all-zero group gets scale 1). ``unpack`` is exact: every e4m3 value times a power
of two, and every bf16 value, is representable in bf16 and fp32.
"""
from __future__ import annotations

import torch

from hwinfer.ops.quant_pack import E4M3_MAX, _pow2_scale

FP8_DS_DIM, FP8_DS_NOPE, FP8_DS_BYTES = 512, 448, 584
_GROUP = 64


def pack_fp8_ds_mla(x: torch.Tensor) -> torch.Tensor:
    """x [..., 512] float (finite) -> [..., 584] uint8 (see the module docstring)."""
    if x.shape[-1] != FP8_DS_DIM or not x.is_floating_point():
        raise ValueError(f"pack_fp8_ds_mla: x must be a float [..., {FP8_DS_DIM}] tensor, got "
                         f"{x.dtype} {tuple(x.shape)}")
    lead = x.shape[:-1]
    x32 = x.float()
    nope = x32[..., :FP8_DS_NOPE].reshape(*lead, FP8_DS_NOPE // _GROUP, _GROUP)
    scale, byte = _pow2_scale(nope.abs().amax(dim=-1), E4M3_MAX)
    q = (nope / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    rope = x32[..., FP8_DS_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    pad = torch.zeros(*lead, 1, dtype=torch.uint8, device=x.device)
    return torch.cat((q.view(torch.uint8).reshape(*lead, FP8_DS_NOPE), rope, byte, pad), dim=-1)


def unpack_fp8_ds_mla(packed: torch.Tensor) -> torch.Tensor:
    """[..., 584] uint8 -> [..., 512] fp32, exact (see the module docstring)."""
    if packed.dtype != torch.uint8 or packed.shape[-1] != FP8_DS_BYTES:
        raise ValueError(f"unpack_fp8_ds_mla: expected uint8 [..., {FP8_DS_BYTES}], got "
                         f"{packed.dtype} {tuple(packed.shape)}")
    lead = packed.shape[:-1]
    groups = FP8_DS_NOPE // _GROUP
    q = packed[..., :FP8_DS_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    exp = packed[..., FP8_DS_BYTES - 8:FP8_DS_BYTES - 8 + groups].int() - 127
    scale = torch.ldexp(torch.ones(exp.shape, device=packed.device), exp)
    nope = (q.reshape(*lead, groups, _GROUP) * scale[..., None]).reshape(*lead, FP8_DS_NOPE)
    rope = packed[..., FP8_DS_NOPE:FP8_DS_BYTES - 8].contiguous().view(torch.bfloat16).float()
    return torch.cat((nope, rope), dim=-1)
