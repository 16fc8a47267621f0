"""Linear attention contracts: the gated delta rule of Gated DeltaNet (Qwen3.5, Qwen3-Next) and
Kimi Delta Attention (Kimi-Linear, Kimi-K3, GLM-5.3-Flash "glm5_next"), and their decay gates.

Each rule has two references, the token loop (``*_recurrent``, decode and the definition) and
the chunked WY form (``*_chunked``, prefill; in :mod:`hwinfer.ops.linear_attention_chunked`).

State layout: ``[N, Hv, Dk, Dv]`` fp32, **k-first** (key channel before value channel), the
layout of fla's default and of transformers. vLLM's "v-first" pool layout ``[slots, Hv, Dv, Dk]``
is its transpose. ``o_t = S_t^T q_t``.
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randn, uniform
from hwinfer.ops.linear_attention_chunked import (
    check_inputs, gdn_chunked, kda_chunked, on_state_slots, prepare, run_sequences,
)


def recurrent_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token loop on prepared fp32 inputs: q, k [B, L, H, Dk]; g [B, L, H, Dk or 1]; v
    [B, L, H, Dv]; beta [B, L, H]; s [B, H, Dk, Dv]. Returns o [B, L, H, Dv] and the state."""
    o = v.new_zeros(v.shape)
    for t in range(k.shape[1]):
        s = s * g[:, t].exp().unsqueeze(-1)                 # row i (key channel i) *= e^{g[i]}
        kv = torch.einsum("bhk,bhkv->bhv", k[:, t], s)      # what the state predicts for k_t
        delta = beta[:, t, :, None] * (v[:, t] - kv)
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]  # S += k delta^T
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], s)
    return o, s


def _recurrent(op, q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens, per_channel):
    n = check_inputs(op, q, k, v, g, beta, initial_state, cu_seqlens, per_channel=per_channel)
    q32, k32, v32, g32, b32 = prepare(q, k, v, g, beta, scale, use_qk_l2norm, per_channel)
    o, s = run_sequences(recurrent_core, q32, k32, v32, g32, b32, initial_state, cu_seqlens, n)
    return o.to(v.dtype), s


def gdn_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                  scale: float | None = None, use_qk_l2norm: bool = True,
                  cu_seqlens: torch.Tensor | None = None,
                  state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet (gated delta rule), token by token (MODELS.md §3.3, ENGINES.md §2.5).

    Per sequence and value head, state ``S`` in R^{Dk x Dv} (fp32, zeros unless given), per token:
    ``S <- e^{g_t} S``; ``delta = beta_t (v_t - S^T k_t)``; ``S <- S + k_t delta^T``;
    ``o_t = S^T q_t``. Equivalently
    ``S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.
    Before the loop (in fp32): with ``use_qk_l2norm`` q and k are L2-normalised per head,
    ``x / sqrt(sum(x^2) + 1e-6)`` (eps inside the sqrt, as transformers and fla); then q is
    multiplied by ``scale`` (default ``Dk ** -0.5``).

    Args:
        q, k: [B, T, Hk, Dk] any float dtype.
        v: [B, T, Hv, Dv]; Hv a multiple of Hk. Value head h uses q/k head ``h // (Hv // Hk)``
            (repeat_interleave: consecutive value heads share a key head, as in transformers'
            qwen3_5 and fla; not tiled).
        g: [B, T, Hv] log-decay <= 0 (fp32 wanted; see ``gdn_gate``).
        beta: [B, T, Hv] write strength in (0, 1) (``sigmoid(in_proj_b(x))``), used in fp32.
        initial_state: [N, Hv, Dk, Dv] fp32 k-first, or None for zeros; N = B, or the number of
            sequences with cu_seqlens.
        cu_seqlens: [N+1] int32 cumulative lengths starting at 0 (B must be 1): the packed
            sequences are independent, each starting from its own ``initial_state[i]``; empty
            sequences are allowed (their state passes through unchanged).
        state_slots: [N] integer or None. When given, ``initial_state`` is a state *pool*
            [S, Hv, Dk, Dv] fp32 (the engine's cache): sequence i starts from row
            ``state_slots[i]``, its final state is written back to that row **in place**, and
            the returned final_state is the pool itself. The decode path uses it so no state is
            gathered or scattered around the kernel (the state is the bulk of a decode step's
            bytes at batch > 1). Rows not named are untouched; a repeated slot (padding rows of
            a fixed-size batch) gets one of the results.

    Returns ``(o [B, T, Hv, Dv] in v.dtype, final_state [N, Hv, Dk, Dv] fp32)``.

    Models: Qwen3.5 / Qwen3.5-MoE / Qwen3-Next ``linear_attention`` layers: Hk =
    ``linear_num_key_heads``, Hv = ``linear_num_value_heads``, Dk = ``linear_key_head_dim``,
    Dv = ``linear_value_head_dim``; q, k, v come out of ``causal_conv1d`` (SiLU) and the model
    calls with ``use_qk_l2norm=True`` and the default scale. transformers runs this form for
    single-token decode and ``gdn_chunked`` for prefill.
    """
    if state_slots is not None:
        return on_state_slots(gdn_recurrent, "gdn_recurrent", q, k, v, g, beta, initial_state, state_slots,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens)
    return _recurrent("gdn_recurrent", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                      cu_seqlens, per_channel=False)


def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                  scale: float | None = None, use_qk_l2norm: bool = True,
                  cu_seqlens: torch.Tensor | None = None,
                  state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi Delta Attention (KDA), token by token (MODELS.md §4.2, §4.5, §5; ENGINES.md §2.5).

    The gated delta rule of ``gdn_recurrent`` with a **per-key-channel** decay: per token
    ``S <- diag(e^{g_t}) S`` (row i of S, key channel i, decays by ``e^{g_t[i]}``);
    ``delta = beta_t (v_t - S^T k_t)``; ``S <- S + k_t delta^T``; ``o_t = S^T q_t``. q, k are
    L2-normalised (eps 1e-6 inside the sqrt) when ``use_qk_l2norm``; q is scaled by ``scale``
    (default ``Dk ** -0.5``). All in fp32.

    Args:
        q, k: [B, T, H, Dk]. v: [B, T, Hv, Dv] (the KDA models have Hv == H; a multiple of H is
            accepted and maps like ``gdn_recurrent``, as fla's naive KDA does).
        g: [B, T, Hv, Dk] per-channel log-decay <= 0 (fp32 wanted; see ``kda_gate``).
        beta: [B, T, Hv] (``sigmoid(b_proj(x))``).
        initial_state: [N, Hv, Dk, Dv] fp32 k-first or None; cu_seqlens, state_slots: as
            ``gdn_recurrent``.

    Returns ``(o [B, T, Hv, Dv] in v.dtype, final_state [N, Hv, Dk, Dv] fp32)``.

    Models: Kimi-Linear (``linear_attn_config.num_heads`` / ``head_dim``, 32 x 128), GLM-5.3-Flash
    (``linear_num_heads`` / ``linear_head_dim``, 64 x 128), Kimi-K3; Dk = Dv = head_dim, q, k, v
    after ``causal_conv1d`` (SiLU), ``use_qk_l2norm=True``, default scale.
    """
    if state_slots is not None:
        return on_state_slots(kda_recurrent, "kda_recurrent", q, k, v, g, beta, initial_state, state_slots,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens)
    return _recurrent("kda_recurrent", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                      cu_seqlens, per_channel=True)


def _softplus(x: torch.Tensor) -> torch.Tensor:
    # log1p(e^x), returning x itself above 20: the threshold of transformers' qwen3_5 /
    # kimi_linear / glm5_next gates and of fla's kernels. kimi_linear and glm5_next write
    # log(1 + e^x), which differs only by rounding (and underflows to 0 below x ~ -17).
    return torch.nn.functional.softplus(x, beta=1.0, threshold=20.0)


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Gated DeltaNet decay gate: ``g = -exp(A_log) * softplus(a + dt_bias)`` (MODELS.md §3.3).

    Args:
        a: [..., Hv] (``in_proj_a(x)``, typically [B, T, Hv]), any float dtype.
        A_log: [Hv] (``linear_attn.A_log``); dt_bias: [Hv] (``linear_attn.dt_bias``); any float
            dtype, used in fp32 (vendors keep A_log in fp32; a bf16 A_log costs precision).

    Returns g [..., Hv] fp32, <= 0, the log-decay for ``gdn_recurrent`` / ``gdn_chunked``.
    softplus is ``log(1 + e^x)``, returning x above 20.
    """
    if a.dim() < 1 or not a.is_floating_point():
        raise ValueError(f"gdn_gate: a must be a float tensor [..., Hv], got {a.dtype} "
                         f"{list(a.shape)}")
    hv = a.shape[-1]
    if tuple(A_log.shape) != (hv,) or tuple(dt_bias.shape) != (hv,):
        raise ValueError(f"gdn_gate: A_log and dt_bias must be [{hv}] (Hv), got "
                         f"{list(A_log.shape)} and {list(dt_bias.shape)}")
    return -A_log.float().exp() * _softplus(a.float() + dt_bias.float())


def check_kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                   lower_bound: float | None) -> tuple[int, int]:
    """Validate :func:`kda_gate`'s arguments; returns (H, Dk)."""
    if f.dim() < 2 or not f.is_floating_point():
        raise ValueError(f"kda_gate: f must be a float tensor [..., H, Dk], got {f.dtype} "
                         f"{list(f.shape)}")
    h, dk = f.shape[-2], f.shape[-1]
    if tuple(A_log.shape) not in ((h,), (1, 1, h, 1)):
        raise ValueError(f"kda_gate: A_log must be [{h}] or [1, 1, {h}, 1], got "
                         f"{list(A_log.shape)}")
    if tuple(dt_bias.shape) not in ((h * dk,), (h, dk)):
        raise ValueError(f"kda_gate: dt_bias must be [{h * dk}] (H*Dk), got {list(dt_bias.shape)}")
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"kda_gate: lower_bound must be negative (e.g. -5.0), got {lower_bound}")
    return h, dk


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *,
             lower_bound: float | None = None) -> torch.Tensor:
    """KDA per-channel decay gate (MODELS.md §4.2; §4.5 and §5 for the lower-bounded form).

    With ``x = f + dt_bias`` (fp32) and ``A = exp(A_log[h])`` per head:

    * ``lower_bound=None`` (Kimi-Linear): ``g = -A * softplus(x)``, softplus = ``log(1 + e^x)``
      returning x above 20;
    * ``lower_bound=lb < 0`` (GLM-5.3-Flash ``linear_lower_bound``, Kimi-K3
      ``linear_attn_config.gate_lower_bound``; -5 in both): ``g = lb * sigmoid(A * x)``, so
      ``lb < g < 0``. Note A multiplies *inside* the sigmoid here and outside softplus above.

    Args:
        f: [..., H, Dk] (``f_b_proj(f_a_proj(x))`` viewed per head), any float dtype.
        A_log: [H] or [1, 1, H, 1] (Kimi-Linear stores the latter), used in fp32.
        dt_bias: [H * Dk] (or [H, Dk]), channel ``h * Dk + d`` for head h, channel d; fp32 used.

    Returns g [..., H, Dk] fp32, the log-decay for ``kda_recurrent`` / ``kda_chunked``.
    """
    h, dk = check_kda_gate(f, A_log, dt_bias, lower_bound)
    x = f.float() + dt_bias.float().reshape(h, dk)
    a = A_log.float().reshape(h, 1).exp()
    if lower_bound is None:
        return -a * _softplus(x)
    return lower_bound * torch.sigmoid(a * x)


# ---------------------------------------------------------------------------------------------
# Cases: Qwen3.5-0.8B-like GDN scaled down (Hk=2, Hv=4, Dk=Dv=64) and KDA with H=2, Dk=Dv=64.


def _la_case(B: int, T: int, hk: int, hv: int, d: int, *, per_channel: bool, state: bool,
             seqlens: tuple[int, ...] | None = None, qk_scale: float = 1.0, g_lo: float = -2.0,
             pool_extra: int = 0, **extra):
    def make(gen, dtype, device):
        gshape = (B, T, hv, d) if per_channel else (B, T, hv)
        # Decays in [e^g_lo, e^-0.01] per token (KDA: per channel), beta in (0, 1).
        inputs = {
            "q": randn(gen, B, T, hk, d, dtype=dtype, device=device, scale=qk_scale),
            "k": randn(gen, B, T, hk, d, dtype=dtype, device=device, scale=qk_scale),
            "v": randn(gen, B, T, hv, d, dtype=dtype, device=device),
            "g": uniform(gen, *gshape, lo=g_lo, hi=-0.01, dtype=torch.float32, device=device),
            "beta": uniform(gen, B, T, hv, lo=0.05, hi=0.95, dtype=torch.float32, device=device),
            **extra,
        }
        n = B if seqlens is None else len(seqlens)
        if seqlens is not None:
            bounds = [0]
            for length in seqlens:
                bounds.append(bounds[-1] + length)
            inputs["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32, device=device)
        if state:
            inputs["initial_state"] = randn(gen, n + pool_extra, hv, d, d, dtype=torch.float32,
                                            device=device, scale=0.5)
        if pool_extra:
            # A pool with spare rows; the sequences use a scattered, reordered subset of them.
            perm = torch.randperm(n + pool_extra, generator=gen)[:n]
            inputs["state_slots"] = perm.to(device=device, dtype=torch.int32)
        return inputs
    return make


def _cases(per_channel: bool, chunked: bool) -> list[Case]:
    hk, hv = (2, 2) if per_channel else (2, 4)
    cs = {"chunk_size": 16} if chunked else {}
    slots = [
        # The in-place state pool form (engine prefill: sequences past one chunk, reordered
        # slots of a pool with spare rows).
        Case("slots_varlen_50_29", _la_case(1, 79, hk, hv, 64, per_channel=per_channel,
                                            state=True, seqlens=(50, 29), pool_extra=2, **cs)),
    ] if chunked else [
        # The in-place state pool form (engine decode and speculative verification).
        Case("slots_decode_B3", _la_case(3, 1, hk, hv, 64, per_channel=per_channel, state=True,
                                         pool_extra=3)),
        Case("slots_varlen_1_4_2", _la_case(1, 7, hk, hv, 64, per_channel=per_channel, state=True,
                                            seqlens=(1, 4, 2), pool_extra=2)),
    ]
    return slots + [
        # T=100 = 64 + 36: a partial last chunk at the default chunk size.
        Case("batch2_T100", _la_case(2, 100, hk, hv, 64, per_channel=per_channel, state=False)),
        Case("state_T37", _la_case(2, 37, hk, hv, 64, per_channel=per_channel, state=True, **cs)),
        Case("varlen_1_50_29", _la_case(1, 80, hk, hv, 64, per_channel=per_channel, state=True,
                                        seqlens=(1, 50, 29), **cs)),
        Case("decode_B4", _la_case(4, 1, hk, hv, 64, per_channel=per_channel, state=True)),
        # Without the L2 norm the caller keeps |k| near 1 (beta k.k < 2, a stable delta rule).
        Case("no_l2norm_scale", _la_case(1, 20, hk, hv, 32, per_channel=per_channel, state=True,
                                         qk_scale=32 ** -0.5, use_qk_l2norm=False, scale=0.5)),
        # The softplus gate is unbounded (g of -100 per token happens): e^{G_t} e^{-G_s} style
        # factorisations overflow here; kernels limited to bounded gates must refuse via check=.
        Case("strong_decay", _la_case(1, 40, hk, hv, 32, per_channel=per_channel, state=True,
                                      g_lo=-100.0, **cs)),
    ]


# Relative RMSE (fla's metric, ENGINES.md §2.5). The delta rule's recurrence accumulates
# rounding over T steps; fla's own tests use 2e-3 (fused recurrent) and 5e-3 (chunk) for 16-bit
# inputs, which we keep for bf16. fp32 inputs are held to 2e-5: fp32 kernels reach ~1e-6 here,
# and a looser bound let a chunked KDA kernel through whose strong-decay error (1e-4) showed up
# only as 5e-4 drift in Kimi-Linear's logits. A case also passes when every element is within
# 1e-6 (fla does the same).
_LA_TOL = {torch.float32: Tol(atol=1e-6, rtol=2e-5, metric="rmse"),
           torch.bfloat16: Tol(atol=1e-6, rtol=5e-3, metric="rmse")}

GDN_RECURRENT = define_op(gdn_recurrent, cases=_cases(False, False), tolerance=_LA_TOL,
                          mutates=("initial_state",))
def gdn_gated_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                        b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                        initial_state: torch.Tensor | None = None, *, scale: float | None = None,
                        use_qk_l2norm: bool = True, cu_seqlens: torch.Tensor | None = None,
                        state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gdn_recurrent` with its gates taken from the raw projections, so that a decode step
    runs the gates inside the recurrence (two kernels fewer per Gated DeltaNet layer).

    Exactly ``gdn_recurrent(q, k, v, gdn_gate(a, A_log, dt_bias), sigmoid(b), initial_state,
    ...)`` where ``sigmoid(b)`` is rounded to b's dtype (as the model computes beta:
    ``b.sigmoid()`` in the model dtype).

    Shapes: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; a, b [B, T, Hv] any float dtype (views into
    one projection's output are fine); A_log, dt_bias [Hv]; initial_state, cu_seqlens,
    state_slots as :func:`gdn_recurrent`. Returns ``(o [B, T, Hv, Dv] in v.dtype, final_state
    [N, Hv, Dk, Dv] fp32)``.

    Uses: the decode step of Qwen3.5's ``linear_attention`` layers (``in_proj_a``,
    ``in_proj_b``, ``A_log``, ``dt_bias``).
    """
    return compose_gdn_gated_recurrent(gdn_gate, gdn_recurrent, q, k, v, a, b, A_log, dt_bias,
                                       initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                       cu_seqlens=cu_seqlens, state_slots=state_slots)


def compose_gdn_gated_recurrent(gate, rule, q, k, v, a, b, A_log, dt_bias, initial_state, **kw):
    """``gdn_gated_recurrent`` from implementations of ``gdn_gate`` and ``gdn_recurrent`` (the
    reference's definition; impls reuse it for the calls they do not fuse)."""
    if not (a.is_floating_point() and b.is_floating_point()) or a.shape != b.shape:
        raise ValueError(f"gdn_gated_recurrent: a and b must be float tensors of one shape "
                         f"[B, T, Hv], got {a.dtype} {list(a.shape)} and {b.dtype} {list(b.shape)}")
    return rule(q, k, v, gate(a, A_log, dt_bias), torch.sigmoid(b), initial_state, **kw)


def _gated_cases() -> list[Case]:
    """gdn_recurrent's decode-like cases (one token, or a few per sequence as in speculative
    verification) with raw gate inputs in place of g and beta."""
    def raw(make):
        def made(gen, dtype, device):
            inputs = make(gen, dtype, device)
            shape, hv = inputs.pop("g").shape, inputs["v"].shape[2]
            inputs.pop("beta")
            inputs["a"] = randn(gen, *shape, dtype=dtype, device=device, scale=3.0)
            inputs["b"] = randn(gen, *shape, dtype=dtype, device=device, scale=2.0)
            inputs["A_log"] = uniform(gen, hv, lo=-4.0, hi=1.0, dtype=torch.float32, device=device)
            inputs["dt_bias"] = randn(gen, hv, dtype=torch.float32, device=device)
            return inputs
        return made
    return [Case(c.name, raw(c.make)) for c in _cases(False, False)
            if c.name in ("slots_decode_B3", "slots_varlen_1_4_2", "decode_B4")]


def kda_gated_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor,
                        b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                        initial_state: torch.Tensor | None = None, *, scale: float | None = None,
                        use_qk_l2norm: bool = True, cu_seqlens: torch.Tensor | None = None,
                        state_slots: torch.Tensor | None = None,
                        lower_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kda_recurrent` with its gates taken from the raw projections, so that a decode
    step runs the gates inside the recurrence (the gate kernel and beta's two kernels fewer per
    KDA layer).

    Exactly ``kda_recurrent(q, k, v, kda_gate(f, A_log, dt_bias, lower_bound=lower_bound),
    sigmoid(b.float()), initial_state, ...)``: beta in fp32, as Kimi-Linear and K3 compute it.

    Shapes: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; f [B, T, Hv, Dk] (``f_b_proj``'s output per
    head) and b [B, T, Hv] (a view into the input projection is fine), any float dtype; A_log
    [Hv] or [1, 1, Hv, 1]; dt_bias [Hv * Dk] or [Hv, Dk]; initial_state, cu_seqlens,
    state_slots as :func:`kda_recurrent`. Returns ``(o [B, T, Hv, Dv] in v.dtype, final_state
    [N, Hv, Dk, Dv] fp32)``.

    Uses: the decode step of Kimi-Linear's and Kimi-K3's KDA layers.
    """
    return compose_kda_gated_recurrent(kda_gate, kda_recurrent, q, k, v, f, b, A_log, dt_bias,
                                       initial_state, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                       cu_seqlens=cu_seqlens, state_slots=state_slots,
                                       lower_bound=lower_bound)


def compose_kda_gated_recurrent(gate, rule, q, k, v, f, b, A_log, dt_bias, initial_state, *,
                                lower_bound=None, **kw):
    """``kda_gated_recurrent`` from implementations of ``kda_gate`` and ``kda_recurrent`` (the
    reference's definition; impls reuse it for the calls they do not fuse)."""
    if not b.is_floating_point() or b.shape != f.shape[:-1]:
        raise ValueError(f"kda_gated_recurrent: b must be a float tensor [B, T, Hv] matching f "
                         f"{list(f.shape)}, got {b.dtype} {list(b.shape)}")
    return rule(q, k, v, gate(f, A_log, dt_bias, lower_bound=lower_bound),
                torch.sigmoid(b.float()), initial_state, **kw)


def _kda_gated_cases() -> list[Case]:
    """kda_recurrent's decode-like cases with raw gate inputs in place of g and beta; the last
    one with K3's lower-bounded gate."""
    def raw(make, lower_bound):
        def made(gen, dtype, device):
            inputs = make(gen, dtype, device)
            shape = inputs.pop("g").shape
            hv, dk = shape[2], shape[3]
            inputs.pop("beta")
            inputs["f"] = randn(gen, *shape, dtype=dtype, device=device, scale=3.0)
            inputs["b"] = randn(gen, *shape[:3], dtype=dtype, device=device, scale=2.0)
            inputs["A_log"] = uniform(gen, hv, lo=-4.0, hi=1.0, dtype=torch.float32, device=device)
            inputs["dt_bias"] = randn(gen, hv * dk, dtype=torch.float32, device=device)
            inputs["lower_bound"] = lower_bound
            return inputs
        return made
    base = {c.name: c for c in _cases(True, False)}
    return [Case("slots_decode_B3", raw(base["slots_decode_B3"].make, None)),
            Case("slots_varlen_1_4_2", raw(base["slots_varlen_1_4_2"].make, None)),
            Case("decode_B4_lower_bound", raw(base["decode_B4"].make, -5.0))]


GDN_CHUNKED = define_op(gdn_chunked, cases=_cases(False, True), tolerance=_LA_TOL,
                        family="linear_attention", mutates=("initial_state",))
GDN_GATED_RECURRENT = define_op(gdn_gated_recurrent, cases=_gated_cases(), tolerance=_LA_TOL,
                                mutates=("initial_state",))
KDA_RECURRENT = define_op(kda_recurrent, cases=_cases(True, False), tolerance=_LA_TOL,
                          mutates=("initial_state",))
KDA_CHUNKED = define_op(kda_chunked, cases=_cases(True, True), tolerance=_LA_TOL,
                        family="linear_attention", mutates=("initial_state",))
KDA_GATED_RECURRENT = define_op(kda_gated_recurrent, cases=_kda_gated_cases(), tolerance=_LA_TOL,
                                mutates=("initial_state",))


def _gdn_gate_case(shape: tuple[int, ...]):
    def make(gen, dtype, device):
        hv = shape[-1]
        return {"a": randn(gen, *shape, dtype=dtype, device=device, scale=3.0),
                "A_log": uniform(gen, hv, lo=-4.0, hi=2.7, dtype=torch.float32, device=device),
                "dt_bias": randn(gen, hv, dtype=torch.float32, device=device)}
    return make


def _kda_gate_case(shape: tuple[int, ...], lower_bound: float | None, a_log_4d: bool):
    def make(gen, dtype, device):
        h, dk = shape[-2], shape[-1]
        # Scale 10 puts some arguments above softplus's threshold of 20.
        a_log = uniform(gen, h, lo=-4.0, hi=1.0, dtype=torch.float32, device=device)
        return {"f": randn(gen, *shape, dtype=dtype, device=device, scale=10.0),
                "A_log": a_log.reshape(1, 1, h, 1) if a_log_4d else a_log,
                "dt_bias": randn(gen, h * dk, dtype=torch.float32, device=device),
                "lower_bound": lower_bound}
    return make


# One elementwise expression, output fp32 for any input dtype: near-exact. The absolute part
# admits other softplus formulas (log(1 + e^x) as transformers / fla's kernels, fast exp2/log2)
# whose ~1e-7 error near 0 is scaled by exp(A_log) (up to ~16).
_GATE_TOL = {torch.float32: Tol(atol=1e-5, rtol=1e-6), torch.bfloat16: Tol(atol=1e-5, rtol=1e-6)}

GDN_GATE = define_op(gdn_gate, cases=[Case("B2_T33_Hv32", _gdn_gate_case((2, 33, 32))),
                                      Case("packed_T17_Hv4", _gdn_gate_case((17, 4)))],
                     tolerance=_GATE_TOL)
KDA_GATE = define_op(kda_gate, cases=[
    Case("softplus_kimi", _kda_gate_case((2, 9, 4, 64), None, a_log_4d=True)),
    Case("lower_bound_glm5", _kda_gate_case((2, 9, 4, 64), -5.0, a_log_4d=False)),
], tolerance=_GATE_TOL)
