"""Weight quantizers (plain functions, not ops): FP8 e4m3 with 128x128 block scales, FP4 e2m1 packed.

Used by the checkpoint writer and by the op fixtures (random floats -> quantized weights). The
layouts are those :mod:`hwinfer.ops.quant` dequantizes (MODELS.md §7); ``dequant(quantize(w))``
is the nearest representable weight up to the bounds stated below.

Scale choice (both formats): the scale is the smallest one that makes the block's largest
magnitude representable, ``amax / qmax`` (qmax = 448 for e4m3, 6 for e2m1), rounded *up* to a
power of two for UE8M0 (``2^ceil(log2(amax / qmax))``, DeepSeek's ``fast_round_scale`` rule), so
nothing saturates. The OCP MX recipe ``2^(floor(log2 amax) - 2)`` instead saturates the top of
the range; which rule a given release used is not recorded in the checkpoints, and dequantization
does not depend on it. All-zero blocks get scale 1 (byte 127). Exponents are clamped to the
UE8M0 range [-127, 127]. Inputs must be finite.
"""
from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
# Rounding boundaries between consecutive e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0..7).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ceil(log2(x)) for positive finite fp32 x (frexp avoids log2 rounding at 2^k)."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2^exponent, mantissa in [0.5, 1)
    return torch.where(mantissa == 0.5, exponent - 1, exponent)


def _pow2_scale(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 power-of-two scale, UE8M0 byte) with amax / scale <= qmax; zero blocks -> 1.0."""
    exp = torch.where(amax > 0, _ceil_log2(amax / qmax), torch.zeros_like(amax, dtype=torch.int32))
    exp = exp.clamp(-127, 127)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    return scale, (exp + 127).to(torch.uint8)


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = (128, 128),
                       scale_format: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w [..., N, K]`` to e4m3 with one scale per ``block`` tile (partial edge tiles ok).

    ``scale_format="ue8m0"``: scale ``2^ceil(log2(amax / 448))`` returned as
    ``torch.float8_e8m0fnu`` [..., ceil(N/b0), ceil(K/b1)] (DeepSeek-V4; ``.view(torch.uint8)``
    gives the bytes). ``"fp32"``: scale ``amax / 448`` as float32 (DeepSeek-V3 style
    ``weight_scale_inv``). Values are ``w / scale`` rounded to nearest-even e4m3 (torch's cast),
    clamped to +-448. Error bound per element: ``|w - deq| <= max(2^-4 |w|, 2^-10 scale)``
    (half an e4m3 ulp; 2^-10 is half the smallest subnormal step). Returns (q [..., N, K]
    float8_e4m3fn, scale).
    """
    if scale_format not in ("ue8m0", "fp32"):
        raise ValueError(f"scale_format must be 'ue8m0' or 'fp32', not {scale_format!r}")
    if w.dim() < 2:
        raise ValueError(f"quantize_fp8_block: w must be [..., N, K], got shape {tuple(w.shape)}")
    b0, b1 = int(block[0]), int(block[1])
    n, k = w.shape[-2:]
    g0, g1 = math.ceil(n / b0), math.ceil(k / b1)
    w32 = w.float()
    padded = torch.nn.functional.pad(w32, (0, g1 * b1 - k, 0, g0 * b0 - n))
    tiles = padded.reshape(*w.shape[:-2], g0, b0, g1, b1)
    amax = tiles.abs().amax(dim=(-3, -1))  # [..., g0, g1]
    if scale_format == "ue8m0":
        scale32, byte = _pow2_scale(amax, E4M3_MAX)
        scale_out = byte.view(torch.float8_e8m0fnu)
    else:
        scale32 = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        scale_out = scale32
    full = scale32.repeat_interleave(b0, dim=-2)[..., :n, :].repeat_interleave(b1, dim=-1)[..., :k]
    q = (w32 / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale_out


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (|v| <= 6 after scaling) -> e2m1 codes 0..15 (uint8), round-to-nearest-even.

    A tie goes to the code with an even mantissa bit (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
    1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). Sign bit = ``v < 0`` (tiny negatives give -0, code 8).
    """
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.int32)
    for i, mid in enumerate(_E2M1_MIDPOINTS):
        # Boundary between code i and i+1: a tie rounds up only when i is odd (i+1 even).
        code += (a >= mid if i % 2 else a > mid).to(torch.int32)
    code += 8 * (v < 0).to(torch.int32)
    return code.to(torch.uint8)


def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w [..., N, K]`` (K % 32 == 0) to packed e2m1 with one UE8M0 scale per 32 inputs.

    Scale ``2^ceil(log2(amax / 6))`` per 32-wide group of a row; codes by :func:`encode_e2m1`;
    byte j = code(2j) | code(2j+1) << 4 (low nibble = even column). Error bound per element:
    ``|w - deq| <= scale * step(|w| / scale) / 2`` with step 0.5 below 2, 1 in [2, 4), 2 in
    [4, 6]. Returns (packed [..., N, K/2] uint8 — ``.view(torch.int8)`` for DeepSeek-V4's int8
    container —, scale [..., N, K/32] float8_e8m0fnu — ``.view(torch.uint8)`` for Kimi-K3's
    ``weight_scale``).
    """
    if w.dim() < 2 or w.shape[-1] % 32:
        raise ValueError(f"quantize_fp4: w must be [..., N, K] with K % 32 == 0, got {tuple(w.shape)}")
    w32 = w.float()
    groups = w32.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    scale32, byte = _pow2_scale(groups.abs().amax(dim=-1), E2M1_MAX)
    codes = encode_e2m1(groups / scale32.unsqueeze(-1)).reshape(*w.shape[:-1], w.shape[-1] // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed, byte.view(torch.float8_e8m0fnu)
