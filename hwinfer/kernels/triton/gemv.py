"""Triton matrix-vector products for decode-sized ``linear`` (contract:
:func:`hwinfer.ops.dense.linear`).

At batch 1-4 a projection is a weight-bandwidth-bound GEMV of a few MB, and in a decode step
~100 of them run back to back: what a GEMV costs is mostly the time its programs wait for the
first weight bytes. Two kernels:

* ``_gemv_rows_kernel`` (:func:`gemv_rows`): one program per BLOCK_N whole rows of W, held in
  registers (a ~16 KB tile); no split K, no second kernel. Launched with programmatic dependent
  launch (:mod:`.pdl`) it issues its weight loads before waiting on the previous kernel, so
  they stream while that kernel finishes. On the H200 the 97 products of a Qwen3.5-0.8B step
  took 500 us this way, 570 us without PDL, 736 us with the split-K GEMV / cuBLAS mix below and
  887 us with cuBLAS alone (``scripts/bench_decode_chain.py``).
* ``_gemv_kernel`` (:func:`gemv`): grid (N blocks, K splits); each program streams a
  [BLOCK_N, K/split] slab through a ``tl.dot`` against x^T padded to 16 columns and stores
  partial sums that a second tiny kernel adds.

:func:`linear`: on sm_90+ the whole-row GEMV with PDL. Elsewhere on a GPU (AMD, older NVIDIA)
it picks, once per (N, K, M, dtype, device), the fastest of the two kernels' tilings and
F.linear, timed on weight copies that do not fit in L2 (decode reads each weight once per step
from HBM) and replayed from a CUDA graph (GPU time, not launch overhead); never while a CUDA
graph is being captured (F.linear is used then), so the engine's uncaptured warm-up makes it.
Under the interpreter the split-K kernel is always used (that is how CI checks it).
``HWINFER_GEMV=never`` / ``always`` (read when this module is imported) forces F.linear / the
split-K kernel (benchmarks, bisection).
"""
from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET, num_sms
from hwinfer.kernels.triton.pdl import pdl_enter, pdl_ok

MAX_ROWS = 4          # decode batches up to this many rows; larger M is a GEMM (vendor BLAS)
# Programs an SM of the whole-row GEMV when it walks its row tiles in one wave (0: one program
# a tile). On the H200 the 97 products of a Qwen3.5-0.8B step took 478 us at 3 an SM against
# 505 us one a tile (scripts/bench_decode_chain.py --persistent, 38f3966), but the model's step
# was 7 us slower at 3 and 33 us at 2 (bench_ablation.py --variant, 939cf8a), so off.
PERSIST_PER_SM = 0
_CONFIGS = ((32, 256), (64, 128), (16, 512), (64, 256))   # (BLOCK_N, BLOCK_K) candidates
_CHOICE: dict[tuple, tuple | None] = {}   # None: F.linear wins
_SEEN: dict[int, tuple] = {}   # id(weight) -> (weak reference, (data_ptr, version)) at its last call
_MODE = os.environ.get("HWINFER_GEMV", "auto")  # read once: linear runs on every projection


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 K_SPLIT, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTIAL: tl.constexpr,
                 HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, 16)
    nmask = rn < N
    mmask = rm < M
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    for k in range(k_lo, k_hi, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        kmask = rk < k_hi
        w = tl.load(w_rows + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + rk[:, None],
                     mask=mmask[None, :] & kmask[:, None], other=0.0)
        if UPCAST:  # the interpreter multiplies 16-bit floats wrongly: fp32 there
            acc += tl.dot(w.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(w, xt.to(w.dtype))
    if not PARTIAL:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[:, None]
        y = acc.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty)   # x.dtype's rounding
        tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], y, mask=nmask[:, None] & mmask[None, :])
    else:
        # partial sums ws[pid_k, m, n] (fp32), added by _gemv_reduce_kernel
        tl.store(ws_ptr + (pid_k * M + rm[None, :]) * N + rn[:, None], acc,
                 mask=nmask[:, None] & mmask[None, :])


@triton.jit
def _gemv_reduce_kernel(ws_ptr, b_ptr, y_ptr, x_ptr, M, N, stride_ym, SPLIT,
                        BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    # x_ptr is read for its dtype only: y is rounded to x.dtype before it is stored in its own.
    m = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rn < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(ws_ptr + (s * M + m) * N + rn, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _rows_dot_store(w, x_ptr, b_ptr, y_ptr, rn, rk, M, N, K, stride_xm, stride_ym,
                    MAX_M: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y[m, rn] = W[rn, :] . x[m, :] (+ bias) for the M <= MAX_M rows of x, W's rows in ``w``."""
    nmask = rn < N
    kmask = rk < K
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    for m in tl.static_range(MAX_M):
        if m < M:
            x = tl.load(x_ptr + m * stride_xm + rk, mask=kmask, other=0.0).to(tl.float32)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            if HAS_BIAS:
                y += bias
            y = y.to(x_ptr.dtype.element_ty).to(y_ptr.dtype.element_ty)   # x.dtype's rounding
            tl.store(y_ptr + m * stride_ym + rn, y, mask=nmask)


@triton.jit
def _gemv_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, TILES,
                      BLOCK_N: tl.constexpr, KP: tl.constexpr, MAX_M: tl.constexpr,
                      HAS_BIAS: tl.constexpr, PDL: tl.constexpr, PERSIST: tl.constexpr):
    # Each program holds BLOCK_N whole rows of W ([BLOCK_N, KP] in registers, KP = K rounded up
    # to a power of two). With PDL the loads of W (never written by the step) are issued before
    # waiting on the previous kernel, so they stream while it finishes; x is read after.
    # PERSIST: fewer programs than the TILES row tiles (one wave); program p takes tiles p,
    # p + P, ... and issues the next tile's loads before reducing the current one.
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, KP)
    kmask = rk < K
    w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :],
                mask=(rn < N)[:, None] & kmask[None, :], other=0.0)
    pdl_enter(PDL)
    if PERSIST:
        progs = tl.num_programs(0)
        for t in range(pid, TILES, progs):
            rn = t * BLOCK_N + tl.arange(0, BLOCK_N)
            nxt = rn + progs * BLOCK_N
            w_next = tl.load(w_ptr + nxt.to(tl.int64)[:, None] * stride_wn + rk[None, :],
                             mask=(nxt < N)[:, None] & kmask[None, :], other=0.0)
            _rows_dot_store(w, x_ptr, b_ptr, y_ptr, rn, rk, M, N, K, stride_xm, stride_ym,
                            MAX_M, HAS_BIAS)
            w = w_next
    else:
        _rows_dot_store(w, x_ptr, b_ptr, y_ptr, rn, rk, M, N, K, stride_xm, stride_ym,
                        MAX_M, HAS_BIAS)


def _rows_and_output(name: str, x: torch.Tensor, weight: torch.Tensor, max_rows: int,
                     out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] as rows [M, K] with unit column stride, and the output [M, N] to fill
    (``out_dtype``, default x.dtype), after checking M <= max_rows and weight [N, K] with unit
    column stride."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > max_rows or weight.dim() != 2 or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"{name}: x {tuple(x.shape)} (<= {max_rows} rows) and weight [N, K] with "
                         f"unit column stride expected, got weight {tuple(weight.shape)} "
                         f"stride {weight.stride()}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, torch.empty((x2.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype,
                           device=x.device)


def rows_block_n(n: int, k: int, tile_bytes: int = 16 << 10) -> int:
    """Rows per program of the whole-row GEMV: a [BLOCK_N, KP] bf16 tile of about ``tile_bytes``.
    16 KB at 8 warps was the fastest of 16 / 32 / 64 KB x 4 / 8 warps on the H200, with and
    without PDL (scripts/bench_decode_chain.py)."""
    kp = triton.next_power_of_2(max(k, 16))
    return max(1, min(64, tile_bytes // (2 * kp), triton.next_power_of_2(n)))


def gemv_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
              block_n: int | None = None, num_warps: int = 8, pdl: bool = False,
              per_sm: int | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] (at most 4 rows), weight [N, K] with unit column stride, bias [N] -> [..., N]
    rounded to x.dtype, stored in ``out_dtype`` (default x.dtype), one program per ``block_n``
    whole rows of W (no split K, no second kernel).
    ``pdl``: a programmatic dependent launch (:mod:`.pdl`; ignored where not available), W's
    loads issued before waiting on the previous kernel, which therefore must not write W.
    ``per_sm`` (default ``PERSIST_PER_SM``): when > 0, at most that many programs an SM walk the
    row tiles (one wave, the next tile's loads in flight), else one program a tile."""
    x2, y = _rows_and_output("gemv_rows", x, weight, MAX_ROWS, out_dtype)
    (m, k), n = x2.shape, weight.shape[0]
    if m == 0 or n == 0:
        return y.reshape(*x.shape[:-1], n)
    block_n = block_n or rows_block_n(n, k)
    pdl = pdl and pdl_ok(x.device)
    extra = {"launch_pdl": True} if pdl else {}
    tiles = triton.cdiv(n, block_n)
    per_sm = PERSIST_PER_SM if per_sm is None else per_sm
    grid = min(tiles, per_sm * num_sms(x.device, 4)) if per_sm > 0 else tiles
    _gemv_rows_kernel[(grid,)](
        x2, weight, bias if bias is not None else y, y, m, n, k, x2.stride(0), weight.stride(0),
        y.stride(0), tiles, BLOCK_N=block_n, KP=triton.next_power_of_2(max(k, 16)),
        MAX_M=MAX_ROWS, HAS_BIAS=bias is not None, PDL=pdl, PERSIST=grid < tiles,
        num_warps=num_warps, **extra)
    return y.reshape(*x.shape[:-1], n)


def _split_for(n: int, k: int, block_n: int, block_k: int, device: torch.device) -> int:
    """K splits so that about two programs per SM run (no split once rows alone do that)."""
    n_blocks = triton.cdiv(n, block_n)
    want = max(1, (2 * num_sms(device, 4)) // n_blocks)
    return max(1, min(want, triton.cdiv(k, block_k), 16))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         block_n: int = 32, block_k: int = 256, split: int | None = None, num_stages: int = 3,
         num_warps: int = 4, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] (at most 16 rows, bf16/fp16/fp32), weight [N, K] with unit column stride, bias
    [N] -> [..., N] rounded to x.dtype, stored in ``out_dtype`` (default x.dtype)."""
    x2, y = _rows_and_output("gemv", x, weight, 16, out_dtype)
    (m, k), n = x2.shape, weight.shape[0]
    if m == 0 or n == 0:
        return y.reshape(*x.shape[:-1], n)
    if k == 0:
        y.zero_().add_(bias.to(x.dtype) if bias is not None else 0)
        return y.reshape(*x.shape[:-1], n)
    split = split or _split_for(n, k, block_n, block_k, x.device)
    # Whole BLOCK_K steps per split, so no two splits read the same columns.
    k_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_split)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else y
    b = bias if bias is not None else y
    _gemv_kernel[(triton.cdiv(n, block_n), split)](
        x2, weight, b, y, ws, m, n, k, x2.stride(0), weight.stride(0), y.stride(0), k_split,
        BLOCK_N=block_n, BLOCK_K=block_k, PARTIAL=split > 1, HAS_BIAS=bias is not None,
        UPCAST=INTERPRET, num_warps=num_warps, num_stages=num_stages)
    if split > 1:
        _gemv_reduce_kernel[(triton.cdiv(n, 1024), m)](
            ws, b, y, x2, m, n, y.stride(0), split, BLOCK=1024, HAS_BIAS=bias is not None,
            num_warps=4)
    return y.reshape(*x.shape[:-1], n)


def _time(fn, repeats: int = 20) -> float:
    """Milliseconds per call of ``fn()`` (which cycles its own inputs) as the GPU runs it inside a
    CUDA graph: ``repeats`` calls captured once and replayed. Timing eager calls would measure
    the host's launch overhead (tens of microseconds), not these few-microsecond kernels; decode
    replays them from a graph, back to back."""
    fn()  # compile / plan outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(repeats):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    return sorted(times)[len(times) // 2]


def cold_copies(weight: torch.Tensor, l2_bytes: int = 64 << 20) -> list[torch.Tensor]:
    """``weight`` and enough clones of it to overflow L2 (decode reads a weight from HBM)."""
    nbytes = max(1, weight.numel() * weight.element_size())
    return [weight] + [weight.clone() for _ in range(min(16, l2_bytes // nbytes))]


def time_on(copies: list[torch.Tensor], call, repeats: int = 20) -> float:
    """Graph-replayed milliseconds per ``call(w)``, each call on the next of ``copies``."""
    turn = [0]

    def run():
        turn[0] = (turn[0] + 1) % len(copies)
        return call(copies[turn[0]])
    return _time(run, repeats)


def _choose(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The fastest GEMV on this device for this shape (``("rows", block_n)`` or ``("split",
    block_n, block_k, split)``), or None when F.linear is."""
    n, k = weight.shape
    copies = cold_copies(weight)
    best, best_ms = None, time_on(copies, lambda w: F.linear(x2, w, bias))
    block_n = rows_block_n(n, k)
    candidates = [(("rows", block_n), lambda w: gemv_rows(x2, w, bias, block_n=block_n))]
    for bn, bk in _CONFIGS:
        s = _split_for(n, k, bn, bk, x2.device)
        candidates.append((("split", bn, bk, s), lambda w, bn=bn, bk=bk, s=s: gemv(
            x2, w, bias, block_n=bn, block_k=bk, split=s)))
    for choice, call in candidates:
        ms = time_on(copies, call)
        if ms < 0.97 * best_ms:  # a clear win only: F.linear is the default
            best, best_ms = choice, ms
    return best


def settled(weight: torch.Tensor) -> bool:
    """Whether ``weight`` (the same tensor object, storage and version as at its previous call)
    can have been written by no kernel since then, so by none right before this call: the
    condition for the GEMV to load it before waiting on the previous kernel (PDL). A weight's
    first call (just loaded, just stacked by MergedProjection, just cast) is never settled."""
    try:
        version = weight._version
    except RuntimeError:  # inference-mode tensors keep no version counter
        version = -1
    key = (weight.data_ptr(), version)
    seen = _SEEN.get(id(weight))
    if len(_SEEN) > 65536:  # ids of temporaries (weights cast per call) accumulate
        _SEEN.clear()
    # Keyed by id with a weak reference to tell a later object with a recycled id apart
    # (tensors compare elementwise, so they cannot be dict keys by value).
    _SEEN[id(weight)] = (weakref.ref(weight), key)
    return seen is not None and seen[0]() is weight and seen[1] == key


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``linear`` for any shape: decode-sized bf16/fp16 calls through the whole-row GEMV with PDL
    on sm_90+, through the measured choice of GEMV or F.linear elsewhere on a GPU; everything
    else F.linear (see the module docstring). ``out_dtype``: the GEMVs store y (rounded to
    x.dtype) in it directly (the lm_head's fp32 logits: no cast kernel); F.linear's y is cast."""
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    out_dtype = out_dtype or x.dtype
    k = x.shape[-1]
    m = x.numel() // max(1, k)
    mode = _MODE
    if (mode == "never" or m > MAX_ROWS or m == 0 or x.dtype not in (torch.bfloat16, torch.float16)
            or weight.stride(1) != 1 or weight.dim() != 2):
        return F.linear(x, weight, bias).to(out_dtype)
    if INTERPRET or mode == "always" or x.device.type != "cuda":
        return gemv(x, weight, bias, out_dtype=out_dtype)
    if pdl_ok(x.device):
        # On the H200 the whole-row GEMV with PDL beat cuBLAS and the split-K GEMV on every
        # projection of a Qwen3.5-0.8B step (the chain: 500 us against 887 / 736).
        return gemv_rows(x, weight, bias, pdl=settled(weight), out_dtype=out_dtype)
    key = (weight.shape[0], k, m, x.dtype, x.device, bias is not None)
    if key not in _CHOICE:
        if torch.cuda.is_current_stream_capturing():
            return F.linear(x, weight, bias).to(out_dtype)  # no timing inside a capture
        _CHOICE[key] = _choose(x.reshape(-1, k), weight, bias)
    choice = _CHOICE[key]
    if choice is None:
        return F.linear(x, weight, bias).to(out_dtype)
    if choice[0] == "rows":
        return gemv_rows(x, weight, bias, block_n=choice[1], out_dtype=out_dtype)
    _, block_n, block_k, split = choice
    return gemv(x, weight, bias, block_n=block_n, block_k=block_k, split=split, out_dtype=out_dtype)


def chosen() -> dict[tuple, tuple | None]:
    """The choices made so far (shape key -> tiling, or None for F.linear), for benchmarks."""
    return dict(_CHOICE)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("bf16", "fp16"):
        sig = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "y_ptr": f"*{dtype}",
               "ws_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
               "stride_wn": "i32", "stride_ym": "i32", "K_SPLIT": "i32", "BLOCK_N": "constexpr",
               "BLOCK_K": "constexpr", "PARTIAL": "constexpr", "HAS_BIAS": "constexpr",
               "UPCAST": "constexpr"}
        for (bn, bk), partial in (((32, 256), False), ((64, 128), True)):
            specs.append(AotSpec(f"gemv[{dtype},{bn}x{bk},{'split' if partial else 'whole'}]", _gemv_kernel,
                                 sig, {"BLOCK_N": bn, "BLOCK_K": bk, "PARTIAL": partial, "HAS_BIAS": False,
                                       "UPCAST": False},
                                 {"num_warps": 4, "num_stages": 3}))
        rows = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "y_ptr": f"*{dtype}",
                "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32",
                "stride_ym": "i32", "TILES": "i32", "BLOCK_N": "constexpr", "KP": "constexpr",
                "MAX_M": "constexpr", "HAS_BIAS": "constexpr", "PDL": "constexpr",
                "PERSIST": "constexpr"}
        for k, pdl, persist in ((1024, False, False), (1024, True, False), (4096, True, False),
                                (1024, True, True)):   # PDL: sm_90+ only
            name = f"gemv_rows[{dtype},K{k}{',pdl' if pdl else ''}{',persist' if persist else ''}]"
            specs.append(AotSpec(name, _gemv_rows_kernel, rows,
                                 {"BLOCK_N": rows_block_n(1 << 20, k), "KP": k, "MAX_M": MAX_ROWS,
                                  "HAS_BIAS": False, "PDL": pdl, "PERSIST": persist},
                                 {"num_warps": 8}, ("sm_90", "sm_100") if pdl else None))
        # The lm_head's fp32 logits (out_dtype): the whole-row GEMV as the decode graphs run it.
        specs.append(AotSpec(f"gemv_rows[{dtype},K1024,pdl,fp32 out]", _gemv_rows_kernel,
                             {**rows, "y_ptr": "*fp32"},
                             {"BLOCK_N": rows_block_n(1 << 20, 1024), "KP": 1024, "MAX_M": MAX_ROWS,
                              "HAS_BIAS": False, "PDL": True, "PERSIST": False},
                             {"num_warps": 8}, ("sm_90", "sm_100")))
        for out in (dtype, "fp32"):
            sig = {"ws_ptr": "*fp32", "b_ptr": f"*{dtype}", "y_ptr": f"*{out}", "x_ptr": f"*{dtype}",
                   "M": "i32", "N": "i32", "stride_ym": "i32", "SPLIT": "i32", "BLOCK": "constexpr",
                   "HAS_BIAS": "constexpr"}
            specs.append(AotSpec(f"gemv_reduce[{dtype},{out} out]", _gemv_reduce_kernel, sig,
                                 {"BLOCK": 1024, "HAS_BIAS": False}, {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
