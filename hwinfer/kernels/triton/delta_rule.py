"""Triton fused recurrent gated delta rule (contracts: :func:`hwinfer.ops.linear_attention.gdn_recurrent`,
:func:`~hwinfer.ops.linear_attention.gdn_gated_recurrent`,
:func:`~hwinfer.ops.linear_attention.kda_recurrent` and
:func:`~hwinfer.ops.linear_attention.kda_gated_recurrent`).

One kernel serves both: GDN's decay is one scalar per token and value head, KDA's one value per
key channel (``PER_CHANNEL``). One program owns one (sequence, value head, block of BV value
channels): it keeps its ``[Dk, BV]`` slice of the fp32 state in registers and walks the tokens
of its sequence, per token

    q, k <- l2norm (optional, eps 1e-6 inside the sqrt), q <- q * scale
    S <- diag(e^g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q

then stores the final state. ``RAW_GATES`` (gdn_gated_recurrent) reads the projections a, b
instead of g, beta and computes ``g = -e^{A_log} softplus(a + dt_bias)`` and ``beta =
sigmoid(b)`` per token itself: the decode step's two gate kernels per layer disappear; for KDA
(kda_gated_recurrent) f, b and ``kda_gate`` per key channel (``BOUNDED``: K3's ``lb *
sigmoid(e^{A_log} x)``), beta in fp32. Made for
decode (T=1) and short multi-token steps (speculative verification); long prefills belong to the
chunked form. The value channels of one head are
independent of each other in this recurrence (every step reads S only through ``S^T x`` per
value column), so splitting Dv over programs needs no communication; q/k (and their norms) are
re-read per block, which costs Dk elements per token against Dk * BV of state.

Supported (``delta_rule_supported``): Dk and Dv powers of two in [16, 256] (no masking of
partial tiles; 256 x BV fp32 still fits registers), q/k/v in fp16 / bf16 / fp32, last dims
contiguous (q/k/v may otherwise be strided views, e.g. slices of one projection). With
cu_seqlens, its contents are trusted (checking them would cost a device sync on every decode).
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok

from hwinfer.kernels.triton import INTERPRET

from hwinfer.ops.linear_attention_chunked import L2NORM_EPS, check_inputs

_INTERPRET = INTERPRET
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# (value channels, warps) a program for one-token steps with few (sequence, head) rows: Qwen3.5's
# batch-1 decode (16 heads x 128 channels) as 128 two-warp programs; on the H200 its step was
# ~27 us faster than with one warp (docs/kernels.md, eleventh session).
DECODE_TILE = (16, 2)


@triton.jit
def _delta_rule_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dt_ptr, h0_ptr, o_ptr,
                       ht_ptr, cu_ptr, slot_ptr, T, Hk, Hv, sq_b, sq_t, sq_h, sv_b, sv_t, sv_h,
                       sg_t, sb_t, scale, eps, lb,
                       DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                       PER_CHANNEL: tl.constexpr, USE_L2NORM: tl.constexpr,
                       HAS_H0: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_SLOTS: tl.constexpr,
                       RAW_GATES: tl.constexpr, BOUNDED: tl.constexpr, PDL: tl.constexpr):
    # Axis 0 (up to 2^31 programs) carries sequence x head, axis 1 (<= 65535) the value blocks.
    i_nh = tl.program_id(0)
    i_vb = tl.program_id(1)
    i_n = i_nh // Hv
    i_h = i_nh % Hv
    offs_k = tl.arange(0, DK)
    offs_v = i_vb * BV + tl.arange(0, BV)
    if HAS_SLOTS:
        # State pool: this sequence's row, read and written in place (ht_ptr == h0_ptr). Loaded
        # before the PDL wait, like a GEMV's weights (pdl.py): only this op writes pool rows
        # (in earlier steps) and the slots come from a copy before the step, so the state's
        # round trip overlaps the tail of the projection before it.
        state_row = tl.load(slot_ptr + i_n).to(tl.int64) * Hv + i_h
        state_off = state_row * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        h = tl.load(h0_ptr + state_off).to(tl.float32)
    pdl_enter(PDL)
    i_hk = i_h // (Hv // Hk)   # GQA: consecutive value heads share one key head
    if IS_VARLEN:
        bos = tl.load(cu_ptr + i_n).to(tl.int64)
        seq_len = (tl.load(cu_ptr + i_n + 1).to(tl.int64) - bos).to(tl.int32)
        i_b = 0
    else:
        bos = 0
        seq_len = T
        i_b = i_n.to(tl.int64)
    # int64 bases: T * H * D reaches 2^31 at long packed batches.
    p_q = q_ptr + i_b * sq_b + bos * sq_t + i_hk * sq_h + offs_k
    p_k = k_ptr + i_b * sq_b + bos * sq_t + i_hk * sq_h + offs_k
    p_v = v_ptr + i_b * sv_b + bos * sv_t + i_h * sv_h + offs_v
    tok0 = i_b * T + bos            # flat token index into o, g, beta (token strides sg_t, sb_t)
    p_o = o_ptr + (tok0 * Hv + i_h) * DV + offs_v
    p_beta = beta_ptr + tok0 * sb_t + i_h
    if PER_CHANNEL:
        p_g = g_ptr + (tok0 * Hv + i_h) * DK + offs_k
    else:
        p_g = g_ptr + tok0 * sg_t + i_h
    if RAW_GATES:  # g and beta given as projections (a or f, b): the gate and sigmoid in here
        neg_a = -tl.exp(tl.load(alog_ptr + i_h).to(tl.float32))
        if PER_CHANNEL:   # kda_gate's dt_bias: one per key channel
            dt = tl.load(dt_ptr + i_h * DK + offs_k).to(tl.float32)
        else:
            dt = tl.load(dt_ptr + i_h).to(tl.float32)
    if not HAS_SLOTS:
        state_off = i_nh.to(tl.int64) * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        if HAS_H0:
            h = tl.load(h0_ptr + state_off).to(tl.float32)
        else:
            h = tl.zeros([DK, BV], dtype=tl.float32)

    for _ in range(0, seq_len):
        # Upcast right after every load: the interpreter (and the contract) want fp32 math.
        b_q = tl.load(p_q).to(tl.float32)
        b_k = tl.load(p_k).to(tl.float32)
        b_v = tl.load(p_v).to(tl.float32)
        b_beta = tl.load(p_beta).to(tl.float32)
        if RAW_GATES and PER_CHANNEL:   # KDA: sigmoid(b.float()), fp32 as Kimi computes it
            b_beta = 1.0 / (1.0 + tl.exp(-b_beta))
        elif RAW_GATES:
            # beta rounded to b's dtype, as the model's b.sigmoid() gives it
            b_beta = (1.0 / (1.0 + tl.exp(-b_beta))).to(beta_ptr.dtype.element_ty).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=0) + eps)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=0) + eps)
        b_q = b_q * scale
        if PER_CHANNEL and RAW_GATES:   # kda_gate per channel, as its reference computes it
            x = tl.load(p_g).to(tl.float32) + dt
            if BOUNDED:   # lb * sigmoid(A x)
                gk = lb / (1.0 + tl.exp(neg_a * x))
            else:         # -A softplus(x)
                gk = neg_a * tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
            h = h * tl.exp(gk)[:, None]
        elif PER_CHANNEL:
            h = h * tl.exp(tl.load(p_g).to(tl.float32))[:, None]   # row i decays by e^{g[i]}
        elif RAW_GATES:
            x = tl.load(p_g).to(tl.float32) + dt   # softplus as the gdn_gate kernel computes it
            soft = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
            h = h * tl.exp(neg_a * soft)
        else:
            h = h * tl.exp(tl.load(p_g).to(tl.float32))
        delta = b_beta * (b_v - tl.sum(h * b_k[:, None], axis=0))
        h = h + b_k[:, None] * delta[None, :]
        b_o = tl.sum(h * b_q[:, None], axis=0)
        tl.store(p_o, b_o.to(o_ptr.dtype.element_ty))
        p_q += sq_t
        p_k += sq_t
        p_v += sv_t
        p_o += Hv * DV
        p_beta += sb_t
        if PER_CHANNEL:
            p_g += Hv * DK
        else:
            p_g += sg_t
    tl.store(ht_ptr + state_off, h)


def _pow2_in_range(x: int) -> bool:
    return 16 <= x <= 256 and x & (x - 1) == 0


def delta_rule_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                         state_slots: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check for both ops: what the kernel does not cover goes to the next impl."""
    if state_slots is not None and (initial_state is None or initial_state.dtype != torch.float32
                                    or not initial_state.is_contiguous()):
        return "state_slots needs a contiguous fp32 state pool (updated in place)"
    if state_slots is not None and (state_slots.is_floating_point() or state_slots.dtype == torch.bool):
        return f"state_slots must be an integer tensor, got {state_slots.dtype}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k, v must be 4-D [B, T, H, D]"
    dk, dv = k.shape[-1], v.shape[-1]
    if not _pow2_in_range(dk) or not _pow2_in_range(dv):
        return f"Dk={dk}, Dv={dv}: each must be a power of two in [16, 256]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _FLOATS:
            return f"{name} dtype {t.dtype} not in fp16/bf16/fp32"
    for name, t in (("g", g), ("beta", beta), ("initial_state", initial_state)):
        if t is not None and t.dtype not in _FLOATS:
            return f"{name} dtype {t.dtype} not in fp16/bf16/fp32"
    return None


def _token_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [B, T, Hv] -> (x or a contiguous copy, its token stride): unit head stride and flat
    token index b * T + t, which views into a projection's output already are."""
    B, T = x.shape[:2]
    step = x.stride(1) if T > 1 else x.stride(0)
    if x.stride(2) != 1 or (B > 1 and T > 1 and x.stride(0) != T * x.stride(1)):
        x = x.contiguous()
        step = x.shape[2]
    return x, step


def _run(op: str, q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens,
         per_channel: bool, block_v: int | None, num_warps: int | None, state_slots=None,
         gates: tuple[torch.Tensor, torch.Tensor] | None = None,
         lower_bound: float | None = None):
    """Both ops, and with ``gates`` = (A_log, dt_bias) the gated forms (g, beta = a or f, b;
    ``lower_bound``: kda_gate's bounded form)."""
    varlen = cu_seqlens is not None
    pool = state_slots is not None
    # Validate shapes as the reference does; cu_seqlens contents are trusted (no host sync).
    n = check_inputs(op, q, k, v, g, beta, None if varlen or pool else initial_state, None,
                     per_channel=per_channel)
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    if varlen:
        if B != 1:
            raise ValueError(f"{op}: with cu_seqlens the batch dimension must be 1, got B={B}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
            raise ValueError(f"{op}: cu_seqlens must be a 1-D integer tensor [N+1], got "
                             f"{cu_seqlens.dtype} {list(cu_seqlens.shape)}")
        n = cu_seqlens.numel() - 1
        if not pool and initial_state is not None and tuple(initial_state.shape) != (n, Hv, Dk, Dv):
            raise ValueError(f"{op}: initial_state must be {[n, Hv, Dk, Dv]} ([N, Hv, Dk, Dv], "
                             f"k-first), got {list(initial_state.shape)}")
    if pool and (state_slots.shape != (n,) or initial_state is None
                 or tuple(initial_state.shape[1:]) != (Hv, Dk, Dv)):
        raise ValueError(f"{op}: state_slots must be [{n}] over a pool [S, {Hv}, {Dk}, {Dv}], got "
                         f"{list(state_slots.shape)} and "
                         f"{None if initial_state is None else list(initial_state.shape)}")
    reason = delta_rule_supported(q, k, v, g, beta, initial_state, state_slots)
    if reason is not None:
        raise ValueError(f"{op} (triton): {reason}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if q.stride() != k.stride():
        q, k = q.contiguous(), k.contiguous()
    if per_channel:
        g, sg = g.contiguous(), Hv * Dk
    else:
        g, sg = _token_rows(g)
    beta, sb = _token_rows(beta)
    alog, dt = (t.reshape(-1).contiguous() for t in gates) if gates is not None else (beta, beta)
    o = torch.empty(B, T, Hv, Dv, dtype=v.dtype, device=v.device)
    ht = initial_state if pool else torch.empty(n, Hv, Dk, Dv, dtype=torch.float32, device=v.device)
    if n * Hv == 0:
        return o, ht
    h0 = None
    if initial_state is not None:
        h0 = initial_state if pool else initial_state.to(torch.float32).contiguous()
    # Tuned on an H200 (scripts/bench_delta_rule.py, docs/kernels.md): single-token decode with
    # many (sequence, head) rows wants wide value blocks (64, 4 warps: 140 us vs 536 us for
    # fla's 8-wide blocks at 256 x 16 heads); few rows want 16-wide blocks (DECODE_TILE), and
    # multi-token steps 16-wide blocks on one warp. The interpreter pays per program and per op:
    # one program per head there.
    if block_v is None:
        block_v, warps = ((64, 4) if n * Hv >= 512 else DECODE_TILE) if T == 1 else (16, 1)
        block_v = Dv if _INTERPRET else block_v
        num_warps = num_warps or warps
    bv = min(block_v, Dv)
    if bv < 1 or bv & (bv - 1):   # unmasked tiles: BV must divide the power-of-two Dv
        raise ValueError(f"{op} (triton): block_v={block_v} must be a power of two")
    warps = num_warps or (1 if bv * Dk <= 2048 else 4)
    cu = cu_seqlens.to(torch.int32) if varlen else o   # dummy pointer when not varlen
    # Any integer dtype (the kernel widens each slot to int64): no conversion kernel per layer.
    slots = state_slots if pool else o
    _delta_rule_kernel[(n * Hv, triton.cdiv(Dv, bv))](
        q, k, v, g, beta, alog, dt, h0 if h0 is not None else ht, o, ht, cu, slots,
        T, Hk, Hv, q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
        sg, sb, float(Dk ** -0.5 if scale is None else scale), L2NORM_EPS,
        float(lower_bound or 0.0),
        DK=Dk, DV=Dv, BV=bv, PER_CHANNEL=per_channel, USE_L2NORM=bool(use_qk_l2norm),
        HAS_H0=h0 is not None, IS_VARLEN=varlen, HAS_SLOTS=pool, RAW_GATES=gates is not None,
        BOUNDED=lower_bound is not None, num_warps=warps,
        PDL=pdl_ok(v.device), **launch_kwargs(v.device))
    return o, ht


def gdn_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                  scale: float | None = None, use_qk_l2norm: bool = True,
                  cu_seqlens: torch.Tensor | None = None, state_slots: torch.Tensor | None = None,
                  block_v: int | None = None, num_warps: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``gdn_recurrent``: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [N, Hv, Dk, Dv] fp32 or None. Returns o [B, T, Hv, Dv] (v.dtype) and the
    final state [N, Hv, Dk, Dv] fp32. ``block_v`` / ``num_warps`` are tuning knobs."""
    return _run("gdn_recurrent", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, False, block_v, num_warps, state_slots)


def gdn_gated_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                        b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                        initial_state: torch.Tensor | None = None, *, scale: float | None = None,
                        use_qk_l2norm: bool = True, cu_seqlens: torch.Tensor | None = None,
                        state_slots: torch.Tensor | None = None, block_v: int | None = None,
                        num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``gdn_gated_recurrent``: :func:`gdn_recurrent` reading the raw gate inputs a, b
    [B, T, Hv] (strided views welcome) with A_log, dt_bias [Hv]; the gate and the sigmoid are
    computed per token in the recurrence."""
    reason = _gate_inputs_reason(a, b, A_log, dt_bias)  # _run checks the rest
    if reason is not None:
        raise ValueError(f"gdn_gated_recurrent (triton): {reason}")
    return _run("gdn_gated_recurrent", q, k, v, a, b, initial_state, scale, use_qk_l2norm,
                cu_seqlens, False, block_v, num_warps, state_slots, gates=(A_log, dt_bias))


def gdn_gated_recurrent_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                                  dt_bias: torch.Tensor, initial_state: torch.Tensor | None = None,
                                  state_slots: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check of :func:`gdn_gated_recurrent`: the gate inputs, then the delta rule's."""
    return _gate_inputs_reason(a, b, A_log, dt_bias) or \
        delta_rule_supported(q, k, v, a, b, initial_state, state_slots)


def _gate_inputs_reason(a, b, A_log, dt_bias) -> str | None:
    if a.dim() != 3 or a.shape != b.shape:
        return f"a and b must be [B, T, Hv] of one shape, got {list(a.shape)} and {list(b.shape)}"
    if A_log.shape != (a.shape[2],) or dt_bias.shape != (a.shape[2],):
        return f"A_log and dt_bias must be [{a.shape[2]}], got {list(A_log.shape)} and {list(dt_bias.shape)}"
    return None


def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                  scale: float | None = None, use_qk_l2norm: bool = True,
                  cu_seqlens: torch.Tensor | None = None, state_slots: torch.Tensor | None = None,
                  block_v: int | None = None, num_warps: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``kda_recurrent``: as :func:`gdn_recurrent` with g [B, T, Hv, Dk] (a log-decay
    per key channel)."""
    return _run("kda_recurrent", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, True, block_v, num_warps, state_slots)


def kda_gated_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor,
                        b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                        initial_state: torch.Tensor | None = None, *, scale: float | None = None,
                        use_qk_l2norm: bool = True, cu_seqlens: torch.Tensor | None = None,
                        state_slots: torch.Tensor | None = None, lower_bound: float | None = None,
                        block_v: int | None = None, num_warps: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``kda_gated_recurrent``: :func:`kda_recurrent` reading f [B, T, Hv, Dk] and b
    [B, T, Hv] (a strided view welcome) with A_log [Hv] (or [1, 1, Hv, 1]) and dt_bias
    [Hv * Dk]; kda_gate (either form) and beta's sigmoid computed per token in the recurrence."""
    reason = _kda_gate_inputs_reason(f, b, A_log, dt_bias, lower_bound)  # _run checks the rest
    if reason is not None:
        raise ValueError(f"kda_gated_recurrent (triton): {reason}")
    return _run("kda_gated_recurrent", q, k, v, f, b, initial_state, scale, use_qk_l2norm,
                cu_seqlens, True, block_v, num_warps, state_slots, gates=(A_log, dt_bias),
                lower_bound=lower_bound)


def kda_gated_recurrent_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  f: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                                  dt_bias: torch.Tensor, initial_state: torch.Tensor | None = None,
                                  state_slots: torch.Tensor | None = None,
                                  lower_bound: float | None = None, **_: object) -> str | None:
    """Per-call check of :func:`kda_gated_recurrent`: the gate inputs, then the delta rule's."""
    return _kda_gate_inputs_reason(f, b, A_log, dt_bias, lower_bound) or \
        delta_rule_supported(q, k, v, f, b, initial_state, state_slots)


def _kda_gate_inputs_reason(f, b, A_log, dt_bias, lower_bound) -> str | None:
    if f.dim() != 4 or b.shape != f.shape[:3]:
        return f"f must be [B, T, Hv, Dk] and b [B, T, Hv], got {list(f.shape)} and {list(b.shape)}"
    hv, dk = f.shape[2], f.shape[3]
    if A_log.numel() != hv or tuple(A_log.shape) not in ((hv,), (1, 1, hv, 1)):
        return f"A_log must be [{hv}] or [1, 1, {hv}, 1], got {list(A_log.shape)}"
    if tuple(dt_bias.shape) not in ((hv * dk,), (hv, dk)):
        return f"dt_bias must be [{hv * dk}] (Hv*Dk), got {list(dt_bias.shape)}"
    if lower_bound is not None and not lower_bound < 0:
        return f"lower_bound must be negative, got {lower_bound}"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for per_channel in (False, True):
        for dtype in ("bf16", "fp32"):
            for d, bv, warps in ((128, 16, 1), (128, 64, 4), (256, 16, 1)):
                ptr = f"*{dtype}"
                # decode with bv 64 (GDN) or 16 (KDA) also in its raw-gate form (the gated ops)
                for raw in (False, True) if bv == (16 if per_channel else 64) else (False,):
                    gate_t = ptr if raw else "*fp32"
                    sig = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "g_ptr": gate_t,
                           "beta_ptr": gate_t, "alog_ptr": "*fp32", "dt_ptr": "*fp32",
                           "h0_ptr": "*fp32", "o_ptr": ptr, "ht_ptr": "*fp32",
                           "cu_ptr": "*i32", "slot_ptr": "*i32", "T": "i32", "Hk": "i32",
                           "Hv": "i32", "sq_b": "i32", "sq_t": "i32", "sq_h": "i32",
                           "sv_b": "i32", "sv_t": "i32", "sv_h": "i32", "sg_t": "i32",
                           "sb_t": "i32", "scale": "fp32", "eps": "fp32", "lb": "fp32",
                           "DK": "constexpr",
                           "DV": "constexpr", "BV": "constexpr", "PER_CHANNEL": "constexpr",
                           "USE_L2NORM": "constexpr", "HAS_H0": "constexpr",
                           "IS_VARLEN": "constexpr", "HAS_SLOTS": "constexpr",
                           "RAW_GATES": "constexpr", "BOUNDED": "constexpr", "PDL": "constexpr"}
                    kind = ("gdn" if not per_channel else "kda") + ("_raw" if raw else "")
                    specs.append(AotSpec(
                        f"delta_rule[{kind},{dtype},{d},bv{bv}]", _delta_rule_kernel, sig,
                        {"DK": d, "DV": d, "BV": bv, "PER_CHANNEL": per_channel, "USE_L2NORM": True,
                         "HAS_H0": True, "IS_VARLEN": bv == 16, "HAS_SLOTS": bv == 64,
                         "RAW_GATES": raw, "BOUNDED": False, "PDL": False},
                        {"num_warps": warps}))
    return specs


AOT_SPECS = _aot_specs()
