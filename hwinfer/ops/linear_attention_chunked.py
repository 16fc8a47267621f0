"""Chunked (WY / UT-transform) references of the gated delta rule, and the input handling
shared with the token-by-token references in :mod:`hwinfer.ops.linear_attention`.

The shared checking / preparation lives here (not in ``linear_attention.py``) so that
``linear_attention.py`` can import everything it declares from this module without an
import cycle. The ops themselves are declared in ``linear_attention.py``.

Chunked form, per sequence and head, for one chunk of ``c`` tokens starting from state ``S0``
(``G_t = g_1 + ... + g_t`` the in-chunk cumulative log-decay, per key channel for KDA):

* every state inside the chunk is
  ``S_t = diag(e^{G_t}) S0 + sum_{s<=t} diag(e^{G_t - G_s}) k_s u_s^T``,
  where ``u_s`` is the delta written at step s;
* the deltas solve the unit lower-triangular system ``(I + diag(beta) A) U = diag(beta) V
  - diag(beta) (K * e^G) S0`` with ``A[t, s] = sum_d k_t[d] k_s[d] e^{G_t[d] - G_s[d]}`` for
  ``s < t`` (the "UT transform"); so ``U = U0 - W S0`` with ``[U0 | W]`` from one solve;
* outputs ``O = (Q * e^G) S0 + P U`` with ``P[t, s] = sum_d q_t[d] k_s[d] e^{G_t[d] - G_s[d]}``
  for ``s <= t``; end state ``S_c = diag(e^{G_c}) S0 + (K * e^{G_c - G})^T U``.

All of it is exact algebra, so it equals the recurrence up to fp32 rounding (~1e-6). One
rounding effect is specific to chunking: ``G_t - G_s`` is a difference of in-chunk cumulative
sums, exact only to ~eps * |G|; with extreme decays (|G| ~ 1e3 inside a chunk) a few state
entries then differ from the token loop by ~1e-4 relative (fla's and transformers' chunked
forms do the same).
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import slot_rows

L2NORM_EPS = 1e-6  # inside the sqrt: x / sqrt(sum(x^2) + 1e-6), as transformers and fla do


def check_inputs(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, initial_state: torch.Tensor | None,
                 cu_seqlens: torch.Tensor | None, *, per_channel: bool) -> int:
    """Validate the arguments of a gated-delta-rule op; return the number of sequences N."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{op}: {name} must be a floating-point tensor")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{op}: q, k, v must be [B, T, H, D]; got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} must have the same "
                         "shape")
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"{op}: v {tuple(v.shape)} must share [B, T] = {(B, T)} with q and k")
    if Hk == 0 or Hv % Hk != 0:
        raise ValueError(f"{op}: value heads ({Hv}) must be a positive multiple of q/k heads "
                         f"({Hk})")
    g_shape = (B, T, Hv, Dk) if per_channel else (B, T, Hv)
    if tuple(g.shape) != g_shape:
        layout = "[B, T, Hv, Dk]" if per_channel else "[B, T, Hv]"
        raise ValueError(f"{op}: g must be {list(g_shape)} ({layout}), got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, Hv):
        raise ValueError(f"{op}: beta must be {[B, T, Hv]}, got {list(beta.shape)}")
    n = B
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"{op}: with cu_seqlens the batch dimension must be 1, got B={B}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
            raise ValueError(f"{op}: cu_seqlens must be a 1-D integer tensor [N+1], got "
                             f"{cu_seqlens.dtype} {list(cu_seqlens.shape)}")
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != T or any(b > e for b, e in zip(bounds, bounds[1:])):
            raise ValueError(f"{op}: cu_seqlens must start at 0, be non-decreasing and end at "
                             f"T={T}; got {bounds}")
        n = len(bounds) - 1
    if initial_state is not None and tuple(initial_state.shape) != (n, Hv, Dk, Dv):
        raise ValueError(f"{op}: initial_state must be {[n, Hv, Dk, Dv]} ([N, Hv, Dk, Dv], "
                         f"k-first), got {list(initial_state.shape)}")
    return n


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last dimension (fp32 in, fp32 out)."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            scale: float | None, use_qk_l2norm: bool, per_channel: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 copies: q, k normalised / scaled and expanded to the value heads.

    Returns q, k [B, T, Hv, Dk]; v [B, T, Hv, Dv]; g [B, T, Hv, Dk] (KDA) or [B, T, Hv, 1]
    (GDN: one decay for every key channel, broadcast); beta [B, T, Hv].
    """
    Hk, Dk = k.shape[2], k.shape[3]
    Hv = v.shape[2]
    q32, k32 = q.float(), k.float()
    if use_qk_l2norm:
        q32, k32 = l2norm(q32), l2norm(k32)
    q32 = q32 * (Dk ** -0.5 if scale is None else scale)
    if Hv != Hk:
        # Value head h reads q/k head h // (Hv // Hk): consecutive value heads share a key head
        # (repeat_interleave, as transformers' qwen3_5 and fla do; not tile / repeat).
        q32 = q32.repeat_interleave(Hv // Hk, dim=2)
        k32 = k32.repeat_interleave(Hv // Hk, dim=2)
    g32 = g.float() if per_channel else g.float().unsqueeze(-1)  # GDN = KDA, same decay per channel
    return q32, k32, v.float(), g32, beta.float()


def run_sequences(core, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, initial_state: torch.Tensor | None,
                  cu_seqlens: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply ``core(q, k, v, g, beta, s0) -> (o, s)`` to each sequence (all rows at once if no
    cu_seqlens, else one packed segment at a time). Inputs are :func:`prepare`'s outputs."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    s0 = (torch.zeros(n, H, Dk, Dv, dtype=torch.float32, device=v.device) if initial_state is None
          else initial_state.to(torch.float32, copy=True))  # never hand back the caller's tensor
    if cu_seqlens is None:
        return core(q, k, v, g, beta, s0)
    bounds = cu_seqlens.tolist()
    o = v.new_zeros(1, T, H, Dv)
    states = []
    for i in range(n):
        seg = slice(bounds[i], bounds[i + 1])
        o_i, s_i = core(q[:, seg], k[:, seg], v[:, seg], g[:, seg], beta[:, seg], s0[i:i + 1])
        o[:, seg] = o_i
        states.append(s_i)
    return o, torch.cat(states)


def _solve_unit_lower(a: torch.Tensor, beta: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Solve ``(I + diag(beta) tril(a, -1)) x = rhs`` by forward substitution.

    a [..., c, c]; beta [..., c]; rhs [..., c, D]. Row t only needs rows s < t, already final.
    """
    x = rhs.clone()
    for t in range(1, x.shape[-2]):
        x[..., t, :] -= beta[..., t, None] * (a[..., t, :t, None] * x[..., :t, :]).sum(dim=-2)
    return x


def chunked_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, s: torch.Tensor, chunk_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked gated delta rule (module docstring) on prepared fp32 inputs.

    q, k [B, L, H, Dk]; g [B, L, H, Dk or 1]; v [B, L, H, Dv]; beta [B, L, H]; s [B, H, Dk, Dv].
    The last chunk may be shorter than ``chunk_size``; it is simply a smaller chunk.
    """
    B, L, H, _ = k.shape
    o = v.new_zeros(B, L, H, v.shape[-1])
    for start in range(0, L, chunk_size):
        seg = slice(start, min(start + chunk_size, L))
        qc, kc, vc, gc = (x[:, seg].transpose(1, 2) for x in (q, k, v, g))  # [B, H, c, D]
        bc = beta[:, seg].transpose(1, 2)                                  # [B, H, c]
        c = kc.shape[2]
        G = gc.cumsum(dim=2)
        # Pairwise decays e^{G_t - G_s} for s <= t, the exponent a sum of g over (s, t] (a
        # cumulative sum over t of g_u [u > s]), not G_t - G_s: under strong decay |G| reaches
        # thousands in a chunk and the difference would lose eps * |G|. It is masked to -inf
        # above the diagonal *before* exp.
        causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
        span = gc[:, :, :, None, :].expand(-1, -1, -1, c, -1)               # [B, H, u, s, Dk or 1]
        span = span.masked_fill(~causal.tril(-1)[:, :, None], 0.0).cumsum(dim=2)
        decay = span.masked_fill(~causal[:, :, None], float("-inf")).exp()
        if G.shape[-1] == 1:  # GDN: the decay factors out of the sum over key channels
            a_kk = (kc @ kc.transpose(-1, -2)) * decay[..., 0]
            a_qk = (qc @ kc.transpose(-1, -2)) * decay[..., 0]             # includes s == t
        else:
            a_kk = torch.einsum("bhtd,bhsd,bhtsd->bhts", kc, kc, decay)
            a_qk = torch.einsum("bhtd,bhsd,bhtsd->bhts", qc, kc, decay)
        rhs = torch.cat([bc[..., None] * vc, bc[..., None] * kc * G.exp()], dim=-1)
        u0_w = _solve_unit_lower(a_kk, bc, rhs)
        u0, w = u0_w[..., :vc.shape[-1]], u0_w[..., vc.shape[-1]:]
        u = u0 - w @ s                                                       # deltas [B, H, c, Dv]
        o[:, seg] = ((qc * G.exp()) @ s + a_qk @ u).transpose(1, 2)
        g_end = G[:, :, -1:, :]                                              # [B, H, 1, Dk]
        after = span[:, :, -1]                                               # G_end - G_s, [B, H, s, Dk]
        s = s * g_end.transpose(-1, -2).exp() + (kc * after.exp()).transpose(-1, -2) @ u
    return o, s


def on_state_slots(fn, op: str, q, k, v, g, beta, initial_state, state_slots, **kw):
    """The ``state_slots`` form of a delta-rule op (recurrent or chunked) through its plain form
    ``fn``: gather the rows of the state pool, run, write the final states back in place.
    Returns (o, the pool)."""
    if initial_state is None or initial_state.dim() != 4 or initial_state.dtype != torch.float32:
        raise ValueError(f"{op}: state_slots needs initial_state = the fp32 state pool "
                         f"[S, Hv, Dk, Dv], got {None if initial_state is None else list(initial_state.shape)}")
    rows = slot_rows(op, state_slots, initial_state)
    o, final = fn(q, k, v, g, beta, initial_state.index_select(0, rows), **kw)
    initial_state.index_copy_(0, rows, final)
    return o, initial_state


def _chunked(op: str, q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens,
             chunk_size, per_channel):
    n = check_inputs(op, q, k, v, g, beta, initial_state, cu_seqlens, per_channel=per_channel)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be a positive int, got {chunk_size!r}")
    q32, k32, v32, g32, b32 = prepare(q, k, v, g, beta, scale, use_qk_l2norm, per_channel)
    o, s = run_sequences(lambda *a: chunked_core(*a, chunk_size), q32, k32, v32, g32, b32,
                         initial_state, cu_seqlens, n)
    return o.to(v.dtype), s


def gdn_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                scale: float | None = None, use_qk_l2norm: bool = True,
                cu_seqlens: torch.Tensor | None = None, chunk_size: int = 64,
                state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet, chunked prefill form: same contract as ``gdn_recurrent``.

    Same math, arguments, shapes and outputs as ``gdn_recurrent`` (see there: q, k [B, T, Hk, Dk];
    v [B, T, Hv, Dv]; g [B, T, Hv] fp32 log-decay <= 0; beta [B, T, Hv]; initial_state
    [N, Hv, Dk, Dv] fp32 k-first; cu_seqlens [N+1] with B == 1; returns o [B, T, Hv, Dv] in
    v.dtype and the final state [N, Hv, Dk, Dv] fp32), computed chunk by chunk with the WY /
    UT-transform algorithm of this module's docstring, as transformers' qwen3_5
    ``torch_chunk_gated_delta_rule`` and fla's ``chunk_gated_delta_rule`` do for prefill.

    ``chunk_size`` (default 64, the value of transformers and fla) only changes the rounding:
    the result equals the token loop in exact arithmetic (fp32 agreement ~1e-6), so an
    implementation may chunk differently. A partial last chunk needs no padding.

    ``state_slots`` [N] integer: the in-place pool form, as in ``gdn_recurrent`` (sequence i
    starts from pool row ``state_slots[i]`` and its final state is written back there; returns
    the pool). The engine's prefill uses it, so a layer neither gathers nor scatters its
    states around the op. Slots must be distinct here (prefill has no padding rows).
    """
    if state_slots is not None:
        return on_state_slots(gdn_chunked, "gdn_chunked", q, k, v, g, beta, initial_state,
                              state_slots, scale=scale, use_qk_l2norm=use_qk_l2norm,
                              cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _chunked("gdn_chunked", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                    cu_seqlens, chunk_size, per_channel=False)


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                scale: float | None = None, use_qk_l2norm: bool = True,
                cu_seqlens: torch.Tensor | None = None, chunk_size: int = 64,
                state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi Delta Attention, chunked prefill form: same contract as ``kda_recurrent``.

    Same math, arguments, shapes and outputs as ``kda_recurrent`` (per-channel log-decay
    g [B, T, H, Dk] fp32; q, k [B, T, H, Dk]; v [B, T, H, Dv]; beta [B, T, H]; state
    [N, H, Dk, Dv] fp32 k-first), computed with the chunked algorithm of this module's
    docstring (fla's ``chunk_kda`` / transformers' kimi_linear ``chunk_kimi_delta_attention``).
    The decays between two tokens of a chunk differ per key channel, so the intra-chunk
    matrices use the pairwise ``e^{G_t - G_s}`` per channel (never ``e^{G_t} * e^{-G_s}``, which
    overflows for strong decays). ``chunk_size`` only changes rounding and ``state_slots`` is
    the in-place pool form (see ``gdn_chunked``).
    """
    if state_slots is not None:
        return on_state_slots(kda_chunked, "kda_chunked", q, k, v, g, beta, initial_state,
                              state_slots, scale=scale, use_qk_l2norm=use_qk_l2norm,
                              cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    return _chunked("kda_chunked", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                    cu_seqlens, chunk_size, per_channel=True)
