"""Triton norm-then-project GEMVs for decode rows (contracts:
:func:`hwinfer.ops.dense.add_rms_norm_linear`, :func:`~hwinfer.ops.dense.add_rms_norm_linear_conv`,
:func:`~hwinfer.ops.dense.rms_norm_gated_linear`).

The whole-row GEMV of :mod:`.gemv` with the norm that precedes a projection as its prologue:
every program recomputes the norm of the few rows of x (K values each, from L2), which is
cheaper than the kernel boundary it removes (each one ~1-3 us in a decode step on the H200,
docs/kernels.md). ``add_rms_norm_linear`` also takes the gated MLP's activation as its epilogue
(output column n from gate row n and up row n + N of the merged gate|up weight), and
``add_rms_norm_linear_conv`` a linear-attention layer's causal conv + SiLU over the first C
output channels (each channel's state read and rewritten by the one program that computes that
channel, so the conv kernel between the projection and the recurrence goes). The roundings
follow the unfused ops exactly (the residual stream, the normed values and, gated, the two
products, each to x's dtype), so the fused and unfused paths agree to summation order.

Decode-sized 16-bit calls (<= 4 rows) run one kernel, with programmatic dependent launch on
sm_90+ (weights loaded before waiting on the previous kernel, :mod:`.pdl`); everything else runs
the Triton norm kernels and ``linear`` one after another.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET
from hwinfer.kernels.triton.activation import gated_act
from hwinfer.kernels.triton.conv import causal_conv1d, store_conv_state
from hwinfer.kernels.triton.gemv import MAX_ROWS, linear, rows_block_n, settled
from hwinfer.kernels.triton.norm import add_rms_norm, rms_norm_gated
from hwinfer.kernels.triton.pdl import pdl_enter, pdl_ok
from hwinfer.ops.dense import (check_norm_linear_conv, compose_add_rms_norm_linear,
                               compose_rms_norm_gated_linear)

# (W bytes a program holds, warps a program) per kernel kind. The fused kinds favour 128 W bytes
# a thread where the plain GEMV (gemv.rows_block_n) runs 64: fewer programs repeat the norm
# prologue. H200, one call at batch 1 per kind (scripts/bench_decode_chain.py --fused, 939cf8a,
# us at 16 KB x 8 warps -> these): norm 7.03 -> 6.20 (in_proj) / 4.47 -> 4.18 (qkv), gated
# 6.65 -> 5.51, gated_norm 2.78 -> 2.60, conv 7.76 -> 7.72; the 97 products chained as the
# model runs them 575 -> 520 us. In the model's step the gain is within noise (~5 us); 32 KB x 4
# warps everywhere, fastest per kind, made the step 7 us slower (docs/kernels.md, tenth session).
TILING: dict[str, tuple[int, int]] = {"norm": (32 << 10, 8), "gated": (32 << 10, 8),
                                      "conv": (16 << 10, 4), "gated_norm": (32 << 10, 8)}


@triton.jit
def _add_norm_gemv_kernel(x_ptr, r_ptr, nw_ptr, w_ptr, y_ptr, s_ptr, cw_ptr, cs_ptr, slot_ptr,
                          M, N, K, C, stride_xm, stride_rm, stride_wn, stride_ym, stride_sm,
                          stride_cwc, stride_cwk, stride_csn, stride_csc, stride_csk, eps, offset,
                          BLOCK_N: tl.constexpr, KP: tl.constexpr, MAX_M: tl.constexpr,
                          HAS_NORM_W: tl.constexpr, GATED: tl.constexpr, SILU: tl.constexpr,
                          CONV: tl.constexpr, CW: tl.constexpr, PDL: tl.constexpr):
    # The whole-row GEMV with add_rms_norm as its prologue (every program recomputes the norm of
    # the few rows of x: K values each, cheaper than a kernel boundary) and, GATED, gated_act as
    # its epilogue: output column n takes gate row n and up row n + N of W. The roundings follow
    # the unfused ops (s, h, the gate and up products to x's dtype). CONV: the causal conv (width
    # CW) + SiLU over output channels < C as the epilogue instead, each row continuing the state
    # row state_slots[m] of the pool in place; the program computing a channel is the only one
    # that reads or writes its state, so no other program can race it.
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, KP)
    nmask = rn < N
    kmask = rk < K
    wmask = nmask[:, None] & kmask[None, :]
    rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    w = tl.load(rows, mask=wmask, other=0.0)
    if GATED:
        wu = tl.load(rows + N * stride_wn, mask=wmask, other=0.0)
    if CONV:
        cmask = rn < C
        mr = tl.arange(0, MAX_M)
        slots = tl.load(slot_ptr + mr, mask=mr < M, other=0).to(tl.int64)
        # Every row's old state before any row's store (a repeated slot reads the old state):
        # p2, p1, p0 = the inputs one, two, three tokens back, [MAX_M, BLOCK_N]. Loaded before
        # the PDL wait, like W: no kernel of a decode step writes the slots or these state rows
        # but this one (the pool rows are rewritten below, by this program only), and a wait
        # after them would put a second round trip (slots, then state) on the critical path.
        sbase = cs_ptr + slots[:, None] * stride_csn + rn[None, :] * stride_csc
        smask = (mr < M)[:, None] & cmask[None, :]
        zero = tl.zeros((MAX_M, BLOCK_N), tl.float32)
        p2, p1, p0 = zero, zero, zero
        cwp = cw_ptr + rn * stride_cwc
        c3 = tl.load(cwp + (CW - 1) * stride_cwk, mask=cmask, other=0.0).to(tl.float32)
        c2, c1, c0 = c3 * 0.0, c3 * 0.0, c3 * 0.0
        if CW >= 2:
            p2 = tl.load(sbase + (CW - 2) * stride_csk, mask=smask, other=0.0).to(tl.float32)
            c2 = tl.load(cwp + (CW - 2) * stride_cwk, mask=cmask, other=0.0).to(tl.float32)
        if CW >= 3:
            p1 = tl.load(sbase + (CW - 3) * stride_csk, mask=smask, other=0.0).to(tl.float32)
            c1 = tl.load(cwp + (CW - 3) * stride_cwk, mask=cmask, other=0.0).to(tl.float32)
        if CW >= 4:
            p0 = tl.load(sbase + (CW - 4) * stride_csk, mask=smask, other=0.0).to(tl.float32)
            c0 = tl.load(cwp + (CW - 4) * stride_cwk, mask=cmask, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    if HAS_NORM_W:
        nw = tl.load(nw_ptr + rk, mask=kmask, other=0.0).to(tl.float32) + offset
    for m in tl.static_range(MAX_M):
        if m < M:
            x = tl.load(x_ptr + m * stride_xm + rk, mask=kmask, other=0.0).to(tl.float32)
            r = tl.load(r_ptr + m * stride_rm + rk, mask=kmask, other=0.0).to(tl.float32)
            s_lo = (x + r).to(s_ptr.dtype.element_ty)
            if pid == 0:
                tl.store(s_ptr + m * stride_sm + rk, s_lo, mask=kmask)
            s = s_lo.to(tl.float32)
            h = s / tl.sqrt(tl.sum(s * s, axis=0) / K + eps)
            if HAS_NORM_W:
                h = h * nw
            h = h.to(s_ptr.dtype.element_ty).to(tl.float32)
            y = tl.sum(w.to(tl.float32) * h[None, :], axis=1)
            if GATED:
                g = y.to(y_ptr.dtype.element_ty).to(tl.float32)
                u = tl.sum(wu.to(tl.float32) * h[None, :], axis=1)
                u = u.to(y_ptr.dtype.element_ty).to(tl.float32)
                if SILU:
                    y = g / (1.0 + tl.exp(-g)) * u
                else:  # gelu_tanh: 0.5 g (1 + tanh z) = g sigmoid(2 z)
                    z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
                    y = g / (1.0 + tl.exp(-2.0 * z)) * u
            if CONV:
                x0 = y.to(y_ptr.dtype.element_ty).to(tl.float32)   # the projection's rounding
                row = (mr == m)[:, None]
                a2 = tl.sum(tl.where(row, p2, 0.0), axis=0)
                a1 = tl.sum(tl.where(row, p1, 0.0), axis=0)
                a0 = tl.sum(tl.where(row, p0, 0.0), axis=0)
                yc = c3 * x0 + c2 * a2 + c1 * a1 + c0 * a0
                y = tl.where(cmask, yc / (1.0 + tl.exp(-yc)), y)
                sp = cs_ptr + tl.sum(tl.where(mr == m, slots, 0)) * stride_csn + rn * stride_csc
                store_conv_state(sp, stride_csk, a1, a2, x0, cmask, CW)
            tl.store(y_ptr + m * stride_ym + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor | None,
                        weight: torch.Tensor, *, eps: float = 1e-6, weight_offset: float = 0.0,
                        activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``add_rms_norm_linear`` (contract: :func:`hwinfer.ops.dense.add_rms_norm_linear`):
    x, residual [..., K], weight [N, K] -> (y [..., N] or [..., N/2] gated, x + residual).
    Decode-sized 16-bit calls (<= 4 rows, K <= 8192) are one whole-row GEMV with the norm as its
    prologue (PDL on sm_90+); other calls run the Triton add_rms_norm, ``linear`` and
    gated_act."""
    _check_norm_linear("add_rms_norm_linear", x, residual, weight, activation)
    k = x.shape[-1]
    x2, r2 = x.reshape(-1, k), residual.reshape(-1, k)
    if not _fusable(x, weight, x2.shape[0]):
        return compose_add_rms_norm_linear(add_rms_norm, linear, gated_act, x, residual,
                                           norm_weight, weight, eps=eps,
                                           weight_offset=weight_offset, activation=activation)
    y, s = _launch_add_norm_gemv(x2, r2, norm_weight, weight, eps, weight_offset, activation)
    return y.reshape(*x.shape[:-1], y.shape[-1]), s.reshape(x.shape)


def _check_norm_linear(op: str, x, residual, weight, activation) -> None:
    """The argument checks both norm-then-project wrappers make before choosing a path."""
    if activation not in (None, "silu", "gelu_tanh"):
        raise ValueError(f"{op}: activation must be None, 'silu' or 'gelu_tanh', not {activation!r}")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"{op}: residual {residual.dtype} {list(residual.shape)} "
                         f"must match x {x.dtype} {list(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1] or (activation and weight.shape[0] % 2):
        raise ValueError(f"{op}: weight [N, K={x.shape[-1]}] (N even when gated) "
                         f"expected, got {tuple(weight.shape)}")


def _fusable(x: torch.Tensor, weight: torch.Tensor, rows: int) -> bool:
    """Whether the one-kernel GEMV takes these (decode-sized, 16-bit, K <= 8192) calls."""
    return (0 < rows <= MAX_ROWS and x.shape[-1] <= 8192 and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.stride(1) == 1 and (x.is_cuda or INTERPRET))


def _launch_add_norm_gemv(x2, r2, norm_weight, weight, eps, weight_offset, activation, conv=None):
    """The fused kernel on x2, r2 [M, K]; ``conv`` = (conv_weight [C, W], pool, slots) or None."""
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
    m, k = x2.shape
    n = weight.shape[0] // 2 if activation else weight.shape[0]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    s = torch.empty((m, k), dtype=x2.dtype, device=x2.device)
    cw, pool, slots = conv if conv is not None else (y, y[None], y)   # dummies when not CONV
    tile, warps = TILING["conv" if conv is not None else "gated" if activation else "norm"]
    block_n = max(1, rows_block_n(n, k, tile) // (2 if activation else 1))
    pdl = pdl_ok(x2.device) and settled(weight)
    _add_norm_gemv_kernel[(triton.cdiv(n, block_n),)](
        x2, r2, norm_weight if norm_weight is not None else x2, weight, y, s, cw, pool, slots,
        m, n, k, pool.shape[1] if conv is not None else 0, x2.stride(0), r2.stride(0),
        weight.stride(0), y.stride(0), s.stride(0), cw.stride(0), cw.stride(1), pool.stride(0),
        pool.stride(1), pool.stride(2), eps, weight_offset,
        BLOCK_N=block_n, KP=triton.next_power_of_2(max(k, 16)), MAX_M=MAX_ROWS,
        HAS_NORM_W=norm_weight is not None, GATED=activation is not None,
        SILU=activation == "silu", CONV=conv is not None,
        CW=cw.shape[1] if conv is not None else 1, PDL=pdl, num_warps=warps,
        **({"launch_pdl": True} if pdl else {}))
    return y, s


def add_rms_norm_linear_conv(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor | None,
                             weight: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor,
                             state_slots: torch.Tensor, *, eps: float = 1e-6,
                             weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``add_rms_norm_linear_conv`` (contract: :func:`hwinfer.ops.dense.add_rms_norm_linear_conv`):
    x, residual [T, K], weight [N, K], conv_weight [C, W] / [C, 1, W], conv_state pool
    [S, C, W-1] (updated in place), state_slots [T] -> (y [T, N], x + residual). Decode-sized
    16-bit calls are one whole-row GEMV with the norm as its prologue and the conv as its
    epilogue; other calls run this module's add_rms_norm_linear, then the Triton conv writing
    over the projection's first C columns."""
    _check_norm_linear("add_rms_norm_linear_conv", x, residual, weight, None)
    check_norm_linear_conv(x, weight, conv_weight, conv_state, state_slots)
    cw = conv_weight[:, 0] if conv_weight.dim() == 3 else conv_weight
    if not _fusable(x, weight, x.shape[0]):
        # the unfused ops, the conv over the projection's first C columns in place (no copy)
        y, s = add_rms_norm_linear(x, residual, norm_weight, weight, eps=eps,
                                   weight_offset=weight_offset)
        if y.shape[0]:
            head = y[:, None, :cw.shape[0]]
            causal_conv1d(head, cw, None, conv_state, activation="silu", state_slots=state_slots,
                          out=head)
        return y, s
    return _launch_add_norm_gemv(x, residual, norm_weight, weight, eps, weight_offset, None,
                                 conv=(cw, conv_state, state_slots))


@triton.jit
def _gated_norm_gemv_kernel(x_ptr, z_ptr, nw_ptr, w_ptr, y_ptr, M, N, H, D, stride_xt, stride_xh,
                            stride_zt, stride_zh, stride_wn, stride_ym, eps,
                            BLOCK_N: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr,
                            MAX_M: tl.constexpr, HAS_NORM_W: tl.constexpr, SILU: tl.constexpr,
                            PDL: tl.constexpr):
    # The whole-row GEMV with rms_norm_gated as its prologue: row t of x and of the gate as
    # [H, D] tiles, each head normalised over its D channels, gated, rounded to x's dtype, then
    # flattened h * D + d in the order of W's columns.
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, HP * DP)
    col = (rk // DP) * D + rk % DP
    kmask = (rk // DP < H) & (rk % DP < D)
    nmask = rn < N
    w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * stride_wn + col[None, :],
                mask=nmask[:, None] & kmask[None, :], other=0.0)
    pdl_enter(PDL)
    hh = tl.arange(0, HP)[:, None]
    dd = tl.arange(0, DP)[None, :]
    m2 = (hh < H) & (dd < D)
    if HAS_NORM_W:
        nw = tl.load(nw_ptr + dd, mask=dd < D, other=0.0).to(tl.float32)
    for m in tl.static_range(MAX_M):
        if m < M:
            x = tl.load(x_ptr + m * stride_xt + hh * stride_xh + dd, mask=m2, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + m * stride_zt + hh * stride_zh + dd, mask=m2, other=0.0).to(tl.float32)
            h = x / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
            if HAS_NORM_W:
                h = h * nw
            sig = 1.0 / (1.0 + tl.exp(-z))
            if SILU:
                h = h * z * sig
            else:
                h = h * sig
            h = tl.reshape(h.to(y_ptr.dtype.element_ty).to(tl.float32), (HP * DP,))
            y = tl.sum(w.to(tl.float32) * h[None, :], axis=1)
            tl.store(y_ptr + m * stride_ym + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def rms_norm_gated_linear(x: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor | None,
                          weight: torch.Tensor, *, eps: float = 1e-6,
                          activation: str = "silu") -> torch.Tensor:
    """Triton ``rms_norm_gated_linear`` (contract: :func:`hwinfer.ops.dense.rms_norm_gated_linear`):
    x, gate [T, H, D], weight [N, H * D] -> [T, N]. Decode-sized 16-bit calls (<= 4 rows,
    H * D <= 8192 after rounding H and D up to powers of two) are one whole-row GEMV with the
    gated norm as its prologue (PDL on sm_90+); others run the Triton rms_norm_gated and
    ``linear``."""
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"rms_norm_gated_linear: activation must be 'silu' or 'sigmoid', not "
                         f"{activation!r}")
    if x.dim() != 3 or gate.shape != x.shape:
        raise ValueError(f"rms_norm_gated_linear: x and gate must be [T, H, D] of one shape, got "
                         f"{list(x.shape)} and {list(gate.shape)}")
    t, heads, d = x.shape
    if weight.dim() != 2 or weight.shape[1] != heads * d:
        raise ValueError(f"rms_norm_gated_linear: weight [N, {heads * d}] expected, got "
                         f"{tuple(weight.shape)}")
    hp, dp = triton.next_power_of_2(max(heads, 1)), triton.next_power_of_2(max(d, 1))
    fused = (0 < t <= MAX_ROWS and hp * dp <= 8192 and x.dtype in (torch.bfloat16, torch.float16)
             and weight.dtype == x.dtype and weight.stride(1) == 1
             and x.stride(-1) == 1 and gate.stride(-1) == 1 and (x.is_cuda or INTERPRET))
    if not fused:
        return compose_rms_norm_gated_linear(rms_norm_gated, linear, x, gate, norm_weight, weight,
                                             eps=eps, activation=activation)
    n = weight.shape[0]
    y = torch.empty((t, n), dtype=x.dtype, device=x.device)
    tile, warps = TILING["gated_norm"]
    block_n = rows_block_n(n, hp * dp, tile)
    pdl = pdl_ok(x.device) and settled(weight)
    _gated_norm_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, gate, norm_weight if norm_weight is not None else x, weight, y, t, n, heads, d,
        x.stride(0), x.stride(1), gate.stride(0), gate.stride(1), weight.stride(0), y.stride(0), eps,
        BLOCK_N=block_n, HP=hp, DP=dp, MAX_M=MAX_ROWS, HAS_NORM_W=norm_weight is not None,
        SILU=activation == "silu", PDL=pdl, num_warps=warps,
        **({"launch_pdl": True} if pdl else {}))
    return y


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("bf16", "fp16"):
        fused = {"x_ptr": f"*{dtype}", "r_ptr": f"*{dtype}", "nw_ptr": "*fp32", "w_ptr": f"*{dtype}",
                 "y_ptr": f"*{dtype}", "s_ptr": f"*{dtype}", "M": "i32", "N": "i32", "K": "i32",
                 "stride_xm": "i32", "stride_rm": "i32", "stride_wn": "i32", "stride_ym": "i32",
                 "stride_sm": "i32", "eps": "fp32", "offset": "fp32", "BLOCK_N": "constexpr",
                 "KP": "constexpr", "MAX_M": "constexpr", "HAS_NORM_W": "constexpr",
                 "GATED": "constexpr", "SILU": "constexpr", "CONV": "constexpr", "CW": "constexpr",
                 "PDL": "constexpr", "cw_ptr": f"*{dtype}", "cs_ptr": f"*{dtype}", "slot_ptr": "*i64",
                 "C": "i32", **{f"stride_{n}": "i32" for n in ("cwc", "cwk", "csn", "csc", "csk")}}
        # Qwen3.5's MLP (K 1024, gated) and its GDN input projection with the conv epilogue.
        # As specs (M a runtime value, no alignment hints) the conv form compiles to 110
        # registers a thread on sm_90; the JIT's batch-1 specialisation (M = 1, aligned
        # pointers) to 54, as the card reported (scripts/kernel_regs.py, docs/kernels.md).
        for kind, pdl in (("gated", False), ("gated", True), ("plain", True), ("conv", False),
                          ("conv", True)):
            specs.append(AotSpec(f"add_norm_gemv[{dtype},{kind}{',pdl' if pdl else ''}]",
                                 _add_norm_gemv_kernel, fused,
                                 {"BLOCK_N": 8, "KP": 1024,
                                  "MAX_M": MAX_ROWS, "HAS_NORM_W": True, "GATED": kind == "gated",
                                  "SILU": True, "CONV": kind == "conv", "CW": 4, "PDL": pdl},
                                 {"num_warps": 8}, ("sm_90", "sm_100") if pdl else None))
        gated = {"x_ptr": f"*{dtype}", "z_ptr": f"*{dtype}", "nw_ptr": "*fp32", "w_ptr": f"*{dtype}",
                 "y_ptr": f"*{dtype}", "M": "i32", "N": "i32", "H": "i32", "D": "i32",
                 "stride_xt": "i32", "stride_xh": "i32", "stride_zt": "i32", "stride_zh": "i32",
                 "stride_wn": "i32", "stride_ym": "i32", "eps": "fp32", "BLOCK_N": "constexpr",
                 "HP": "constexpr", "DP": "constexpr", "MAX_M": "constexpr",
                 "HAS_NORM_W": "constexpr", "SILU": "constexpr", "PDL": "constexpr"}
        for pdl in (False, True):   # Qwen3.5's GDN output: 16 heads x 128
            specs.append(AotSpec(f"gated_norm_gemv[{dtype},16x128{',pdl' if pdl else ''}]",
                                 _gated_norm_gemv_kernel, gated,
                                 {"BLOCK_N": 4, "HP": 16, "DP": 128, "MAX_M": MAX_ROWS,
                                  "HAS_NORM_W": True, "SILU": True, "PDL": pdl},
                                 {"num_warps": 8}, ("sm_90", "sm_100") if pdl else None))
    return specs


AOT_SPECS = _aot_specs()
