"""Hyper-connection contracts: DeepSeek-V4 mHC (pre, post, head) and HY4 iHC (pre, post).

The residual stream of these models is ``N`` parallel copies ("streams") of the hidden state,
``X`` [T, N, H] (``N`` = config ``hc_mult``, 4 in every released model). Each sub-block (attention,
FFN) collapses the streams into one input with learned weights ``pre``, and writes its output
back into every stream with weights ``post``; DeepSeek-V4's mHC also mixes the streams with a
doubly-stochastic ``comb`` matrix (MODELS.md §2.3-2.4, ENGINES.md §2.3), HY4's iHC keeps the
residual streams unmixed (MODELS.md §5). GLM-5.3-Flash (``glm5_next``) uses the mHC module as is.

The weights are per token: a linear map of the RMS-normalised flattened streams.
"""
from __future__ import annotations

from typing import Callable

import torch

from hwinfer.ops.contract import Case, Tol, define_op, fan_in_scale, randn

_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)}


def _check_streams(name: str, x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                   scale: torch.Tensor, rows: Callable[[int], int], n_scale: int
                   ) -> tuple[int, int, int]:
    """Validate the shapes of an HC entry; ``rows(N)`` is the projection's output count."""
    if x.dim() != 3:
        raise ValueError(f"{name}: x must be [T, N, H], got shape {tuple(x.shape)}")
    t, n, h = x.shape
    want_rows = rows(n)
    if tuple(fn.shape) != (want_rows, n * h):
        raise ValueError(f"{name}: fn must be [{want_rows}, N*H={n * h}] for N={n}, H={h}, "
                         f"got {tuple(fn.shape)}")
    if tuple(base.shape) != (want_rows,):
        raise ValueError(f"{name}: base must be [{want_rows}], got {tuple(base.shape)}")
    if tuple(scale.shape) != (n_scale,):
        raise ValueError(f"{name}: scale must be [{n_scale}], got {tuple(scale.shape)}")
    return t, n, h


def _rms_normed_flat(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Flatten [T, N, H] to [T, N*H] in fp32 and divide by its RMS (no weight)."""
    flat = x.float().reshape(x.shape[0], x.shape[1] * x.shape[2])
    return flat * torch.rsqrt(flat.pow(2).mean(dim=-1, keepdim=True) + eps)


def _collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``sum_i pre[t, i] * X[t, i, :]`` in fp32, cast to x.dtype."""
    x32 = x.float()
    out = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float32, device=x.device)
    for i in range(x.shape[1]):
        out = out + pre[:, i : i + 1] * x32[:, i, :]
    return out.to(x.dtype)


def mhc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
            norm_eps: float, hc_eps: float, sinkhorn_iters: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 mHC entry of one sub-block: the block input and the post / comb weights.

    With ``X = x`` [T, N, H] (N streams of width H) and everything in fp32:

    * ``u = flat(X) / sqrt(mean(flat(X)^2) + norm_eps)`` over the N*H channels (unweighted RMS),
    * ``z = u @ fn^T`` [T, (2+N)*N], split **in this order** into ``z_pre`` (N), ``z_post`` (N)
      and ``z_comb`` (N*N, row-major: ``z_comb[i, j] = z[2N + i*N + j]``); ``base`` splits alike,
    * ``pre  = sigmoid(z_pre * scale[0] + base_pre) + hc_eps``
    * ``post = 2 * sigmoid(z_post * scale[1] + base_post)``   (in (0, 2); no eps)
    * ``comb = softmax_j(z_comb * scale[2] + base_comb)[i, j] + hc_eps`` (softmax over the last
      index j, eps added after the softmax), then Sinkhorn: divide every column by its sum
      (``comb[i, j] /= sum_i' comb[i', j] + hc_eps``) once, then ``sinkhorn_iters - 1`` times
      divide rows (``/= sum_j' comb[i, j'] + hc_eps``) then columns again. The eps sits in each
      denominator, so the result is doubly stochastic only up to ~hc_eps.
    * ``layer_input = sum_i pre[i] * X[i]`` (fp32 sum, cast to x.dtype).

    Index convention of ``comb`` [T, N, N]: ``comb[t, j, k]`` is the weight of *input* stream
    ``j`` in *output* stream ``k`` of :func:`mhc_post` (``X'_k = post_k y + sum_j comb[j, k] X_j``),
    i.e. it is used transposed. Last Sinkhorn step normalises columns, so the column sums are
    the closest to 1.

    Args (DeepSeek-V4 names; native checkpoint ``layers.L.hc_attn_fn/_base/_scale`` and
    ``hc_ffn_*``, transformers ``attn_hc.fn/.base/.scale``):
        x: [T, N, H] residual streams, any float dtype.
        fn: [(2+N)*N, N*H] fp32 projection (Flash: [24, 16384]).
        base: [(2+N)*N] fp32 bias; scale: [3] fp32 (pre, post, comb multipliers).
        norm_eps: config ``rms_norm_eps`` (1e-6); hc_eps: config ``hc_eps`` (1e-6);
        sinkhorn_iters: config ``hc_sinkhorn_iters`` (20), >= 1.

    Returns ``(layer_input [T, H] x.dtype, post [T, N] fp32, comb [T, N, N] fp32)``. (transformers
    returns them as ``(post, comb, collapsed)``.) The projection is fp32 regardless of x.dtype.
    """
    t, n, _ = _check_streams("mhc_pre", x, fn, base, scale, lambda n: (2 + n) * n, 3)
    if sinkhorn_iters < 1:
        raise ValueError(f"mhc_pre: sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    z = _rms_normed_flat(x, norm_eps) @ fn.float().t()
    b, s = base.float(), scale.float()
    pre = torch.sigmoid(z[:, :n] * s[0] + b[:n]) + hc_eps
    post = 2.0 * torch.sigmoid(z[:, n : 2 * n] * s[1] + b[n : 2 * n])
    logits = z[:, 2 * n :].reshape(t, n, n) * s[2] + b[2 * n :].reshape(n, n)
    comb = torch.softmax(logits, dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    return _collapse(x, pre), post, comb


def mhc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4 mHC exit: write the block output back into the N streams and mix them.

    ``X'[t, k] = post[t, k] * y[t] + sum_j comb[t, j, k] * X[t, j]`` (comb used transposed:
    the sum runs over its *first* stream index; see :func:`mhc_pre`), computed in fp32.

    Shapes: y [T, H] (block output, any float dtype); residual [T, N, H] (the streams that went
    into :func:`mhc_pre`); post [T, N] and comb [T, N, N] from :func:`mhc_pre` (fp32).
    Returns [T, N, H] in residual.dtype. (transformers mixes in the activation dtype; we keep
    fp32 until the single final cast, so bf16 results can differ from it by a bf16 ulp.)
    """
    if residual.dim() != 3:
        raise ValueError(f"mhc_post: residual must be [T, N, H], got shape {tuple(residual.shape)}")
    t, n, h = residual.shape
    if tuple(y.shape) != (t, h):
        raise ValueError(f"mhc_post: y must be [T={t}, H={h}], got {tuple(y.shape)}")
    if tuple(post.shape) != (t, n):
        raise ValueError(f"mhc_post: post must be [T={t}, N={n}], got {tuple(post.shape)}")
    if tuple(comb.shape) != (t, n, n):
        raise ValueError(f"mhc_post: comb must be [T={t}, N={n}, N={n}], got {tuple(comb.shape)}")
    x32, y32, c32 = residual.float(), y.float(), comb.float()
    out = post.float().unsqueeze(-1) * y32.unsqueeze(1)
    for j in range(n):
        out = out + c32[:, j, :].unsqueeze(-1) * x32[:, j : j + 1, :]
    return out.to(residual.dtype)


def mhc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
             norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Final collapse of the N streams before the model's last norm (DeepSeek-V4 and HY4).

    ``pre = sigmoid((u @ fn^T) * scale[0] + base) + hc_eps`` with ``u`` the unweighted RMS norm of
    the flattened streams (as in :func:`mhc_pre`), then ``out = sum_i pre[i] * X[i]`` in fp32.

    Shapes: x [T, N, H] any float dtype; fn [N, N*H] fp32; base [N] fp32; scale [1] fp32.
    Returns [T, H] in x.dtype. Checkpoint names: DeepSeek-V4 ``hc_head_fn/_base/_scale``
    (transformers ``model.hc_head.hc_fn/hc_base/hc_scale``), eps ``rms_norm_eps`` / ``hc_eps``.
    HY4's ``hc_head`` has the same parameters and math; transformers multiplies by the RMS
    factor *after* the projection there, which differs only by fp32 rounding.
    """
    _check_streams("mhc_head", x, fn, base, scale, lambda n: n, 1)
    z = _rms_normed_flat(x, norm_eps) @ fn.float().t()
    pre = torch.sigmoid(z * scale.float()[0] + base.float()) + hc_eps
    return _collapse(x, pre)


def ihc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
            norm_eps: float, hc_eps: float, hc_magnitude: float = 2.0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """HY4 "iHC" (independent hyper-connection) entry: block input and post weights, no comb.

    In fp32: ``r = 1 / sqrt(mean(flat(X)^2) + norm_eps)`` over the N*H channels;
    ``z = (flat(X) @ fn^T) * r`` [T, 2N] (HY4 applies the RMS factor *after* the projection;
    mathematically the same as projecting the normalised streams); split ``(z_pre, z_post)``
    (N each, in this order; ``base`` alike);
    ``pre = sigmoid(z_pre * scale[0] + base_pre) + hc_eps``;
    ``post = hc_magnitude * sigmoid(z_post * scale[1] + base_post) + hc_eps`` (unlike mHC,
    post *does* get the eps); ``layer_input = sum_i pre[i] * X[i]`` (fp32, cast to x.dtype).

    Args (transformers ``hy_v4``: ``layers.L.attn_hc.fn/.base/.scale`` and ``ffn_hc.*``):
        x: [T, N, H] residual streams (config ``hc_mult`` N = 4), any float dtype.
        fn: [2N, N*H] fp32; base: [2N] fp32; scale: [2] fp32 (pre, post).
        norm_eps: config ``rms_norm_eps`` (HY4 default 1e-5); hc_eps: ``hc_eps`` (1e-6);
        hc_magnitude: config ``hc_magnitude`` (2.0).

    Returns ``(layer_input [T, H] x.dtype, post [T, N] fp32)``; the update is :func:`ihc_post`.
    """
    _check_streams("ihc_pre", x, fn, base, scale, lambda n: 2 * n, 2)
    n = x.shape[1]
    flat = x.float().reshape(x.shape[0], x.shape[1] * x.shape[2])
    r = torch.rsqrt(flat.pow(2).mean(dim=-1, keepdim=True) + norm_eps)
    z = (flat @ fn.float().t()) * r
    b, s = base.float(), scale.float()
    pre = torch.sigmoid(z[:, :n] * s[0] + b[:n]) + hc_eps
    post = hc_magnitude * torch.sigmoid(z[:, n:] * s[1] + b[n:]) + hc_eps
    return _collapse(x, pre), post


def ihc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """HY4 iHC exit: ``X'[t, k] = post[t, k] * y[t] + X[t, k]`` in fp32 (streams are not mixed).

    Shapes: y [T, H] block output; residual [T, N, H]; post [T, N] fp32 from :func:`ihc_pre`.
    Returns [T, N, H] in residual.dtype (transformers also computes this in fp32).
    """
    if residual.dim() != 3:
        raise ValueError(f"ihc_post: residual must be [T, N, H], got shape {tuple(residual.shape)}")
    t, n, h = residual.shape
    if tuple(y.shape) != (t, h):
        raise ValueError(f"ihc_post: y must be [T={t}, H={h}], got {tuple(y.shape)}")
    if tuple(post.shape) != (t, n):
        raise ValueError(f"ihc_post: post must be [T={t}, N={n}], got {tuple(post.shape)}")
    out = post.float().unsqueeze(-1) * y.float().unsqueeze(1) + residual.float()
    return out.to(residual.dtype)


# ----------------------------------------------------------------------------------------------
# Cases: DeepSeek-V4 / HY4 / GLM-5.3 all use N = 4; H scaled down from 4096 / 2816.


def _params(gen, n: int, h: int, rows: int, n_scale: int, device) -> dict:
    """fn scaled so the projections are O(1); base and scale around their trained ranges."""
    return {
        "fn": randn(gen, rows, n * h, dtype=torch.float32, device=device, scale=fan_in_scale(n * h)),
        "base": randn(gen, rows, dtype=torch.float32, device=device, scale=0.5),
        "scale": randn(gen, n_scale, dtype=torch.float32, device=device, scale=0.3) + 1.0,
    }


def _mhc_pre_case(t: int, n: int, h: int, iters: int):
    def make(gen, dtype, device):
        return {"x": randn(gen, t, n, h, dtype=dtype, device=device),
                **_params(gen, n, h, (2 + n) * n, 3, device),
                "norm_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": iters}
    return make


def _mhc_post_case(t: int, n: int, h: int):
    def make(gen, dtype, device):
        comb = torch.softmax(randn(gen, t, n, n, dtype=torch.float32, device=device), dim=-1)
        return {"y": randn(gen, t, h, dtype=dtype, device=device),
                "residual": randn(gen, t, n, h, dtype=dtype, device=device),
                "post": 2.0 * torch.sigmoid(randn(gen, t, n, dtype=torch.float32, device=device)),
                "comb": comb}
    return make


def _head_case(t: int, n: int, h: int):
    def make(gen, dtype, device):
        return {"x": randn(gen, t, n, h, dtype=dtype, device=device),
                **_params(gen, n, h, n, 1, device), "norm_eps": 1e-6, "hc_eps": 1e-6}
    return make


def _ihc_pre_case(t: int, n: int, h: int, magnitude: float):
    def make(gen, dtype, device):
        return {"x": randn(gen, t, n, h, dtype=dtype, device=device),
                **_params(gen, n, h, 2 * n, 2, device),
                "norm_eps": 1e-5, "hc_eps": 1e-6, "hc_magnitude": magnitude}
    return make


def _ihc_post_case(t: int, n: int, h: int):
    def make(gen, dtype, device):
        return {"y": randn(gen, t, h, dtype=dtype, device=device),
                "residual": randn(gen, t, n, h, dtype=dtype, device=device),
                "post": 2.0 * torch.sigmoid(randn(gen, t, n, dtype=torch.float32, device=device))}
    return make


MHC_PRE = define_op(
    mhc_pre,
    cases=[
        Case("dsv4_n4", _mhc_pre_case(9, 4, 256, 20)),
        Case("single_token", _mhc_pre_case(1, 4, 128, 20)),
        Case("odd_h_3iters", _mhc_pre_case(5, 4, 200, 3)),
        Case("n2_one_iter", _mhc_pre_case(6, 2, 64, 1)),
    ],
    tolerance=_TOL,
)

MHC_POST = define_op(
    mhc_post,
    cases=[Case("dsv4_n4", _mhc_post_case(9, 4, 256)), Case("odd_h", _mhc_post_case(3, 4, 200))],
    tolerance=_TOL,
)

MHC_HEAD = define_op(
    mhc_head,
    cases=[Case("dsv4_n4", _head_case(9, 4, 256)), Case("single_token", _head_case(1, 4, 200))],
    tolerance=_TOL,
)

IHC_PRE = define_op(
    ihc_pre,
    cases=[Case("hy4_n4", _ihc_pre_case(9, 4, 176, 2.0)),
           Case("magnitude_1p5", _ihc_pre_case(2, 4, 64, 1.5))],
    tolerance=_TOL,
)

IHC_POST = define_op(
    ihc_post,
    cases=[Case("hy4_n4", _ihc_post_case(9, 4, 176))],
    tolerance=_TOL,
)
