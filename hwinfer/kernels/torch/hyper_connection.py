"""Vectorised torch hyper-connection ops (contracts: :mod:`hwinfer.ops.hyper_connection`).

What makes them faster than the references on a CPU:

* the RMS factor of the flattened streams comes from one ``vector_norm`` reduction and is
  applied to the [T, rows] projection instead of to the [T, N*H] input, so the normalised copy
  of the streams is never materialised;
* the stream collapse ``sum_i pre_i X_i`` and the mHC mix ``comb^T X`` are batched matmuls
  (``bmm`` / ``baddbmm``) instead of N broadcast multiply-adds over [T, N, H] temporaries;
* the Sinkhorn normalisations run in place on the batched [T, N, N] tensor;
* the iHC update is a single ``addcmul``.
"""
from __future__ import annotations

import torch

from hwinfer.ops.hyper_connection import _check_streams


def _mixes(x32: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """``rms_norm(flat(x)) @ fn^T`` [T, rows] computed as ``(flat @ fn^T) * rsqrt(mean sq + eps)``."""
    flat = x32.reshape(x32.shape[0], x32.shape[1] * x32.shape[2])
    sq = torch.linalg.vector_norm(flat, dim=-1, keepdim=True).square_().div_(flat.shape[1])
    return (flat @ fn.float().t()).mul_(sq.add_(norm_eps).rsqrt_())


def _collapse(x32: torch.Tensor, pre: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.bmm(pre.unsqueeze(1), x32).squeeze(1).to(dtype)


def mhc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
            norm_eps: float, hc_eps: float, sinkhorn_iters: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`hwinfer.ops.hyper_connection.mhc_pre`."""
    t, n, _ = _check_streams("mhc_pre", x, fn, base, scale, lambda n: (2 + n) * n, 3)
    if sinkhorn_iters < 1:
        raise ValueError(f"mhc_pre: sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
    x32 = x.float()
    z = _mixes(x32, fn, norm_eps)
    b, s = base.float(), scale.float()
    pre = torch.sigmoid(z[:, :n] * s[0] + b[:n]).add_(hc_eps)
    post = torch.sigmoid(z[:, n : 2 * n] * s[1] + b[n : 2 * n]).mul_(2.0)
    logits = z[:, 2 * n :].reshape(t, n, n) * s[2] + b[2 * n :].reshape(n, n)
    comb = torch.softmax(logits, dim=-1).add_(hc_eps)
    comb.div_(comb.sum(dim=-2, keepdim=True).add_(hc_eps))
    for _ in range(sinkhorn_iters - 1):
        comb.div_(comb.sum(dim=-1, keepdim=True).add_(hc_eps))
        comb.div_(comb.sum(dim=-2, keepdim=True).add_(hc_eps))
    return _collapse(x32, pre, x.dtype), post, comb


def mhc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.hyper_connection.mhc_post`."""
    if residual.dim() != 3:
        raise ValueError(f"mhc_post: residual must be [T, N, H], got shape {tuple(residual.shape)}")
    t, n, h = residual.shape
    if tuple(y.shape) != (t, h) or tuple(post.shape) != (t, n) or tuple(comb.shape) != (t, n, n):
        raise ValueError(f"mhc_post: expected y [{t}, {h}], post [{t}, {n}], comb [{t}, {n}, {n}]; "
                         f"got {tuple(y.shape)}, {tuple(post.shape)}, {tuple(comb.shape)}")
    expanded = post.float().unsqueeze(-1) * y.float().unsqueeze(1)
    # out[t, k] = expanded[t, k] + sum_j comb[t, j, k] X[t, j]  ==  expanded + comb^T @ X
    out = torch.baddbmm(expanded, comb.float().transpose(1, 2), residual.float())
    return out.to(residual.dtype)


def mhc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
             norm_eps: float, hc_eps: float) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.hyper_connection.mhc_head`."""
    _check_streams("mhc_head", x, fn, base, scale, lambda n: n, 1)
    x32 = x.float()
    pre = torch.sigmoid(_mixes(x32, fn, norm_eps) * scale.float()[0] + base.float()).add_(hc_eps)
    return _collapse(x32, pre, x.dtype)


def ihc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
            norm_eps: float, hc_eps: float, hc_magnitude: float = 2.0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`hwinfer.ops.hyper_connection.ihc_pre`."""
    _check_streams("ihc_pre", x, fn, base, scale, lambda n: 2 * n, 2)
    n = x.shape[1]
    x32 = x.float()
    z = _mixes(x32, fn, norm_eps)
    b, s = base.float(), scale.float()
    pre = torch.sigmoid(z[:, :n] * s[0] + b[:n]).add_(hc_eps)
    post = torch.sigmoid(z[:, n:] * s[1] + b[n:]).mul_(hc_magnitude).add_(hc_eps)
    return _collapse(x32, pre, x.dtype), post


def ihc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.hyper_connection.ihc_post` (one fused addcmul)."""
    if residual.dim() != 3:
        raise ValueError(f"ihc_post: residual must be [T, N, H], got shape {tuple(residual.shape)}")
    t, n, h = residual.shape
    if tuple(y.shape) != (t, h) or tuple(post.shape) != (t, n):
        raise ValueError(f"ihc_post: expected y [{t}, {h}] and post [{t}, {n}], "
                         f"got {tuple(y.shape)} and {tuple(post.shape)}")
    out = torch.addcmul(residual.float(), post.float().unsqueeze(-1), y.float().unsqueeze(1))
    return out.to(residual.dtype)
