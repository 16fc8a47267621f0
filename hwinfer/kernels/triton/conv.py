"""Triton short causal depthwise conv1d (contract: :func:`hwinfer.ops.conv.causal_conv1d`).

``_conv_kernel``, grid (sequences, channel blocks, token chunks): one program convolves
BLOCK_C channels of one chunk of one sequence's tokens, keeping the last K-1 (<= 3) inputs in
registers (``s0, s1, s2``, oldest first) as it walks the tokens. The registers start from the
K-1 inputs before the chunk: earlier tokens of the same sequence, or the carried state where the
chunk starts less than K-1 tokens into the sequence (zeros without state). The program holding
the sequence's last token (chunk 0 for an empty sequence) writes the new state from its
registers; in place (``state_slots``, a pool row) chunk 0 writes it, the one program that read
the old state, loading the last K-1 inputs when the sequence runs past its chunk. Chunks let a
long prefill spread over the machine; decode (T = 1) is one launch of one chunk. The chunk count comes from shapes (T), and cu_seqlens is read on the device only
(no host sync: decode gets captured in a CUDA graph); chunks past a sequence's end return.
All math in fp32 (loads upcast at once); y and the new state are stored in x.dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok


@triton.jit
def _prev_input(x_ptr, st_ptr, row64, p, bos, cols, cmask, stride_xt, stride_sn, stride_sc,
                stride_sk, KM1: tl.constexpr, HAS_STATE: tl.constexpr):
    """Input at packed position p of the sequence starting at bos: x[p] if p >= bos, else the
    entry K-1 - (bos - p) (oldest first) of state row ``row64``, else 0."""
    inside = p >= bos
    v = tl.load(x_ptr + tl.where(inside, p, 0).to(tl.int64) * stride_xt + cols,
                mask=cmask & inside, other=0.0).to(tl.float32)
    if HAS_STATE:
        k = KM1 - (bos - p)
        sv = tl.load(st_ptr + row64 * stride_sn + cols * stride_sc + tl.where(inside, 0, k) * stride_sk,
                     mask=cmask & (p < bos) & (k >= 0), other=0.0).to(tl.float32)
        v = tl.where(inside, v, sv)
    return v


@triton.jit
def store_conv_state(base, sk, s0, s1, s2, mask, K: tl.constexpr):
    """A sequence's new conv state: its last K-1 inputs (s0 oldest, s2 newest; the first 4 - K
    unused) at ``base + j * sk``, oldest first, in the state's dtype."""
    if K >= 4:
        tl.store(base + (K - 4) * sk, s0.to(base.dtype.element_ty), mask=mask)
    if K >= 3:
        tl.store(base + (K - 3) * sk, s1.to(base.dtype.element_ty), mask=mask)
    if K >= 2:
        tl.store(base + (K - 2) * sk, s2.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _conv_kernel(x_ptr, w_ptr, bias_ptr, st_ptr, cu_ptr, y_ptr, ns_ptr, slot_ptr,
                 T, C, CHUNK, stride_xb, stride_xt, stride_wc, stride_wk,
                 stride_sn, stride_sc, stride_sk, stride_yb, stride_yt,
                 K: tl.constexpr, BLOCK_C: tl.constexpr, VARLEN: tl.constexpr,
                 HAS_STATE: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                 HAS_SLOTS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    n = tl.program_id(0)
    cb = tl.program_id(1)
    ci = tl.program_id(2)
    n64 = n.to(tl.int64)
    # The state row this sequence reads (and, in place, writes): its pool slot, or n.
    if HAS_SLOTS:
        row64 = tl.load(slot_ptr + n).to(tl.int64)
    else:
        row64 = n64
    if VARLEN:
        bos = tl.load(cu_ptr + n).to(tl.int32)
        eos = tl.load(cu_ptr + n + 1).to(tl.int32)
        xb = x_ptr
        yb = y_ptr
    else:
        bos = n * 0
        eos = bos + T
        xb = x_ptr + n64 * stride_xb
        yb = y_ptr + n64 * stride_yb
    t0 = bos + ci * CHUNK
    if (t0 >= eos) & (ci > 0):
        return
    t1 = tl.minimum(eos, t0 + CHUNK)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    KM1: tl.constexpr = K - 1
    zero = tl.zeros((BLOCK_C,), tl.float32)
    # weight[c, j] multiplies xx[t + j]: w3 the current input, w2 the one before, ...
    wp = w_ptr + cols * stride_wc
    w3 = tl.load(wp + (K - 1) * stride_wk, mask=cmask, other=0.0).to(tl.float32)
    w2 = zero
    w1 = zero
    w0 = zero
    s2 = zero
    s1 = zero
    s0 = zero
    if K >= 2:
        w2 = tl.load(wp + (K - 2) * stride_wk, mask=cmask, other=0.0).to(tl.float32)
        s2 = _prev_input(xb, st_ptr, row64, t0 - 1, bos, cols, cmask, stride_xt, stride_sn,
                         stride_sc, stride_sk, KM1, HAS_STATE)
    if K >= 3:
        w1 = tl.load(wp + (K - 3) * stride_wk, mask=cmask, other=0.0).to(tl.float32)
        s1 = _prev_input(xb, st_ptr, row64, t0 - 2, bos, cols, cmask, stride_xt, stride_sn,
                         stride_sc, stride_sk, KM1, HAS_STATE)
    if K >= 4:
        w0 = tl.load(wp + (K - 4) * stride_wk, mask=cmask, other=0.0).to(tl.float32)
        s0 = _prev_input(xb, st_ptr, row64, t0 - 3, bos, cols, cmask, stride_xt, stride_sn,
                         stride_sc, stride_sk, KM1, HAS_STATE)
    bias = zero
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    for t in range(t0, t1):
        xt = tl.load(xb + t * stride_xt + cols, mask=cmask, other=0.0).to(tl.float32)
        y = bias + w3 * xt + w2 * s2 + w1 * s1 + w0 * s0
        if SILU:
            y = y / (1.0 + tl.exp(-y))
        tl.store(yb + t * stride_yt + cols, y.to(y_ptr.dtype.element_ty), mask=cmask)
        s0 = s1
        s1 = s2
        s2 = xt
    # The new state. Into a separate output: written by the chunk holding the last token
    # (chunk 0 of an empty sequence). In place (the pool row, with the pool's strides): by chunk
    # 0, the only program that reads the old state, after it has; when the sequence runs past
    # this chunk (so past K-1 >= 3 tokens) its last K-1 inputs are loaded from x.
    if HAS_SLOTS:
        if ci == 0:
            if t1 < eos:
                s2 = tl.load(xb + (eos - 1) * stride_xt + cols, mask=cmask, other=0.0).to(tl.float32)
                s1 = tl.load(xb + (eos - 2) * stride_xt + cols, mask=cmask, other=0.0).to(tl.float32)
                s0 = tl.load(xb + tl.maximum(eos - 3, 0) * stride_xt + cols, mask=cmask,
                             other=0.0).to(tl.float32)
            store_conv_state(ns_ptr + row64 * stride_sn + cols * stride_sc, stride_sk, s0, s1, s2,
                             cmask, K)
    elif t1 >= eos:
        store_conv_state(ns_ptr + n64 * C * KM1 + cols * KM1, 1, s0, s1, s2, cmask, K)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  state: torch.Tensor | None = None, *, activation: str | None = "silu",
                  cu_seqlens: torch.Tensor | None = None, state_slots: torch.Tensor | None = None,
                  block_c: int | None = None, chunk: int | None = None,
                  num_warps: int | None = None,
                  out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton causal conv1d: x [B, T, C], weight [C, K] or [C, 1, K], bias [C], state
    [N, C, K-1], cu_seqlens [N+1] (B = 1) -> (y [B, T, C], new_state [N, C, K-1]) in x.dtype.
    With state_slots [N]: state is a pool [S, C, K-1] updated in place and returned.

    Shapes are checked, cu_seqlens and slot contents trusted (no host sync). Tuning (None =
    heuristic): block_c channels per program, chunk tokens per program, num_warps. ``out``
    [B, T, C] (x.dtype, unit channel stride): y is written there, which may be x itself with
    state_slots (each sequence's tokens in one program, which reads an input before it writes
    that token's output; used by gemv_norm to convolve a projection's output in place).
    """
    B, T, C = x.shape
    w = weight[:, 0] if weight.dim() == 3 else weight
    K = w.shape[1]
    if w.shape[0] != C or (bias is not None and tuple(bias.shape) != (C,)):
        raise ValueError(f"causal_conv1d: weight {tuple(weight.shape)} / bias do not match C={C}")
    varlen = cu_seqlens is not None
    if varlen and (B != 1 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2):
        raise ValueError("causal_conv1d: cu_seqlens [N+1] needs B = 1")
    n = cu_seqlens.numel() - 1 if varlen else B
    pool = state_slots is not None
    if pool and (state is None or state.dim() != 3 or tuple(state.shape[1:]) != (C, K - 1)
                 or tuple(state_slots.shape) != (n,)):
        raise ValueError(f"causal_conv1d: state_slots [{n}] needs a state pool [S, {C}, {K - 1}], got "
                         f"{list(state_slots.shape)} and {None if state is None else list(state.shape)}")
    if not pool and state is not None and tuple(state.shape) != (n, C, K - 1):
        raise ValueError(f"causal_conv1d: state must be {[n, C, K - 1]}, got {list(state.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"causal_conv1d: activation must be 'silu' or None, got {activation!r}")
    xc = x if x.stride(2) == 1 else x.contiguous()
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.stride(2) != 1
                            or (out.data_ptr() == x.data_ptr() and (state_slots is None or xc is not x))):
        raise ValueError(f"causal_conv1d: out must be [B, T, C] in x.dtype with unit channel stride, "
                         f"and may alias x only with state_slots, got {out.dtype} {list(out.shape)}")
    y = out if out is not None else torch.empty((B, T, C), dtype=x.dtype, device=x.device)
    new_state = state if pool else torch.empty((n, C, K - 1), dtype=x.dtype, device=x.device)
    if n == 0 or C == 0:
        return y, new_state
    bc = block_c or min(256 if x.device.type == "cuda" else 512, triton.next_power_of_2(C))
    # token chunks: enough programs for a long prefill, one chunk for decode and verification
    # (a few tokens a sequence) and for y written over x (a chunk's inputs before it would be
    # another program's outputs)
    ck = chunk or max(16, triton.next_power_of_2(triton.cdiv(max(T, 1), 64)))
    if (pool and T <= 4 * n) or out is not None and out.data_ptr() == x.data_ptr():
        ck = max(ck, T)
    if pool:
        ck = max(ck, K - 1)  # chunk 0 then holds every token that reads the old state
    n_chunks = max(1, triton.cdiv(T, ck))
    st = state if state is not None else y
    cu = cu_seqlens if varlen else y
    slots = state_slots if pool else y
    _conv_kernel[(n, triton.cdiv(C, bc), n_chunks)](
        xc, w, bias if bias is not None else y, st, cu, y, new_state, slots,
        T, C, ck, xc.stride(0), xc.stride(1), w.stride(0), w.stride(1),
        st.stride(0) if state is not None else 0, st.stride(1) if state is not None else 0,
        st.stride(2) if state is not None else 0, y.stride(0), y.stride(1),
        K=K, BLOCK_C=bc, VARLEN=varlen, HAS_STATE=state is not None, HAS_BIAS=bias is not None,
        SILU=activation == "silu", HAS_SLOTS=pool, num_warps=num_warps or (4 if bc >= 512 else 2),
        PDL=pdl_ok(x.device), **launch_kwargs(x.device))
    return y, new_state


def causal_conv1d_supported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            state: torch.Tensor | None = None, *, cu_seqlens=None, state_slots=None,
                            **_: object) -> str | None:
    """Per-call check (shapes and dtypes only, no sync)."""
    floats = (torch.float32, torch.bfloat16, torch.float16)
    if x.dim() != 3 or x.dtype not in floats:
        return f"expects float x [B, T, C], got {x.dtype} {list(x.shape)}"
    if weight.dim() not in (2, 3) or weight.dtype not in floats:
        return "expects weight [C, K] or [C, 1, K] in a float dtype"
    k = weight.shape[-1]
    if not 1 <= k <= 4:
        return f"kernel width K={k} not in 1..4"
    if state is not None and state.dtype not in floats:
        return f"state dtype {state.dtype} not supported"
    if bias is not None and (bias.dtype not in floats or bias.stride(-1) != 1):
        return "bias must be a contiguous float tensor"
    if cu_seqlens is not None and cu_seqlens.dtype not in (torch.int32, torch.int64):
        return "cu_seqlens must be int32 or int64"
    if state_slots is not None and (state is None or state_slots.dtype not in (torch.int32, torch.int64)
                                    or state_slots.device != x.device):
        return "state_slots must be int32/int64 on x's device, over a state pool"
    if x.shape[1] >= 2 ** 31 // max(1, x.shape[2]) or cu_seqlens is not None and cu_seqlens.numel() > 65536:
        return "too large for the launch grid"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for name, dt, varlen, state in (("qwen35_decode", "bf16", False, True),
                                    ("qwen35_varlen", "bf16", True, True),
                                    ("prefill_fp32", "fp32", False, False)):
        sig = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "bias_ptr": f"*{dt}", "st_ptr": f"*{dt}",
               "cu_ptr": "*i32", "y_ptr": f"*{dt}", "ns_ptr": f"*{dt}", "slot_ptr": "*i64"}
        for arg in ("T", "C", "CHUNK", "stride_xb", "stride_xt", "stride_wc", "stride_wk",
                    "stride_sn", "stride_sc", "stride_sk", "stride_yb", "stride_yt"):
            sig[arg] = "i32"
        for arg in ("K", "BLOCK_C", "VARLEN", "HAS_STATE", "HAS_BIAS", "SILU", "HAS_SLOTS", "PDL"):
            sig[arg] = "constexpr"
        specs.append(AotSpec(f"causal_conv1d[{name}]", _conv_kernel, sig,
                             {"K": 4, "BLOCK_C": 256, "VARLEN": varlen, "HAS_STATE": state,
                              "HAS_BIAS": False, "SILU": True, "HAS_SLOTS": name == "qwen35_varlen",
                              "PDL": False},
                             {"num_warps": 2}))
    return specs


AOT_SPECS = _aot_specs()
