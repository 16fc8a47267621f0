"""Dense linear layers: ``linear`` (every projection of every model goes through it).

A separate op so a backend can serve the shapes its vendor library handles poorly: at decode
batch sizes (a few rows) the GEMM is a weight-bandwidth-bound matrix-vector product. NVIDIA and
AMD run a Triton GEMV for those where it measures faster than the vendor BLAS on the device
(hwinfer/kernels/triton/gemv.py), F.linear otherwise; the other backends run F.linear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.contract import Case, Tol, define_op, randn


def check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2:
        raise ValueError(f"linear: weight must be [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x [..., K] with K = {weight.shape[1]} expected, got shape "
                         f"{tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x W^T (+ b)``: every ``Linear`` layer (projections, MLPs, lm_head).

    Shapes: x [..., K] any float dtype; weight [N, K] (the checkpoint's ``*.weight``, dequantized
    at load); bias [N] or None. Products accumulate in fp32; y [..., N] in x.dtype. (torch's
    F.linear in bf16 does the same on GPUs; its CPU kernel may round differently, inside the
    tolerance.)
    """
    check_linear(x, weight, bias)
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def _case(m: int, k: int, n: int, bias: bool, lead: tuple[int, ...] = ()):
    def make(gen, dtype, device):
        shape = (*lead, m) if lead else (m,)
        inputs = {"x": randn(gen, *shape, k, dtype=dtype, device=device),
                  "weight": randn(gen, n, k, dtype=dtype, device=device, scale=k ** -0.5)}
        if bias:
            inputs["bias"] = randn(gen, n, dtype=dtype, device=device)
        return inputs
    return make


LINEAR = define_op(
    linear,
    cases=[
        Case("decode_m1", _case(1, 256, 384, False)),
        Case("decode_m3_bias", _case(3, 320, 200, True)),     # N, K not multiples of the tiles
        Case("batch_m16", _case(16, 512, 256, False)),
        Case("prefill_m96", _case(96, 128, 160, True)),
        Case("leading_dims", _case(5, 64, 48, False, lead=(2,))),
        Case("empty", _case(0, 64, 32, False)),
    ],
    # fp32: products summed in a different order (split K) differ by ~K ulp; bf16: one rounding.
    tolerance={torch.float32: Tol(atol=1e-5, rtol=1e-5), torch.bfloat16: Tol(atol=2e-2, rtol=2e-2)},
)
