"""Vectorised torch implementations of the gated delta rule ops (GDN and KDA).

Contracts: :mod:`hwinfer.ops.linear_attention`. Two paths serve all four ops:

* **decode** (every sequence has at most one token): one fused recurrent step for all
  sequences and heads, with both state reads (``S^T k`` and ``S^T q``) in one batched matmul and
  the update ``e^g S + k delta^T`` written once;
* **prefill** (anything longer): the chunked WY algorithm with all sequences laid out as
  ``[N, H, chunks, C]`` (sequences padded with inert tokens: k = v = q = 0, beta = 0, g = 0
  leave the state untouched), the intra-chunk work batched over all chunks, and one scan over
  chunk index for all sequences and heads at once. On CPU the cost is largely memory traffic
  (every fresh large temporary also pays first-touch page faults), so inputs move through the
  layout change as one packed tensor.

Both are exact rewrites of the recurrence, so the ``*_recurrent`` ops use the chunked path for
prefill and the ``*_chunked`` ops use the fused step for decode. ``chunk_size`` is a tuning
hint: the ops' results do not depend on it beyond rounding.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from hwinfer.ops.linear_attention_chunked import check_inputs, prepare
from hwinfer.ops.linear_attention import (
    compose_gdn_gated_recurrent, compose_kda_gated_recurrent, gdn_gate, kda_gate, on_state_slots,
)

_GDN_CHUNK = 64
# KDA's pairwise per-channel decays cost T * _KDA_SUB * Dk per head, the cross-block terms grow
# with _KDA_CHUNK / _KDA_SUB, the scan's step count with T / _KDA_CHUNK; measured best on CPU.
# KDA always uses these (its chunk_size argument only changes rounding).
_KDA_CHUNK = 16
_KDA_SUB = 2
_KDA_SLAB = 1 << 24  # elements of the pairwise-decay tensor materialised at once (64 MiB fp32)


def _layout(bounds: list[int], c: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Token index of every slot of the [N, nc * c] padded layout (-1 for padding)."""
    lengths = [e - b for b, e in zip(bounds, bounds[1:])]
    nc = max(1, -(-max(lengths) // c)) if lengths else 1
    pos = torch.arange(nc * c, device=device)
    start = torch.tensor(bounds[:-1], device=device)[:, None]
    length = torch.tensor(lengths, device=device)[:, None]
    return torch.where(pos < length, start + pos, -1), nc


def _to_chunks(x: torch.Tensor, idx: torch.Tensor | None, n: int, nc: int, c: int) -> torch.Tensor:
    """Flat [T, H, F] -> [N, H, nc, c, F], zeros at padding slots; ``idx`` None when every
    sequence is exactly nc * c tokens long (then a single copy does it)."""
    if idx is None:
        return x.view(n, nc, c, *x.shape[1:]).movedim(3, 1).contiguous()
    out = x.new_zeros(n * nc * c, *x.shape[1:])
    keep = idx.reshape(-1) >= 0
    out[keep] = x[idx.reshape(-1)[keep]]
    return out.view(n, nc, c, *x.shape[1:]).movedim(3, 1).contiguous()


def _rhs(v, k, bv, bk):
    """``[bv * v | bk * k]``, written straight into one buffer (no per-part temporaries)."""
    dv = v.shape[-1]
    out = v.new_empty(*v.shape[:-1], dv + k.shape[-1])
    torch.mul(v, bv, out=out[..., :dv])
    torch.mul(k, bk, out=out[..., dv:])
    return out


def _intra_gdn(q, k, v, g, beta):
    """Intra-chunk terms for a scalar decay per token. Inputs [..., c, D] / [..., c]."""
    c = k.shape[-2]
    G = g.cumsum(dim=-1)
    tril = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    # Pairwise log-decays G_t - G_s as sums over (s, t] of g, not as a difference of cumsums:
    # under strong decay |G| reaches thousands and the difference loses eps * |G| (1e-4
    # relative error in e^{G_t - G_s} at T = 40), while these partial sums never exceed the
    # result. Column s of ``seg`` holds g_r for r > s.
    seg = g[..., :, None].expand(*g.shape, c).masked_fill(~tril.tril(-1), 0.0).cumsum(dim=-2)
    decay = seg.masked_fill(~tril, float("-inf")).exp()
    a = (k @ k.transpose(-1, -2)) * decay * beta[..., :, None]
    p = (q @ k.transpose(-1, -2)) * decay
    uw = torch.linalg.solve_triangular(a, _rhs(v, k, beta[..., None], (beta * G.exp())[..., None]),
                                       upper=False, unitriangular=True)
    g_end = G[..., -1:]
    kd = k * seg[..., -1, :].exp()[..., None]                            # e^{G_end - G_s}
    return uw, p, q * G.exp()[..., None], kd, g_end.exp()[..., None]   # decay of S: [..., 1, 1]


def _suffix(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Exclusive suffix sums along ``dim``: out[i] = sum_{j > i} x[j], each a sum of its own
    terms (never a total minus a prefix, which cancels when the terms are large)."""
    shifted = torch.cat([x.narrow(dim, 1, x.shape[dim] - 1), torch.zeros_like(x.narrow(dim, 0, 1))], dim=dim)
    return shifted.flip(dim).cumsum(dim).flip(dim)


def _intra_kda(q, k, v, g, beta, sub):
    """Intra-chunk terms for a per-channel decay. Inputs [..., c, D] / [..., c]; ``sub``
    divides c. Inside sub-blocks of ``sub`` tokens the decays are pairwise (exact, masked before
    exp); across sub-blocks, for s in block j < i and t in block i, ``e^{G_t - G_s} =
    e^{G_t - E_{i-1}} e^{E_{i-1} - E_j} e^{E_j - G_s}`` (E_j: G at the end of block j) with every
    factor <= 1, so the product is exact up to rounding and never overflows, unlike
    ``e^{G_t} e^{-G_s}``, and the cross-block sums become matmuls. Every exponent is a sum of g
    over its own span (in-block prefix / suffix sums, sums of block totals), never a difference
    of cumulative sums: under strong decay |G| reaches thousands within a chunk and such a
    difference would lose eps * |G|."""
    *lead, c, _ = k.shape
    nb = c // sub
    G = g.cumsum(dim=-2)
    gb, kb, qb = (x.unflatten(-2, (nb, sub)) for x in (g, k, q))           # [..., nb, sub, Dk]
    tril = torch.ones(sub, sub, dtype=torch.bool, device=k.device).tril()
    # seg[t, s] = sum_{s < u <= t} g_u inside a block: a cumulative sum over t of g_u [u > s].
    seg = gb[..., :, None, :].expand(*gb.shape[:-2], sub, sub, gb.shape[-1])
    seg = seg.masked_fill(~tril.tril(-1)[:, :, None], 0.0).cumsum(dim=-3)  # [..., nb, t, s, Dk]
    decay = seg.masked_fill(~tril[:, :, None], float("-inf")).exp()
    diag = (kb[..., None, :, :] * decay) @ torch.stack([kb, qb], dim=-1)   # [..., nb, t, s, 2]
    a = k.new_zeros(*lead, c, c)
    p = k.new_zeros(*lead, c, c)
    for m, x in ((a, diag[..., 0]), (p, diag[..., 1])):
        torch.diagonal(m.view(*lead, nb, sub, nb, sub), dim1=-4, dim2=-2).copy_(x.movedim(-3, -1))
    totals = gb.sum(dim=-2)                                                 # [..., nb, Dk]
    right = kb * _suffix(gb, -2).exp()                                      # k_s e^{E_j - G_s}
    into = gb[..., 1:, :, :].cumsum(dim=-2).exp()                           # e^{G_t - E_{i-1}}
    left = torch.cat([kb[..., 1:, :, :] * into, qb[..., 1:, :, :] * into], dim=-2)
    for i in range(1, nb):
        between = _suffix(totals[..., :i, :], -2).exp()                     # e^{E_{i-1} - E_j}
        r = (right[..., :i, :, :] * between[..., None, :]).flatten(-3, -2)  # [..., i*sub, Dk]
        both = left[..., i - 1, :, :] @ r.transpose(-1, -2)                 # [..., 2 sub, i*sub]
        a[..., i * sub:(i + 1) * sub, :i * sub] = both[..., :sub, :]
        p[..., i * sub:(i + 1) * sub, :i * sub] = both[..., sub:, :]
    a = a * beta[..., :, None]
    uw = torch.linalg.solve_triangular(a, _rhs(v, k, beta[..., None], beta[..., None] * G.exp()),
                                       upper=False, unitriangular=True)
    g_end = G[..., -1:, :]
    kd = k * _suffix(g, -2).exp()                                           # e^{G_end - G_s}
    return uw, p, q * G.exp(), kd, g_end.transpose(-1, -2).exp()       # decay of S: [..., Dk, 1]


def _prefill(q, k, v, g, beta, s0, bounds, per_channel, chunk):
    """Chunked rule on prepared flat inputs q, k [T, H, Dk], v [T, H, Dv], g [T, H(, Dk)],
    beta [T, H]; s0 [N, H, Dk, Dv]. Returns o [T, H, Dv] fp32 and the final states."""
    T, H, Dk = k.shape
    Dv = v.shape[-1]
    longest = max(e - b for b, e in zip(bounds, bounds[1:]))
    if per_channel:  # a whole number of sub-blocks, no longer than needed
        c = min(_KDA_CHUNK, -(-longest // _KDA_SUB) * _KDA_SUB)
    else:
        c = min(chunk, longest)
    n = len(bounds) - 1
    if all(e - b == longest for b, e in zip(bounds, bounds[1:])) and longest % c == 0:
        idx, nc = None, longest // c
    else:
        idx, nc = _layout(bounds, c, k.device)
    # One [T, H, features] tensor goes through the layout change (one copy, not five).
    gf = g if per_channel else g[..., None]
    feats = _to_chunks(torch.cat([q, k, v, gf, beta[..., None]], dim=-1), idx, n, nc, c)
    qc, kc, vc, gc, bc = feats.split([Dk, Dk, Dv, gf.shape[-1], 1], dim=-1)
    bc = bc[..., 0]
    if not per_channel:
        gc = gc[..., 0]
    if per_channel:
        # Bound the [..., c / sub, sub, sub, Dk] pairwise decays by taking slabs of chunks.
        step = max(1, _KDA_SLAB // (n * H * c * _KDA_SUB * Dk))
        parts = [_intra_kda(*(x[:, :, i:i + step] for x in (qc, kc, vc, gc, bc)), _KDA_SUB)
                 for i in range(0, nc, step)]
        uw, p, qg, kd, dl = (torch.cat(t, dim=2) for t in zip(*parts))
    else:
        uw, p, qg, kd, dl = _intra_gdn(qc, kc, vc, gc, bc)
    u0, w, kd_t = uw[..., :Dv], uw[..., Dv:], kd.transpose(-1, -2).contiguous()
    o = torch.empty(n, H, nc, c, Dv, dtype=torch.float32, device=k.device)
    s = s0
    for i in range(nc):
        u = u0[:, :, i] - w[:, :, i] @ s                                   # deltas of chunk i
        o[:, :, i] = torch.baddbmm((qg[:, :, i] @ s).flatten(0, 1), p[:, :, i].flatten(0, 1),
                                   u.flatten(0, 1)).view(n, H, c, Dv)
        s = torch.baddbmm((s * dl[:, :, i]).flatten(0, 1), kd_t[:, :, i].flatten(0, 1),
                          u.flatten(0, 1)).view(n, H, Dk, Dv)
    o_flat = o.movedim(1, 3).reshape(n * nc * c, H, Dv)
    if idx is None:
        return o_flat, s
    keep = idx.reshape(-1) >= 0
    out = torch.empty(T, H, Dv, dtype=torch.float32, device=k.device)
    out[idx.reshape(-1)[keep]] = o_flat[keep]
    return out, s


def _decode(q, k, v, g, beta, s, per_channel):
    """One recurrent step for N sequences: q, k [N, H, Dk], v [N, H, Dv], g [N, H(, Dk)],
    beta [N, H], s [N, H, Dk, Dv]. ``S' = diag(e^g) S``; ``S'^T x = S^T (e^g x)``, so both
    reads use the old state and ``S_new = S' + k delta^T`` is written once."""
    e = g.exp()
    ek = e[..., None] if not per_channel else e                             # [N, H, 1 or Dk]
    reads = torch.stack([k * ek, q * ek], dim=-2) @ s                       # [N, H, 2, Dv]
    delta = beta[..., None] * (v - reads[..., 0, :])
    qk = (q * k).sum(-1, keepdim=True)                                      # q . k
    o = reads[..., 1, :] + qk * delta
    s_new = s * (e[..., None, None] if not per_channel else e[..., None])
    s_new.view(-1, *s.shape[2:]).baddbmm_(k.reshape(-1, k.shape[-1], 1),
                                          delta.reshape(-1, 1, delta.shape[-1]))
    return o, s_new


def _run(op, q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens, per_channel, chunk):
    n = check_inputs(op, q, k, v, g, beta, initial_state, cu_seqlens, per_channel=per_channel)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"{op}: chunk_size must be a positive int, got {chunk!r}")
    B, T = k.shape[:2]
    Hv, Dk, Dv = v.shape[2], k.shape[3], v.shape[3]
    q32, k32, v32, g32, b32 = prepare(q, k, v, g, beta, scale, use_qk_l2norm, per_channel)
    if not per_channel:
        g32 = g32[..., 0]  # GDN: keep one decay per token and head, [B, T, Hv]
    s0 = (torch.zeros(n, Hv, Dk, Dv, dtype=torch.float32, device=v.device) if initial_state is None
          else initial_state.float())
    if B * T == 0:
        return v.new_zeros(v.shape), s0.clone()
    bounds = list(range(0, B * T + 1, T)) if cu_seqlens is None else cu_seqlens.tolist()
    flat = [x.flatten(0, 1) for x in (q32, k32, v32, g32, b32)]
    lengths = [e - b for b, e in zip(bounds, bounds[1:])]
    if max(lengths) == 1:
        # Decode: gather each sequence's token (empty sequences keep their state).
        has = torch.tensor([length == 1 for length in lengths], device=v.device)
        pos = torch.tensor(bounds[:-1], device=v.device).clamp(max=B * T - 1)
        o_n, s = _decode(*(x[pos] for x in flat), s0, per_channel)
        if not bool(has.all()):
            s[~has] = s0[~has]
        o = torch.empty(B * T, Hv, Dv, dtype=torch.float32, device=v.device)
        o[pos[has]] = o_n[has]
    else:
        o, s = _prefill(*flat, s0, bounds, per_channel, chunk)
    return o.view(B, T, Hv, Dv).to(v.dtype), s


def gdn_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                  initial_state: Tensor | None = None, *, scale: float | None = None,
                  use_qk_l2norm: bool = True, cu_seqlens: Tensor | None = None,
                  state_slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``gdn_recurrent`` (contract in hwinfer.ops.linear_attention): fused step / chunked."""
    if state_slots is not None:
        return on_state_slots(gdn_recurrent, "gdn_recurrent", q, k, v, g, beta, initial_state, state_slots,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens)
    return _run("gdn_recurrent", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, False, _GDN_CHUNK)


# ``gdn_gated_recurrent`` (contract in hwinfer.ops.linear_attention): the gate expression, then
# gdn_recurrent above; the composition the contract defines.
gdn_gated_recurrent = partial(compose_gdn_gated_recurrent, gdn_gate, gdn_recurrent)


def gdn_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                initial_state: Tensor | None = None, *, scale: float | None = None,
                use_qk_l2norm: bool = True, cu_seqlens: Tensor | None = None,
                chunk_size: int = 64, state_slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``gdn_chunked`` (contract in hwinfer.ops.linear_attention_chunked)."""
    if state_slots is not None:
        return on_state_slots(gdn_chunked, "gdn_chunked", q, k, v, g, beta, initial_state, state_slots,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                              chunk_size=chunk_size)
    return _run("gdn_chunked", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, False, chunk_size)


def kda_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                  initial_state: Tensor | None = None, *, scale: float | None = None,
                  use_qk_l2norm: bool = True, cu_seqlens: Tensor | None = None,
                  state_slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``kda_recurrent`` (contract in hwinfer.ops.linear_attention): fused step / chunked."""
    if state_slots is not None:
        return on_state_slots(kda_recurrent, "kda_recurrent", q, k, v, g, beta, initial_state, state_slots,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens)
    return _run("kda_recurrent", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, True, _KDA_CHUNK)


# ``kda_gated_recurrent`` (contract in hwinfer.ops.linear_attention): the gate expression and
# beta's sigmoid, then kda_recurrent above; the composition the contract defines.
kda_gated_recurrent = partial(compose_kda_gated_recurrent, kda_gate, kda_recurrent)


def kda_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                initial_state: Tensor | None = None, *, scale: float | None = None,
                use_qk_l2norm: bool = True, cu_seqlens: Tensor | None = None,
                chunk_size: int = 64, state_slots: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``kda_chunked`` (contract in hwinfer.ops.linear_attention_chunked); chunks of
    ``_KDA_CHUNK`` tokens whatever ``chunk_size`` says, which changes only rounding."""
    if state_slots is not None:
        return on_state_slots(kda_chunked, "kda_chunked", q, k, v, g, beta, initial_state, state_slots,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens,
                              chunk_size=chunk_size)
    return _run("kda_chunked", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, True, chunk_size)
