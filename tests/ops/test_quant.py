"""Quant family: hand-decoded bytes, quantizer optimality / error bounds, bit-exact oracles
(transformers' FP8/FP4 dequantizers, compressed-tensors' unpacker when installed), bad inputs."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from hwinfer.ops.quant import (
    decode_e2m1, dequant_fp4, dequant_fp8_block, linear_fp4, linear_fp8_block, scale_to_float,
)
from hwinfer.ops.quant_pack import encode_e2m1, quantize_fp4, quantize_fp8_block

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------- hand cases


def test_e8m0_bytes():
    b = torch.tensor([127, 128, 126, 0, 254, 255], dtype=torch.uint8)
    want = [1.0, 2.0, 0.5, 2.0 ** -127, 2.0 ** 127]
    for container in (b, b.view(torch.float8_e8m0fnu)):
        got = scale_to_float(container)
        assert got[:5].tolist() == want
        assert math.isnan(got[5].item())


def test_e2m1_code_table():
    assert decode_e2m1(torch.arange(16)).tolist() == E2M1 + [-v for v in E2M1]
    assert str(decode_e2m1(torch.tensor([8])).item()) == "-0.0"


def test_fp4_known_bytes():
    # 0x21: low nibble 1 -> 0.5 (column 0), high nibble 2 -> 1.0 (column 1); 0x8F: -6, -0.
    row = torch.tensor([0x21, 0x8F] + [0x00] * 14, dtype=torch.uint8)[None]
    for scale_byte, mult in ((127, 1.0), (128, 2.0), (125, 0.25)):
        out = dequant_fp4(row, torch.tensor([[scale_byte]], dtype=torch.uint8))
        assert out[0, :4].tolist() == [0.5 * mult, 1.0 * mult, -6.0 * mult, -0.0]
        assert out.shape == (1, 32) and not out[0, 4:].any()
    # The same bytes in DeepSeek-V4's int8 container decode identically.
    assert torch.equal(dequant_fp4(row.view(torch.int8), torch.tensor([[128]], dtype=torch.uint8)),
                       dequant_fp4(row, torch.tensor([[128]], dtype=torch.uint8)))


def test_fp4_group_scales_apply_per_32_columns():
    w = torch.full((2, 32), 0x22, dtype=torch.uint8)  # every value 1.0
    s = torch.tensor([[127, 129], [126, 130]], dtype=torch.uint8)
    out = dequant_fp4(w, s)
    expect = torch.tensor([[1.0] * 32 + [4.0] * 32, [0.5] * 32 + [8.0] * 32])
    assert torch.equal(out, expect)


def test_fp8_partial_tiles_use_their_own_scale():
    n, k = 130, 129
    w = torch.full((n, k), 1.0).to(torch.float8_e4m3fn)  # byte 0x38
    assert w.view(torch.uint8)[0, 0].item() == 0x38
    s = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    out = dequant_fp8_block(w, s)
    for r, c in itertools.product((0, 127, 128, 129), (0, 127, 128)):
        assert out[r, c].item() == s[r // 128, c // 128].item()
    ue = dequant_fp8_block(w, torch.tensor([[127, 128], [129, 1]], dtype=torch.uint8))
    assert ue[129, 128].item() == 2.0 ** -126 and ue[0, 128].item() == 2.0


def test_encode_e2m1_ties_to_even():
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.26, 6.0])
    assert encode_e2m1(v).tolist() == [0, 2, 2, 4, 4, 6, 6, 8, 14, 1, 7]


# ------------------------------------------------------------------------ quantizer properties


def test_fp4_quantizer_picks_the_nearest_value():
    w = torch.randn(16, 128, generator=_gen(1)) * torch.logspace(-3, 1, 16)[:, None]
    packed, scale = quantize_fp4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (16, 64)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (16, 4)
    deq = dequant_fp4(packed, scale)
    s = scale_to_float(scale).repeat_interleave(32, dim=-1)
    grid = torch.tensor(E2M1 + [-v for v in E2M1])
    best = (w[..., None] - grid * s[..., None]).abs().min(dim=-1).values  # brute force
    assert torch.equal((w - deq).abs(), best)
    # No saturation: amax / scale <= 6 and the scale is the smallest power of two doing so.
    amax = w.view(16, 4, 32).abs().amax(-1)
    s4 = scale_to_float(scale)
    assert (amax / s4 <= 6).all() and (amax / s4 > 3).all()


def test_fp4_error_bound():
    w = torch.randn(8, 256, generator=_gen(2))
    packed, scale = quantize_fp4(w)
    s = scale_to_float(scale).repeat_interleave(32, dim=-1)
    a = w.abs() / s
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    assert ((w - dequant_fp4(packed, scale)).abs() <= step * s / 2).all()


@pytest.mark.parametrize("fmt", ["ue8m0", "fp32"])
def test_fp8_quantizer_nearest_and_bound(fmt):
    w = torch.randn(200, 300, generator=_gen(3)) * 0.02
    w[:, 256:] *= 50.0  # a column band with much larger scale
    w[128:, :128] = 0.0  # an all-zero tile -> scale 1
    q, scale = quantize_fp8_block(w, scale_format=fmt)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (2, 3)
    assert scale.dtype == (torch.float8_e8m0fnu if fmt == "ue8m0" else torch.float32)
    s_full = scale_to_float(scale).repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    assert scale_to_float(scale)[1, 0].item() == 1.0
    deq = dequant_fp8_block(q, scale)
    bound = torch.maximum(w.abs() * 2.0 ** -4, s_full * 2.0 ** -10)
    assert ((w - deq).abs() <= bound).all()
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()]
    sub = (slice(0, 40), slice(250, 300))  # brute-force nearest on a patch spanning two tiles
    cand = values * s_full[sub][..., None]
    best = (w[sub][..., None] - cand).abs().min(dim=-1).values
    assert torch.allclose((w - deq)[sub].abs(), best, rtol=0, atol=0)


def test_fp8_ue8m0_scale_is_smallest_power_of_two():
    w = torch.randn(256, 256, generator=_gen(4))
    q, scale = quantize_fp8_block(w)
    amax = w.view(2, 128, 2, 128).abs().amax(dim=(1, 3))
    s = scale_to_float(scale)
    assert (amax / s <= 448).all() and (amax / s > 224).all()


# ---------------------------------------------------------------------------- oracle: HF et al.


def _hf_fp8_dequantizer():
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    return fp8.Fp8Dequantize(hf_quantizer=None)


@pytest.mark.parametrize("fmt,container", [("ue8m0", "e8m0"), ("ue8m0", "uint8"), ("fp32", "fp32")])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp8_matches_transformers(fmt, container, out_dtype):
    hf = _hf_fp8_dequantizer()
    w = torch.randn(3, 256, 384, generator=_gen(5)) * torch.logspace(-4, 2, 384)
    q, scale = quantize_fp8_block(w, scale_format=fmt)
    if container == "uint8":
        scale = scale.view(torch.uint8)
    ours = dequant_fp8_block(q, scale, out_dtype=out_dtype)
    theirs = hf._dequantize_one(q, scale, output_dtype=out_dtype)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp4_matches_transformers_fp8_integration(out_dtype):
    hf = _hf_fp8_dequantizer()
    w = torch.randn(4, 96, 256, generator=_gen(6)) * torch.logspace(-3, 1, 256)
    packed, scale = quantize_fp4(w)
    int8 = packed.view(torch.int8)  # DeepSeek-V4's container; HF's FP4 path keys on int8
    ours = dequant_fp4(int8, scale, out_dtype=out_dtype)
    theirs = hf._dequantize_one(int8, scale, output_dtype=out_dtype)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp4_matches_transformers_mxfp4(out_dtype):
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    e, rows, k = 3, 40, 128
    w = torch.randn(e, rows, k, generator=_gen(7))
    packed, scale = quantize_fp4(w)
    blocks = packed.view(e, rows, k // 32, 16)  # GPT-OSS layout: 16 bytes per 32-group
    theirs = mx.convert_moe_packed_tensors(blocks, scale.view(torch.uint8), dtype=out_dtype)
    ours = dequant_fp4(packed, scale, out_dtype=out_dtype).transpose(1, 2)
    assert torch.equal(ours, theirs)


def test_fp4_matches_compressed_tensors_unpack():
    ct = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
    packed, _ = quantize_fp4(torch.randn(8, 64, generator=_gen(8)))
    ones = torch.full((8, 2), 127, dtype=torch.uint8)
    theirs = ct.unpack_fp4_from_uint8(packed, 8, 64, dtype=torch.float32)
    assert torch.equal(dequant_fp4(packed, ones), theirs)


# ------------------------------------------------------------------------- linears, containers


def test_linears_are_matmuls_with_the_dequantized_weight():
    g = _gen(9)
    x = torch.randn(2, 3, 256, generator=g)
    w = torch.randn(96, 256, generator=g) * 0.05
    bias = torch.randn(96, generator=g)
    q, s = quantize_fp8_block(w, scale_format="fp32")
    want = x.double() @ dequant_fp8_block(q, s).double().T + bias.double()
    assert torch.allclose(linear_fp8_block(x, q, s, bias).double(), want, rtol=1e-5, atol=1e-5)
    p, ps = quantize_fp4(w)
    want = x.double() @ dequant_fp4(p, ps).double().T
    got = linear_fp4(x, p.view(torch.int8), ps)
    assert got.shape == (2, 3, 96) and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)


def test_uint8_and_fp4x2_containers():
    w = torch.randn(64, 64, generator=_gen(10))
    q, s = quantize_fp8_block(w)
    assert torch.equal(dequant_fp8_block(q.view(torch.uint8), s), dequant_fp8_block(q, s))
    p, ps = quantize_fp4(w)
    fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4x2 is not None:
        assert torch.equal(dequant_fp4(p.view(fp4x2), ps), dequant_fp4(p, ps))


def test_empty_and_batched_shapes():
    assert dequant_fp8_block(torch.zeros(0, 200, dtype=torch.uint8),
                             torch.zeros(0, 2, dtype=torch.uint8)).shape == (0, 200)
    assert dequant_fp4(torch.zeros(2, 0, 16, dtype=torch.uint8),
                       torch.zeros(2, 0, 1, dtype=torch.uint8)).shape == (2, 0, 32)


def test_bad_inputs_raise():
    q, s = quantize_fp8_block(torch.randn(130, 260))
    with pytest.raises(ValueError, match="scale shape"):
        dequant_fp8_block(q, s[:1])
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        dequant_fp8_block(torch.zeros(130, 260), s)
    with pytest.raises(ValueError, match="block"):
        dequant_fp8_block(q, s, block=(0, 128))
    with pytest.raises(ValueError, match="float32, float8_e8m0fnu or uint8"):
        dequant_fp8_block(q, s.view(torch.uint8).to(torch.int32))
    with pytest.raises(ValueError, match="multiple of the 32"):
        dequant_fp4(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 0, dtype=torch.uint8))
    with pytest.raises(ValueError, match="packed FP4"):
        dequant_fp4(torch.zeros(4, 16), torch.zeros(4, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="x last dim"):
        linear_fp8_block(torch.zeros(2, 100), q, s)
    with pytest.raises(ValueError, match="scale_format"):
        quantize_fp8_block(torch.zeros(4, 4), scale_format="e4m3")
    with pytest.raises(ValueError, match="K % 32"):
        quantize_fp4(torch.zeros(4, 48))
