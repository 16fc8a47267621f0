"""Triton hyper-connection ops (contracts: :mod:`hwinfer.ops.hyper_connection`).

Entries (``mhc_pre``, ``mhc_head``, ``ihc_pre``) run in two kernels:

* ``_hc_proj_kernel``, grid (token blocks, K splits): the projection ``flat(X) @ fn^T`` of
  BLOCK_T tokens over one range of the K = N*H channels as a ``tl.dot`` ([BT, BK] x [BK, RP],
  fn rows padded to RP >= 16), plus the sum of squares for the RMS factor. Each split writes its
  partial to fp32 scratch; splitting K keeps the GPU busy when T is small (decode, T = 1: the
  24 x 16384 fn is the bulk of the bytes and must be streamed by many programs).
* ``_hc_epilogue_kernel``, one program per token: sums the partials, applies the RMS factor
  (on the [rows] projection, not the [N*H] input: same math, no normalised copy), the sigmoids,
  the softmax + Sinkhorn iterations on the N x N comb matrix held in registers, and the collapse
  ``sum_i pre_i X_i`` (second read of the token's streams, which is L2-hot).

Exits (``mhc_post``, ``ihc_post``): one program per (token, H block), a single pass over the
residual: ``X'[k] = post_k y + sum_j comb[j, k] X_j`` (or ``+ X_k`` for iHC).

The projection's dots must be fp32-exact (tf32 would miss the 1e-5 contract tolerance): fp32
streams use input_precision="ieee"; bf16 streams (every deployed model) split the fp32 fn into
three bf16 parts and run three tensor-core dots (``_dot_split3``), exact products, fp32 sums.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_MODE = {"mhc_pre": 0, "mhc_head": 1, "ihc_pre": 2}


@triton.jit
def _dot_split3(xt, ft):
    """xt @ ft for xt exact in bf16 and ft fp32: ft = hi + mid + lo as three bf16 parts (24
    mantissa bits, the whole fp32 value), three bf16 tensor-core dots with fp32 accumulation:
    every product is exact, so this matches fp32 FMAs up to summation order."""
    xb = xt.to(tl.bfloat16)
    hi = ft.to(tl.bfloat16)
    rest = ft - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    return tl.dot(xb, hi) + tl.dot(xb, mid) + tl.dot(xb, lo)


@triton.jit
def _hc_proj_kernel(x_ptr, fn_ptr, part_ptr, sq_ptr, T, K, ROWS, k_steps,
                    BT: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr,
                    SPLIT3: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    toks = pid_t * BT + tl.arange(0, BT)
    tmask = toks < T
    rows = tl.arange(0, RP)
    rmask = rows < ROWS
    acc = tl.zeros([BT, RP], dtype=tl.float32)
    ssq = tl.zeros([BT], dtype=tl.float32)
    k_base = pid_s * k_steps * BK
    for i in range(0, k_steps):
        ks = k_base + i * BK + tl.arange(0, BK)
        kmask = ks < K
        xt = tl.load(x_ptr + toks.to(tl.int64)[:, None] * K + ks[None, :],
                     mask=tmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        ft = tl.load(fn_ptr + rows[None, :] * K + ks[:, None],
                     mask=rmask[None, :] & kmask[:, None], other=0.0).to(tl.float32)
        if SPLIT3:
            acc += _dot_split3(xt, ft)
        else:
            acc += tl.dot(xt, ft, input_precision="ieee")
        ssq += tl.sum(xt * xt, axis=1)
    out = part_ptr + (pid_s * T + toks)[:, None] * RP + rows[None, :]
    tl.store(out, acc, mask=tmask[:, None])
    tl.store(sq_ptr + pid_s * T + toks, ssq, mask=tmask)


@triton.jit
def _hc_epilogue_kernel(x_ptr, part_ptr, sq_ptr, base_ptr, scale_ptr, out_ptr, post_ptr,
                        comb_ptr, T, N, H, K, splits, iters, norm_eps, hc_eps, magnitude,
                        MODE: tl.constexpr, NP: tl.constexpr, RP: tl.constexpr,
                        BH: tl.constexpr, SP: tl.constexpr):
    # MODE 0 = mhc_pre (pre, post, comb), 1 = mhc_head (pre only), 2 = ihc_pre (pre, post).
    t = tl.program_id(0)
    i = tl.arange(0, NP)
    j = tl.arange(0, NP)
    imask = i < N
    cmask = imask[:, None] & (j < N)[None, :]
    cidx = 2 * N + i[:, None] * N + j[None, :]
    # All K-split partials in one load each (SP >= splits): a loop over up to 128 splits of
    # dependent loads took ~20 us per token at decode.
    sp = tl.arange(0, SP)
    spm = sp < splits
    ssq = tl.sum(tl.load(sq_ptr + sp * T + t, mask=spm, other=0.0), axis=0)
    rows = part_ptr + (sp * T + t) * RP
    zp = tl.sum(tl.load(rows[:, None] + i[None, :], mask=spm[:, None] & imask[None, :], other=0.0),
                axis=0)
    zq = tl.zeros([NP], dtype=tl.float32)
    zc = tl.zeros([NP, NP], dtype=tl.float32)
    if MODE != 1:
        zq = tl.sum(tl.load(rows[:, None] + N + i[None, :], mask=spm[:, None] & imask[None, :],
                            other=0.0), axis=0)
    if MODE == 0:
        zc = tl.sum(tl.load(rows[:, None, None] + cidx[None, :, :],
                            mask=spm[:, None, None] & cmask[None, :, :], other=0.0), axis=0)
    r = 1.0 / tl.sqrt(ssq / K + norm_eps)
    s0 = tl.load(scale_ptr)
    pre = tl.sigmoid(zp * r * s0 + tl.load(base_ptr + i, mask=imask, other=0.0)) + hc_eps
    pre = tl.where(imask, pre, 0.0)
    if MODE != 1:
        s1 = tl.load(scale_ptr + 1)
        g = tl.sigmoid(zq * r * s1 + tl.load(base_ptr + N + i, mask=imask, other=0.0))
        if MODE == 0:
            post = 2.0 * g
        else:
            post = magnitude * g + hc_eps
        tl.store(post_ptr + t * N + i, post, mask=imask)
    if MODE == 0:
        s2 = tl.load(scale_ptr + 2)
        logit = zc * r * s2 + tl.load(base_ptr + cidx, mask=cmask, other=0.0)
        logit = tl.where(cmask, logit, float("-inf"))
        e = tl.exp(logit - tl.max(logit, axis=1)[:, None])
        e = tl.where(cmask, e, 0.0)
        comb = tl.where(cmask, e / tl.sum(e, axis=1)[:, None] + hc_eps, 0.0)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
        for _ in range(1, iters):
            comb = comb / (tl.sum(comb, axis=1)[:, None] + hc_eps)
            comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
        tl.store(comb_ptr + t * N * N + i[:, None] * N + j[None, :], comb, mask=cmask)
    xrow = x_ptr + t.to(tl.int64) * K
    for h0 in range(0, H, BH):
        hs = h0 + tl.arange(0, BH)
        hmask = hs < H
        xt = tl.load(xrow + i[:, None] * H + hs[None, :], mask=imask[:, None] & hmask[None, :],
                     other=0.0).to(tl.float32)
        y = tl.sum(pre[:, None] * xt, axis=0)
        tl.store(out_ptr + t.to(tl.int64) * H + hs, y.to(out_ptr.dtype.element_ty), mask=hmask)


@triton.jit
def _hc_post_kernel(y_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, N, H,
                    MIX: tl.constexpr, NP: tl.constexpr, BH: tl.constexpr):
    t = tl.program_id(0)
    hs = tl.program_id(1) * BH + tl.arange(0, BH)
    hmask = hs < H
    k = tl.arange(0, NP)
    kmask = k < N
    m2 = kmask[:, None] & hmask[None, :]
    base = t.to(tl.int64) * N * H
    y = tl.load(y_ptr + t.to(tl.int64) * H + hs, mask=hmask, other=0.0).to(tl.float32)
    post = tl.load(post_ptr + t * N + k, mask=kmask, other=0.0).to(tl.float32)
    xt = tl.load(x_ptr + base + k[:, None] * H + hs[None, :], mask=m2, other=0.0).to(tl.float32)
    out = post[:, None] * y[None, :]
    if MIX:
        # comb[j, k] (rows j = input stream); out[k, h] += sum_j comb[j, k] * X[j, h].
        c = tl.load(comb_ptr + t * N * N + k[:, None] * N + k[None, :],
                    mask=kmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        out += tl.sum(c[:, :, None] * xt[:, None, :], axis=0)
    else:
        out += xt
    tl.store(out_ptr + base + k[:, None] * H + hs[None, :], out.to(out_ptr.dtype.element_ty),
             mask=m2)


def _entry(op: str, x, fn, base, scale, norm_eps, hc_eps, iters=1, magnitude=2.0,
           block_t: int | None = None, num_warps: int = 4):
    from hwinfer.ops.hyper_connection import _check_streams

    rows_of = {0: lambda n: (2 + n) * n, 1: lambda n: n, 2: lambda n: 2 * n}
    mode = _MODE[op]
    t, n, h = _check_streams(op, x, fn, base, scale, rows_of[mode], (3, 1, 2)[mode])
    x = x.contiguous()
    fn, base, scale = fn.contiguous(), base.float().contiguous(), scale.float().contiguous()
    rows, k = fn.shape
    out = torch.empty(t, h, dtype=x.dtype, device=x.device)
    post = torch.empty(t, n, dtype=torch.float32, device=x.device)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=x.device)
    if t == 0:
        return out, post, comb
    rp = max(16, triton.next_power_of_2(rows))
    bt = block_t or (16 if t <= 256 else 32)
    bk = 128
    t_blocks = triton.cdiv(t, bt)
    k_blocks = triton.cdiv(k, bk)
    # Enough programs to fill a GPU at small T; one split (no scratch round trip) at large T.
    splits = max(1, min(k_blocks, 256 // t_blocks))
    k_steps = triton.cdiv(k_blocks, splits)
    splits = triton.cdiv(k_blocks, k_steps)
    part = torch.empty(splits, t, rp, dtype=torch.float32, device=x.device)
    sq = torch.empty(splits, t, dtype=torch.float32, device=x.device)
    # bf16 streams: the fp32 fn meets them as three exact bf16 parts on tensor cores (the fp32
    # FMA dot made the prefill projection compute bound: 5 ms for 32k tokens on the H200).
    split3 = x.dtype == torch.bfloat16 and not INTERPRET
    _hc_proj_kernel[(t_blocks, splits)](x, fn, part, sq, t, k, rows, k_steps,
                                        BT=bt, BK=bk, RP=rp, SPLIT3=split3, num_warps=num_warps)
    bh = min(1024, triton.next_power_of_2(h))
    _hc_epilogue_kernel[(t,)](x, part, sq, base, scale, out, post, comb, t, n, h, k, splits,
                              iters, norm_eps, hc_eps, magnitude, MODE=mode,
                              NP=triton.next_power_of_2(n), RP=rp, BH=bh,
                              SP=triton.next_power_of_2(splits), num_warps=4)
    return out, post, comb


def mhc_pre(x, fn, base, scale, *, norm_eps: float, hc_eps: float, sinkhorn_iters: int):
    """x [T, N, H] -> (layer_input [T, H] x.dtype, post [T, N] fp32, comb [T, N, N] fp32)."""
    if sinkhorn_iters < 1:
        raise ValueError(f"mhc_pre: sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    return _entry("mhc_pre", x, fn, base, scale, norm_eps, hc_eps, iters=sinkhorn_iters)


def mhc_head(x, fn, base, scale, *, norm_eps: float, hc_eps: float):
    """x [T, N, H] -> [T, H] x.dtype (pre-weighted collapse)."""
    return _entry("mhc_head", x, fn, base, scale, norm_eps, hc_eps)[0]


def ihc_pre(x, fn, base, scale, *, norm_eps: float, hc_eps: float, hc_magnitude: float = 2.0):
    """x [T, N, H] -> (layer_input [T, H] x.dtype, post [T, N] fp32)."""
    out, post, _ = _entry("ihc_pre", x, fn, base, scale, norm_eps, hc_eps, magnitude=hc_magnitude)
    return out, post


def _exit(y, residual, post, comb, mix: bool):
    t, n, h = residual.shape
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    if t == 0:
        return out
    bh = min(1024, triton.next_power_of_2(h))
    _hc_post_kernel[(t, triton.cdiv(h, bh))](
        y.contiguous(), residual.contiguous(), post.contiguous(),
        comb.contiguous() if mix else post, out, n, h,
        MIX=mix, NP=triton.next_power_of_2(n), BH=bh, num_warps=4)
    return out


def mhc_post(y, residual, post, comb):
    """y [T, H], residual [T, N, H], post [T, N], comb [T, N, N] -> [T, N, H] residual.dtype."""
    if residual.dim() != 3 or tuple(y.shape) != (residual.shape[0], residual.shape[2]) \
            or tuple(post.shape) != residual.shape[:2] \
            or tuple(comb.shape) != (*residual.shape[:2], residual.shape[1]):
        raise ValueError("mhc_post: expected y [T, H], residual [T, N, H], post [T, N], "
                         "comb [T, N, N]")
    return _exit(y, residual, post, comb, True)


def ihc_post(y, residual, post):
    """y [T, H], residual [T, N, H], post [T, N] -> [T, N, H] residual.dtype."""
    if residual.dim() != 3 or tuple(y.shape) != (residual.shape[0], residual.shape[2]) \
            or tuple(post.shape) != residual.shape[:2]:
        raise ValueError("ihc_post: expected y [T, H], residual [T, N, H], post [T, N]")
    return _exit(y, residual, post, None, False)


def _dtype_problem(*tensors: torch.Tensor | None) -> str | None:
    for tt in tensors:
        if tt is not None and tt.dtype not in _FLOATS:
            return f"dtype {tt.dtype} not in fp16/bf16/fp32"
    return None


def hc_entry_supported(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                       scale: torch.Tensor, **_: object) -> str | None:
    """Per-call check for mhc_pre / mhc_head / ihc_pre: float inputs, at most 16 streams."""
    if x.dim() != 3 or x.shape[1] > 16:
        return f"streams must be [T, N <= 16, H], got {tuple(x.shape)}"
    if fn.dim() != 2 or fn.shape[0] > 512:
        return "fn must be [rows <= 512, N*H]"
    return _dtype_problem(x, fn, base, scale)


def hc_exit_supported(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                      comb: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check for mhc_post / ihc_post: float inputs, at most 16 streams."""
    if residual.dim() != 3 or residual.shape[1] > 16:
        return f"residual must be [T, N <= 16, H], got {tuple(residual.shape)}"
    return _dtype_problem(y, residual, post, comb)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        for bt in (16, 32):
            sig = {"x_ptr": f"*{dtype}", "fn_ptr": "*fp32", "part_ptr": "*fp32", "sq_ptr": "*fp32",
                   "T": "i32", "K": "i32", "ROWS": "i32", "k_steps": "i32",
                   "BT": "constexpr", "BK": "constexpr", "RP": "constexpr",
                   "SPLIT3": "constexpr"}
            specs.append(AotSpec(f"hc_proj[{dtype},{bt}]", _hc_proj_kernel, sig,
                                 {"BT": bt, "BK": 128, "RP": 32, "SPLIT3": dtype == "bf16"}))
        for mode in (0, 1, 2):
            sig = {"x_ptr": f"*{dtype}", "part_ptr": "*fp32", "sq_ptr": "*fp32",
                   "base_ptr": "*fp32", "scale_ptr": "*fp32", "out_ptr": f"*{dtype}",
                   "post_ptr": "*fp32", "comb_ptr": "*fp32", "T": "i32", "N": "i32", "H": "i32",
                   "K": "i32", "splits": "i32", "iters": "i32", "norm_eps": "fp32",
                   "hc_eps": "fp32", "magnitude": "fp32", "MODE": "constexpr", "NP": "constexpr",
                   "RP": "constexpr", "BH": "constexpr", "SP": "constexpr"}
            specs.append(AotSpec(f"hc_epilogue[{dtype},{mode}]", _hc_epilogue_kernel, sig,
                                 {"MODE": mode, "NP": 4, "RP": 32 if mode == 0 else 16,
                                  "BH": 1024, "SP": 128}))
        for mix in (True, False):
            sig = {"y_ptr": f"*{dtype}", "x_ptr": f"*{dtype}", "post_ptr": "*fp32",
                   "comb_ptr": "*fp32", "out_ptr": f"*{dtype}", "N": "i32", "H": "i32",
                   "MIX": "constexpr", "NP": "constexpr", "BH": "constexpr"}
            specs.append(AotSpec(f"hc_post[{dtype},{mix}]", _hc_post_kernel, sig,
                                 {"MIX": mix, "NP": 4, "BH": 1024}))
    return specs


AOT_SPECS = _aot_specs()
