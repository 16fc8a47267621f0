"""Dense linear layers: ``linear`` (every projection of every model goes through it),
``add_rms_norm_linear`` (residual add + norm + projection) and ``rms_norm_gated_linear`` (gated
per-head norm + projection): one GEMV each in decode.

A separate op so a backend can serve the shapes its vendor library handles poorly: at decode
batch sizes (a few rows) the GEMM is a weight-bandwidth-bound matrix-vector product. NVIDIA and
AMD run a Triton GEMV for those where it measures faster than the vendor BLAS on the device
(hwinfer/kernels/triton/gemv.py), F.linear otherwise; the other backends run F.linear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.activation import gated_act
from hwinfer.ops.contract import Case, Tol, define_op, randn
from hwinfer.ops.norm import add_rms_norm, rms_norm_gated


def check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype | None = None) -> None:
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f"linear: out_dtype must be a float dtype, got {out_dtype}")
    if weight.dim() != 2:
        raise ValueError(f"linear: weight must be [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x [..., K] with K = {weight.shape[1]} expected, got shape "
                         f"{tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x W^T (+ b)``: every ``Linear`` layer (projections, MLPs, lm_head).

    Shapes: x [..., K] any float dtype; weight [N, K] (the checkpoint's ``*.weight``, dequantized
    at load); bias [N] or None. Products accumulate in fp32; y [..., N] rounded to x.dtype. (torch's
    F.linear in bf16 does the same on GPUs; its CPU kernel may round differently, inside the
    tolerance.) ``out_dtype`` (default x.dtype): the dtype y is returned in, converted from its
    x.dtype rounding: the lm_head's fp32 logits equal the bf16 ones the checkpoints' own code
    computes and casts, without a separate cast kernel where the implementation stores fp32.
    """
    check_linear(x, weight, bias, out_dtype)
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype).to(out_dtype or x.dtype)


def _case(m: int, k: int, n: int, bias: bool, lead: tuple[int, ...] = (),
          out_dtype: torch.dtype | None = None):
    def make(gen, dtype, device):
        shape = (*lead, m) if lead else (m,)
        inputs = {"x": randn(gen, *shape, k, dtype=dtype, device=device),
                  "weight": randn(gen, n, k, dtype=dtype, device=device, scale=k ** -0.5)}
        if bias:
            inputs["bias"] = randn(gen, n, dtype=dtype, device=device)
        if out_dtype is not None:
            inputs["out_dtype"] = out_dtype
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
        # The lm_head's fp32 logits (a decode row and a batch past the GEMV's rows).
        Case("logits_fp32_m1", _case(1, 192, 1000, False, out_dtype=torch.float32)),
        Case("logits_fp32_m8_bias", _case(8, 64, 130, True, out_dtype=torch.float32)),
    ],
    # fp32: products summed in a different order (split K) differ by ~K ulp; bf16: one rounding.
    tolerance={torch.float32: Tol(atol=1e-5, rtol=1e-5), torch.bfloat16: Tol(atol=2e-2, rtol=2e-2)},
)


def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor | None,
                        weight: torch.Tensor, *, eps: float = 1e-6, weight_offset: float = 0.0,
                        activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, RMSNorm, then a projection, optionally gated: the first half of a pre-norm
    sub-block, as one op so that a decode step can run it as one GEMV (the norm of a few rows is
    recomputed by every program of the product; no kernel in between).

    Exactly the composition ``h, s = add_rms_norm(x, residual, norm_weight, eps=eps,
    weight_offset=weight_offset)`` (h and s rounded to x.dtype), ``y = linear(h, weight)``
    (rounded to x.dtype), then with ``activation`` ("silu" / "gelu_tanh") ``y =
    gated_act(y[..., :N/2], y[..., N/2:])`` (the merged gate|up projection of a gated MLP).

    Shapes: x, residual [..., K] of one float dtype; norm_weight [K] or None; weight [N, K] (N
    even with ``activation``). Returns ``(y, s)``: y [..., N] (or [..., N/2]) and the residual
    stream s [..., K], both in x.dtype.

    Uses: Qwen3.5's dense decoder layers, both halves (the mixer's input projection,
    ``MergedProjection.add_norm``; the MLP's gate|up, ``GatedMLP.add_norm_forward``).
    """
    return compose_add_rms_norm_linear(add_rms_norm, linear, gated_act, x, residual, norm_weight,
                                       weight, eps=eps, weight_offset=weight_offset,
                                       activation=activation)


def compose_add_rms_norm_linear(add_norm, matmul, act, x, residual, norm_weight, weight, *, eps,
                                weight_offset, activation):
    """``add_rms_norm_linear`` from implementations of its three parts (``add_rms_norm``,
    ``linear``, ``gated_act``): the reference's definition, which impls reuse for the calls they
    do not fuse."""
    if activation is not None and weight.shape[0] % 2:
        raise ValueError(f"add_rms_norm_linear: a gated projection needs an even N, got "
                         f"weight {tuple(weight.shape)}")
    h, s = add_norm(x, residual, norm_weight, eps=eps, weight_offset=weight_offset)
    y = matmul(h, weight)
    if activation is not None:
        half = y.shape[-1] // 2
        y = act(y[..., :half], y[..., half:], activation=activation)
    return y, s


def _norm_linear_case(m: int, k: int, n: int, activation: str | None, offset: float = 0.0):
    def make(gen, dtype, device):
        return {"x": randn(gen, m, k, dtype=dtype, device=device),
                "residual": randn(gen, m, k, dtype=dtype, device=device, scale=3.0),
                "norm_weight": randn(gen, k, dtype=torch.float32, device=device, scale=0.1),
                "weight": randn(gen, n, k, dtype=dtype, device=device, scale=k ** -0.5),
                "weight_offset": offset, "activation": activation}
    return make


ADD_RMS_NORM_LINEAR = define_op(
    add_rms_norm_linear,
    cases=[
        Case("decode_m1_gated_silu", _norm_linear_case(1, 256, 384, "silu", offset=1.0)),
        Case("decode_m3_odd", _norm_linear_case(3, 200, 70, None)),
        Case("decode_m4_gelu", _norm_linear_case(4, 320, 96, "gelu_tanh")),
        Case("prefill_m24_gated", _norm_linear_case(24, 128, 160, "silu", offset=1.0)),
        Case("empty", _norm_linear_case(0, 64, 32, "silu")),
    ],
    # Three roundings to x.dtype (s, h, y) as in the composition; a fused kernel that sums the
    # products in another order moves y by about an ulp of bf16, and the gate's rounding by
    # another before the activation. The Triton interpreter truncates fp32 -> bf16 where GPUs
    # round: 4 ulps (5e-2 at 1.6) measured there, hence 3e-2 relative.
    tolerance={torch.float32: Tol(atol=1e-5, rtol=1e-5), torch.bfloat16: Tol(atol=3e-2, rtol=3e-2)},
)


def add_rms_norm_linear_conv(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor | None,
                             weight: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor,
                             state_slots: torch.Tensor, *, eps: float = 1e-6,
                             weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode prologue of a short-conv linear-attention layer (GDN, KDA) as one op: residual
    add, RMSNorm, the merged input projection, then the causal conv + SiLU over the projection's
    first C output channels, each row continuing its own request's conv state in place. One GEMV
    in decode: the conv is its epilogue (a channel's state belongs to the one program that
    computes that channel), so the conv kernel between the projection and the recurrence goes.

    Exactly the composition ``y, s = add_rms_norm_linear(x, residual, norm_weight, weight,
    eps=eps, weight_offset=weight_offset)`` (y rounded to x.dtype), then ``y[:, :C] =
    causal_conv1d(y[:, None, :C], conv_weight, None, conv_state, activation="silu",
    state_slots=state_slots)[0][:, 0]`` (every row one decode token of its own request). The
    other N - C channels (e.g. the output gate and the gate projections) pass through as the
    projection gives them.

    Shapes: x, residual [T, K] of one float dtype (T tokens, one per request); norm_weight [K] or
    None; weight [N, K]; conv_weight [C, W] or [C, 1, W] with C <= N and width W <= 4;
    conv_state the pool [S, C, W-1] (oldest input first) and state_slots [T] integer: row t reads
    and rewrites ``conv_state[state_slots[t]]`` **in place** (in the pool's dtype; a repeated
    slot, the padding of a fixed-size batch, gets one of its rows' results, as in causal_conv1d).
    Returns ``(y [T, N], s [T, K])`` in x.dtype.

    Uses: Qwen3.5's Gated DeltaNet decode (q|k|v convolved, z / b / a passed through).
    """
    from hwinfer.ops.conv import causal_conv1d

    return compose_add_rms_norm_linear_conv(add_rms_norm_linear, causal_conv1d, x, residual,
                                            norm_weight, weight, conv_weight, conv_state,
                                            state_slots, eps=eps, weight_offset=weight_offset)


def check_norm_linear_conv(x, weight, conv_weight, conv_state, state_slots) -> None:
    """Shape checks of ``add_rms_norm_linear_conv`` (no device sync)."""
    cw = conv_weight[:, 0] if conv_weight.dim() == 3 else conv_weight
    if x.dim() != 2:
        raise ValueError(f"add_rms_norm_linear_conv: x must be [T, K] (one decode token per "
                         f"request), got shape {tuple(x.shape)}")
    if cw.dim() != 2 or not 1 <= cw.shape[1] <= 4 or cw.shape[0] > weight.shape[0]:
        raise ValueError(f"add_rms_norm_linear_conv: conv_weight [C, W] with C <= N = "
                         f"{weight.shape[0]} and W <= 4 expected, got {tuple(conv_weight.shape)}")
    if conv_state.dim() != 3 or tuple(conv_state.shape[1:]) != (cw.shape[0], cw.shape[1] - 1):
        raise ValueError(f"add_rms_norm_linear_conv: conv_state must be a pool [S, {cw.shape[0]}, "
                         f"{cw.shape[1] - 1}], got {tuple(conv_state.shape)}")
    if (state_slots.dim() != 1 or state_slots.shape[0] != x.shape[0]
            or state_slots.is_floating_point() or state_slots.dtype == torch.bool):
        raise ValueError(f"add_rms_norm_linear_conv: state_slots must be [T={x.shape[0]}] "
                         f"integer, got {state_slots.dtype} {tuple(state_slots.shape)}")


def compose_add_rms_norm_linear_conv(norm_linear, conv, x, residual, norm_weight, weight,
                                     conv_weight, conv_state, state_slots, *, eps, weight_offset):
    """``add_rms_norm_linear_conv`` from implementations of ``add_rms_norm_linear`` and
    ``causal_conv1d``: the reference's definition, which impls reuse for the calls they do not
    fuse."""
    check_norm_linear_conv(x, weight, conv_weight, conv_state, state_slots)
    y, s = norm_linear(x, residual, norm_weight, weight, eps=eps, weight_offset=weight_offset)
    if x.shape[0] == 0:
        return y, s
    # every row a batch of its own (one token of one request): [T, 1, C]
    yc, _ = conv(y[:, None, :conv_state.shape[1]], conv_weight, None, conv_state,
                 activation="silu", state_slots=state_slots)
    y[:, :conv_state.shape[1]] = yc[:, 0]
    return y, s


def _norm_linear_conv_case(t: int, k: int, n: int, c: int, width: int, pool: int):
    def make(gen, dtype, device):
        inputs = _norm_linear_case(t, k, n, None, offset=1.0)(gen, dtype, device)
        del inputs["activation"]
        # a pool with spare rows; the requests use a scattered, reordered subset of them
        slots = torch.randperm(pool, generator=gen)[:t].to(device=device, dtype=torch.int32)
        inputs.update(conv_weight=randn(gen, c, 1, width, dtype=dtype, device=device, scale=width ** -0.5),
                      conv_state=randn(gen, pool, c, width - 1, dtype=dtype, device=device),
                      state_slots=slots)
        return inputs
    return make


ADD_RMS_NORM_LINEAR_CONV = define_op(
    add_rms_norm_linear_conv,
    cases=[
        Case("decode_m1", _norm_linear_conv_case(1, 256, 352, 192, 4, 3)),
        Case("decode_m4_pool", _norm_linear_conv_case(4, 128, 200, 136, 4, 7)),   # C off the tiles
        Case("decode_m3_w3_all_conv", _norm_linear_conv_case(3, 96, 64, 64, 3, 5)),
        Case("decode_m6_more_rows", _norm_linear_conv_case(6, 64, 80, 48, 4, 9)),  # past the GEMV's rows
        Case("empty", _norm_linear_conv_case(0, 64, 48, 32, 4, 2)),
    ],
    # add_rms_norm_linear's roundings, then the conv's fp32 sum over W bf16 inputs rounded once.
    tolerance={torch.float32: Tol(atol=1e-5, rtol=1e-5), torch.bfloat16: Tol(atol=3e-2, rtol=3e-2)},
    mutates=("conv_state",),
)


def rms_norm_gated_linear(x: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor | None,
                          weight: torch.Tensor, *, eps: float = 1e-6,
                          activation: str = "silu") -> torch.Tensor:
    """Gated per-head RMSNorm then a projection: the output of a Gated DeltaNet / KDA mixer, as
    one op so that a decode step runs it as one GEMV (the norm recomputed by every program).

    Exactly ``linear(rms_norm_gated(x, gate, norm_weight, eps=eps, activation=activation)
    .reshape(T, H * D), weight)`` (the normed values rounded to x.dtype before the product).

    Shapes: x, gate [T, H, D] of one float dtype (gate may be a strided view); norm_weight [D]
    or None; weight [N, H * D]. Returns [T, N] in x.dtype.

    Uses: Qwen3.5's Gated DeltaNet output (``norm`` + ``out_proj``, SiLU gate); the KDA output
    of Kimi-Linear and Kimi-K3 (``o_norm`` + ``o_proj``, sigmoid gate).
    """
    return compose_rms_norm_gated_linear(rms_norm_gated, linear, x, gate, norm_weight, weight,
                                         eps=eps, activation=activation)


def compose_rms_norm_gated_linear(gated_norm, matmul, x, gate, norm_weight, weight, *, eps,
                                  activation):
    """``rms_norm_gated_linear`` from implementations of ``rms_norm_gated`` and ``linear`` (the
    reference's definition; impls reuse it for the calls they do not fuse)."""
    if x.dim() != 3 or gate.shape != x.shape:
        raise ValueError(f"rms_norm_gated_linear: x and gate must be [T, H, D] of one shape, got "
                         f"{list(x.shape)} and {list(gate.shape)}")
    y = gated_norm(x, gate, norm_weight, eps=eps, activation=activation)
    return matmul(y.reshape(x.shape[0], x.shape[1] * x.shape[2]), weight)


def _gated_linear_case(t: int, heads: int, dim: int, n: int, activation: str):
    def make(gen, dtype, device):
        return {"x": randn(gen, t, heads, dim, dtype=dtype, device=device),
                "gate": randn(gen, t, heads, dim, dtype=dtype, device=device),
                "norm_weight": randn(gen, dim, dtype=torch.float32, device=device, scale=0.1) + 1.0,
                "weight": randn(gen, n, heads * dim, dtype=dtype, device=device,
                                scale=(heads * dim) ** -0.5),
                "eps": 1e-6, "activation": activation}
    return make


RMS_NORM_GATED_LINEAR = define_op(
    rms_norm_gated_linear,
    cases=[
        Case("decode_gdn_m1", _gated_linear_case(1, 4, 64, 96, "silu")),
        Case("decode_kda_m3", _gated_linear_case(3, 2, 32, 40, "sigmoid")),
        Case("prefill_m20", _gated_linear_case(20, 4, 32, 64, "silu")),
        Case("empty", _gated_linear_case(0, 2, 32, 16, "silu")),
    ],
    # two roundings to x.dtype (the normed values, y); the interpreter truncates where GPUs round
    tolerance={torch.float32: Tol(atol=1e-5, rtol=1e-5), torch.bfloat16: Tol(atol=3e-2, rtol=3e-2)},
)
