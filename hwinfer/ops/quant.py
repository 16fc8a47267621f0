"""Quantized-weight contracts: block-scaled FP8 (e4m3) and MX-style FP4 (e2m1) weights.

Formats (MODELS.md §7):

* **FP8 block** (DeepSeek-V4 dense linears, DeepSeek-V3-style FP8 of Qwen3.5 / GLM-5 / MiniMax-M3):
  weight ``[N, K]`` float8_e4m3fn, one scale per ``block = (b0, b1)`` tile (128 x 128) in a grid
  ``[ceil(N/b0), ceil(K/b1)]``; ``W[n, k] = q[n, k] * scale[n // b0, k // b1]``. The scale is a
  multiplier (HF's ``weight_scale_inv`` naming notwithstanding), either fp32 (``scale_fmt``
  float, §7.2) or UE8M0 (DeepSeek-V4 ``scale_fmt: ue8m0``, §7.1).
* **FP4** (DeepSeek-V4 routed experts; Kimi-K3 routed experts as compressed-tensors
  ``mxfp4-pack-quantized`` ``weight_packed`` / ``weight_scale``): two e2m1 codes per byte,
  ``[N, K/2]`` int8 or uint8, **low nibble = even column** (element 2j), high nibble = 2j+1;
  one UE8M0 scale per 32 consecutive inputs, ``[N, K/32]``. Code c: sign = bit 3, magnitude
  ``[0, 0.5, 1, 1.5, 2, 3, 4, 6][c & 7]`` (so 0x8 is -0). The compressed-tensors packing
  (``pack_fp4_to_uint8`` / ``unpack_fp4_from_uint8`` in compressed-tensors 0.20.1, read and run
  against ours) is byte-identical: same nibble order, same codes, ``weight_scale`` = biased exponent
  bytes. One layout serves both.
* **UE8M0** scale byte b: ``2^(b - 127)`` (byte 127 = 1.0, 128 = 2.0, 0 = 2^-127); byte 255 is
  NaN (OCP MX; torch's e8m0 cast agrees, transformers' uint8 path gives inf — no valid
  checkpoint holds it). Accepted as ``torch.float8_e8m0fnu`` or as raw ``uint8`` bytes; fp32 multipliers
  are accepted too (some releases keep power-of-two scales in fp32 containers).

Dequantization is exact: the product ``code * scale`` is formed in fp32 (exact for UE8M0 scales),
then cast once to ``out_dtype`` — bit-identical to transformers' ``Fp8Dequantize`` and
``convert_moe_packed_tensors`` (checked in tests/ops/test_quant.py).

Every op also accepts e4m3 weights and UE8M0 scales as raw ``uint8`` bytes (some releases and
compressed-tensors store them so); fixtures use the real float8 dtypes for FP8 weights and
alternate between ``float8_e8m0fnu`` and ``uint8`` for scales. The quantizers used by checkpoint
writers and case builders (``quantize_fp8_block``, ``quantize_fp4``) live in
:mod:`hwinfer.ops.quant_pack` and are re-exported here.
"""
from __future__ import annotations

import math

import torch

from hwinfer.ops.contract import EXACT, Case, Tol, define_op, fan_in_scale, randn
from hwinfer.ops.quant_pack import quantize_fp4, quantize_fp8_block

_FP4_TYPE = getattr(torch, "float4_e2m1fn_x2", None)


def scale_to_float(scale: torch.Tensor, what: str = "scale") -> torch.Tensor:
    """A scale tensor as fp32 multipliers: UE8M0 bytes (e8m0fnu or uint8) -> 2^(b-127), fp32 as is."""
    if scale.dtype == torch.float32:
        return scale
    if scale.dtype == torch.float8_e8m0fnu:
        scale = scale.view(torch.uint8)
    if scale.dtype != torch.uint8:
        raise ValueError(f"{what} must be float32, float8_e8m0fnu or uint8 (UE8M0 bytes), "
                         f"not {scale.dtype}")
    b = scale.to(torch.int32)
    # ldexp(1, b - 127) is exact for every byte 0..254 (2^-127 is an fp32 subnormal).
    value = torch.ldexp(torch.ones_like(b, dtype=torch.float32), b - 127)
    return torch.where(b == 255, torch.full_like(value, float("nan")), value)


def fp8_bytes_to_float(w: torch.Tensor, what: str = "w") -> torch.Tensor:
    """e4m3 weights (float8_e4m3fn, or the same bytes as uint8) as fp32 values (exact)."""
    if w.dtype == torch.uint8:
        w = w.view(torch.float8_e4m3fn)
    if w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{what} must be float8_e4m3fn (or its bytes as uint8), not {w.dtype}")
    return w.to(torch.float32)


def fp4_bytes(w: torch.Tensor, what: str = "w") -> torch.Tensor:
    """Packed e2m1 pairs as uint8 bytes (int8, uint8 and float4_e2m1fn_x2 containers)."""
    if w.dtype in (torch.int8, torch.uint8) or (_FP4_TYPE is not None and w.dtype == _FP4_TYPE):
        return w.view(torch.uint8)
    raise ValueError(f"{what} must be packed FP4 (int8, uint8 or float4_e2m1fn_x2), not {w.dtype}")


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes 0..15 -> fp32 by the format's definition (not a table).

    bit 3 sign, bits 1-2 exponent e (bias 1), bit 0 mantissa m:
    e = 0 -> 0.5 * m (subnormal); e > 0 -> 2^(e-1) * (1 + 0.5 * m).
    """
    c = codes.to(torch.int32)
    sign = 1.0 - 2.0 * ((c >> 3) & 1).to(torch.float32)
    e = (c >> 1) & 3
    m = (c & 1).to(torch.float32)
    normal = torch.ldexp(1.0 + 0.5 * m, e - 1)
    return sign * torch.where(e == 0, 0.5 * m, normal)


def check_fp8_grid(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                   op: str = "dequant_fp8_block") -> tuple[int, int]:
    """Validate w [..., N, K] against scale [..., ceil(N/b0), ceil(K/b1)]; returns (b0, b1)."""
    if len(block) != 2 or any(int(b) <= 0 for b in block):
        raise ValueError(f"{op}: block must be two positive ints, got {block!r}")
    b0, b1 = int(block[0]), int(block[1])
    if w.dim() < 2:
        raise ValueError(f"{op}: w must be [..., N, K], got shape {tuple(w.shape)}")
    n, k = w.shape[-2:]
    grid = (*w.shape[:-2], math.ceil(n / b0), math.ceil(k / b1))
    if tuple(scale.shape) != grid:
        raise ValueError(f"{op}: scale shape {tuple(scale.shape)} != {grid} for w {tuple(w.shape)} "
                         f"and block {(b0, b1)}")
    return b0, b1


def dequant_fp8_block(w: torch.Tensor, scale: torch.Tensor, *, block: tuple[int, int] = (128, 128),
                      out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Block-scaled FP8 weight -> dense: ``W[..., n, k] = q[..., n, k] * s[..., n // b0, k // b1]``.

    w: [..., N, K] float8_e4m3fn (or the bytes as uint8). scale: [..., ceil(N/b0), ceil(K/b1)]
    fp32 multipliers or UE8M0 (float8_e8m0fnu / uint8 bytes b -> 2^(b-127), b = 255 -> NaN),
    same leading dims as w (e.g. [E] for stacked experts). N, K need not be multiples of the
    block: the last partial tile uses its own scale. The product is formed in fp32 and cast
    once to ``out_dtype`` (exact for UE8M0 scales; with fp32 scales the one fp32 rounding is
    part of the contract, as in transformers).
    Used by every FP8 linear of DeepSeek-V4 (``scale_fmt: ue8m0``, ``weight_block_size``
    [128, 128]) and the FP8 releases of Qwen3.5 / GLM-5 / MiniMax-M3 (fp32 ``weight_scale_inv``).
    Returns [..., N, K] in out_dtype.
    """
    b0, b1 = check_fp8_grid(w, scale, block)
    n, k = w.shape[-2:]
    q = fp8_bytes_to_float(w)
    s = scale_to_float(scale)
    s_full = s.repeat_interleave(b0, dim=-2)[..., :n, :].repeat_interleave(b1, dim=-1)[..., :k]
    return (q * s_full).to(out_dtype)


def dequant_fp4(w: torch.Tensor, scale: torch.Tensor, *,
                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed FP4 (e2m1, 1x32 UE8M0 groups) -> dense: ``W[..., n, k] = e2m1(code) * s[..., n, k // 32]``.

    w: [..., N, K/2] int8 / uint8 / float4_e2m1fn_x2; byte j of a row holds column 2j in its low
    nibble and 2j+1 in its high nibble; code c -> sign bit 3, magnitude
    [0, .5, 1, 1.5, 2, 3, 4, 6][c & 7]. scale: [..., N, K/32] UE8M0 (float8_e8m0fnu / uint8
    bytes b -> 2^(b-127)) or fp32. K must be a multiple of 32. DeepSeek-V4 routed experts
    (``experts.E.w{1,2,3}.weight`` int8 + ``.scale`` e8m0) and Kimi-K3 routed experts
    (compressed-tensors ``weight_packed`` / ``weight_scale`` uint8) both use this layout.
    Product in fp32, cast once to ``out_dtype``. Returns [..., N, K] in out_dtype.
    """
    if w.dim() < 2:
        raise ValueError(f"dequant_fp4: w must be [..., N, K/2], got shape {tuple(w.shape)}")
    b = fp4_bytes(w)
    n, k = b.shape[-2], 2 * b.shape[-1]
    if k % 32:
        raise ValueError(f"dequant_fp4: K = {k} is not a multiple of the 32-wide scale group")
    grid = (*b.shape[:-2], n, k // 32)
    if tuple(scale.shape) != grid:
        raise ValueError(f"dequant_fp4: scale shape {tuple(scale.shape)} != {grid} for w {tuple(w.shape)}")
    low, high = decode_e2m1(b & 0xF), decode_e2m1(b >> 4)
    vals = torch.stack([low, high], dim=-1).reshape(*b.shape[:-1], k)
    s = scale_to_float(scale).repeat_interleave(32, dim=-1)
    return (vals * s).to(out_dtype)


def _linear(x: torch.Tensor, w32: torch.Tensor, bias: torch.Tensor | None, op: str) -> torch.Tensor:
    if x.dim() < 1 or x.shape[-1] != w32.shape[-1]:
        raise ValueError(f"{op}: x last dim {tuple(x.shape)[-1:]} != weight K {w32.shape[-1]}")
    if bias is not None and tuple(bias.shape) != (w32.shape[0],):
        raise ValueError(f"{op}: bias shape {tuple(bias.shape)} != ({w32.shape[0]},)")
    y = x.float() @ w32.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def linear_fp8_block(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None = None, *,
                     block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """``y = x @ dequant_fp8_block(w, scale)^T (+ bias)``, fp32 accumulation, y in x.dtype.

    x: [..., K] any float dtype; w: [N, K] e4m3 (or bytes as uint8); scale: [ceil(N/b0),
    ceil(K/b1)] fp32 / UE8M0; bias: [N] or None. Activations are *not* quantized (transformers'
    dequantize path; DeepSeek's FP8 activation quantization is not modelled, MODELS.md §9.5).
    Returns [..., N].
    """
    if w.dim() != 2:
        raise ValueError(f"linear_fp8_block: w must be [N, K], got shape {tuple(w.shape)}")
    return _linear(x, dequant_fp8_block(w, scale, block=block), bias, "linear_fp8_block")


def linear_fp4(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ dequant_fp4(w, scale)^T (+ bias)``, fp32 accumulation, y in x.dtype.

    x: [..., K]; w: [N, K/2] packed e2m1 (int8 / uint8); scale: [N, K/32] UE8M0; bias [N] or None.
    Returns [..., N].
    """
    if w.dim() != 2:
        raise ValueError(f"linear_fp4: w must be [N, K/2], got shape {tuple(w.shape)}")
    return _linear(x, dequant_fp4(w, scale), bias, "linear_fp4")


# ----------------------------------------------------------------------------------------------
# Cases: quantized weights come from random floats through the quantizers (quant_pack.py).


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """1-byte float tensors as their uint8 bytes (the container some checkpoints use)."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu) else t


def _fp8_weight(gen, shape, block, scale_format, device):
    w = randn(gen, *shape, dtype=torch.float32, device=torch.device("cpu"), scale=0.05)
    # Spread block magnitudes over a few octaves so scales differ from block to block.
    w = w * torch.exp2(torch.randint(-3, 4, shape[:-2] + (1, shape[-1]), generator=gen).float())
    q, s = quantize_fp8_block(w, block=block, scale_format=scale_format)
    return q.to(device), s.to(device)


def _fp4_weight(gen, shape, device, scale=0.05):
    w = randn(gen, *shape, dtype=torch.float32, device=torch.device("cpu"), scale=scale)
    packed, s = quantize_fp4(w)
    return packed.to(device), as_bytes(s).to(device)


def _dequant_fp8_case(shape, block, scale_format):
    def make(gen, dtype, device):
        w, s = _fp8_weight(gen, shape, block, scale_format, device)
        return {"w": w, "scale": s, "block": block, "out_dtype": dtype}
    return make


def _dequant_fp4_case(shape, int8):
    def make(gen, dtype, device):
        w, s = _fp4_weight(gen, shape, device)
        return {"w": w.view(torch.int8) if int8 else w, "scale": s, "out_dtype": dtype}
    return make


def _linear_fp8_case(t, n, k, with_bias, scale_format):
    def make(gen, dtype, device):
        w, s = _fp8_weight(gen, (n, k), (128, 128), scale_format, device)
        inputs = {"x": randn(gen, t, k, dtype=dtype, device=device), "w": w, "scale": s,
                  "block": (128, 128)}
        # The weights are ~0.05 * 2^[-3, 3]; rescale x so y stays O(1).
        inputs["x"] = inputs["x"] * fan_in_scale(k) * 8
        if with_bias:
            inputs["bias"] = randn(gen, n, dtype=dtype, device=device, scale=0.1)
        return inputs
    return make


def _linear_fp4_case(t, n, k, with_bias):
    def make(gen, dtype, device):
        w, s = _fp4_weight(gen, (n, k), device, scale=fan_in_scale(k))
        inputs = {"x": randn(gen, t, k, dtype=dtype, device=device), "w": w, "scale": s}
        if with_bias:
            inputs["bias"] = randn(gen, n, dtype=dtype, device=device, scale=0.1)
        return inputs
    return make


_LIN_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)}

DEQUANT_FP8_BLOCK = define_op(
    dequant_fp8_block,
    cases=[
        Case("dsv4_ue8m0_256x384", _dequant_fp8_case((256, 384), (128, 128), "ue8m0")),
        Case("v3_fp32_partial_200x300", _dequant_fp8_case((200, 300), (128, 128), "fp32")),
        Case("experts_ue8m0_4x256x160", _dequant_fp8_case((4, 256, 160), (128, 128), "ue8m0")),
    ],
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT},
)

DEQUANT_FP4 = define_op(
    dequant_fp4,
    cases=[
        Case("dsv4_expert_int8_128x256", _dequant_fp4_case((128, 256), int8=True)),
        Case("k3_experts_uint8_4x96x128", _dequant_fp4_case((4, 96, 128), int8=False)),
    ],
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT},
)

LINEAR_FP8_BLOCK = define_op(
    linear_fp8_block,
    cases=[
        Case("dsv4_wq_a_ue8m0", _linear_fp8_case(7, 256, 384, False, "ue8m0")),
        Case("v3_fp32_partial_bias", _linear_fp8_case(5, 200, 300, True, "fp32")),
    ],
    tolerance=_LIN_TOL,
)

LINEAR_FP4 = define_op(
    linear_fp4,
    cases=[
        Case("dsv4_expert_proj", _linear_fp4_case(6, 128, 256, False)),
        Case("bias", _linear_fp4_case(3, 96, 64, True)),
    ],
    tolerance=_LIN_TOL,
)
