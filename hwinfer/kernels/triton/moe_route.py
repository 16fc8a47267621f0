"""Triton MoE routers (contracts: :func:`hwinfer.ops.moe.route_topk`,
:func:`hwinfer.ops.moe.route_hash`).

One program per token holds the token's whole row of E logits (E <= 1024; E is up to 384 in the
models), laid out 2-D as [groups, experts per group] so grouped selection is two reductions.
Score, noaux bias, group choice, top-k, renormalisation and scaling are fused; the k winners are
taken one by one (k <= 32 unrolled argmax steps; on equal keys the lower expert id wins, which
the order-insensitive routing compare accepts). Everything is fp32 whatever the logits dtype.
No host sync: safe in decode CUDA graphs.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET

_SCORING = {"softmax": 0, "sigmoid": 1, "sqrtsoftplus": 2}


@triton.jit
def _rowmax(v):
    """[BT, A, B] -> [BT, 1, 1] maximum per token."""
    return tl.max(tl.max(v, axis=2), axis=1)[:, None, None]


@triton.jit
def _score(z, row_mask, SCORING: tl.constexpr):
    """fp32 scores of logits z [BT, A, B] (masked entries -inf in, 0 out)."""
    if SCORING == 0:
        p = tl.where(row_mask, tl.exp(z - _rowmax(z)), 0.0)
        s = p / tl.sum(tl.sum(p, axis=2), axis=1)[:, None, None]
    elif SCORING == 1:
        s = 1.0 / (1.0 + tl.exp(-z))
    else:
        # softplus = z above 20 (torch's threshold), else log1p(e^z) with the accurate
        # log(w) * u / (w - 1) form (plain log(1 + u) loses digits for small u).
        u = tl.exp(tl.minimum(z, 20.0))
        w = 1.0 + u
        lp = tl.where(w == 1.0, u, tl.log(w) * u / tl.where(w == 1.0, 1.0, w - 1.0))
        s = tl.sqrt(tl.where(z > 20.0, z, lp))
    return tl.where(row_mask, s, 0.0)


@triton.jit
def _finish(wv, iv, k_mask, w_out, i_out, escale_ptr, scaling, RENORM: tl.constexpr,
            HAS_ESCALE: tl.constexpr):
    """wv / iv [BT, K_P]: renormalise, scale, per-expert scale, store."""
    if RENORM:
        wv = wv / (tl.sum(wv, axis=1)[:, None] + 1e-20)
    wv = wv * scaling
    if HAS_ESCALE:
        wv = wv * tl.load(escale_ptr + iv, mask=k_mask, other=0.0).to(tl.float32)
    tl.store(w_out, wv, mask=k_mask)
    tl.store(i_out, iv.to(tl.int32), mask=k_mask)


@triton.jit
def _route_topk_kernel(logits_ptr, bias_ptr, escale_ptr, w_ptr, ids_ptr, T, stride_l, scaling,
                       SCORING: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ESCALE: tl.constexpr,
                       RENORM: tl.constexpr, NG: tl.constexpr, GS: tl.constexpr,
                       TOPK_GROUP: tl.constexpr, K: tl.constexpr, NG_P: tl.constexpr,
                       GS_P: tl.constexpr, K_P: tl.constexpr, BT: tl.constexpr):
    """weights / ids [T, K] of BT tokens; a token's logits row is a [NG, GS] tile."""
    tt = tl.program_id(0) * BT + tl.arange(0, BT)
    gi = tl.arange(0, NG_P)[None, :]
    g = gi[:, :, None]
    j = tl.arange(0, GS_P)[None, None, :]
    idx = g * GS + j
    e_mask = (g < NG) & (j < GS)
    row_mask = e_mask & (tt < T)[:, None, None]
    # rows past T read zeros (no -inf - -inf NaNs); padding experts are -inf
    z = tl.load(logits_ptr + tt.to(tl.int64)[:, None, None] * stride_l + idx, mask=row_mask,
                other=0.0).to(tl.float32)
    z = tl.where(e_mask, z, -float("inf"))
    s = _score(z, e_mask, SCORING)
    c = s
    if HAS_BIAS:
        c = c + tl.load(bias_ptr + idx, mask=e_mask, other=0.0).to(tl.float32)
    c = tl.where(e_mask, c, -float("inf"))
    if NG > 1:
        # group score = sum of its two largest keys; keep the TOPK_GROUP best groups
        m1 = tl.max(c, axis=2)
        first = tl.min(tl.where(c == m1[:, :, None], j, GS_P), axis=2)
        m2 = tl.max(tl.where(j == first[:, :, None], -float("inf"), c), axis=2)
        gscore = tl.where(gi < NG, m1 + m2, -float("inf"))
        keep = gscore != gscore  # all False, [BT, NG_P]
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(gscore, axis=1)[:, None]
            bi = tl.min(tl.where(gscore == best, gi, NG_P), axis=1)[:, None]
            keep = keep | (gi == bi)
            gscore = tl.where(gi == bi, -float("inf"), gscore)
        c = tl.where(keep[:, :, None], c, -float("inf"))
    kr = tl.arange(0, K_P)[None, :]
    wv = tl.zeros((BT, K_P), dtype=tl.float32)
    iv = tl.zeros((BT, K_P), dtype=tl.int32)
    for kk in tl.static_range(K):
        hit = (c == _rowmax(c)) & e_mask
        bidx = tl.min(tl.min(tl.where(hit, idx, NG * GS), axis=2), axis=1)
        sel = idx == bidx[:, None, None]
        sv = tl.sum(tl.sum(tl.where(sel, s, 0.0), axis=2), axis=1)
        wv = tl.where(kr == kk, sv[:, None], wv)
        iv = tl.where(kr == kk, bidx[:, None], iv)
        c = tl.where(sel, -float("inf"), c)
    out = tt.to(tl.int64)[:, None] * K + kr
    _finish(wv, iv, (kr < K) & (tt < T)[:, None], w_ptr + out, ids_ptr + out, escale_ptr, scaling,
            RENORM, HAS_ESCALE)


@triton.jit
def _route_hash_kernel(logits_ptr, tok_ptr, table_ptr, w_ptr, ids_ptr, E, K, stride_l, stride_tab,
                       scaling, SCORING: tl.constexpr, RENORM: tl.constexpr,
                       E_P: tl.constexpr, K_P: tl.constexpr):
    """ids[t] = tid2eid[token_ids[t]]; weights = score(logits[t])[ids], renormalised, scaled."""
    t = tl.program_id(0)
    kr = tl.arange(0, K_P)[None, :]
    k_mask = kr < K
    tok = tl.load(tok_ptr + t).to(tl.int64)
    iv = tl.load(table_ptr + tok * stride_tab + kr, mask=k_mask, other=0).to(tl.int32)
    row = logits_ptr + t.to(tl.int64) * stride_l
    zk = tl.load(row + iv, mask=k_mask, other=0.0).to(tl.float32)
    if SCORING == 0:  # softmax needs the whole row's max and sum
        cols = tl.arange(0, E_P)[None, :]
        z = tl.load(row + cols, mask=cols < E, other=-float("inf")).to(tl.float32)
        m = tl.max(z, axis=1)[:, None]
        total = tl.sum(tl.where(cols < E, tl.exp(z - m), 0.0), axis=1)[:, None]
        wv = tl.where(k_mask, tl.exp(zk - m) / total, 0.0)
    else:
        wv = tl.reshape(_score(zk[:, :, None], k_mask[:, :, None], SCORING), (1, K_P))
    out = t.to(tl.int64) * K + kr
    _finish(wv, iv, k_mask, w_ptr + out, ids_ptr + out, w_ptr, scaling, RENORM, False)


def route_topk(logits: torch.Tensor, *, top_k: int, scoring: str = "softmax",
               bias: torch.Tensor | None = None, renormalize: bool = True, scaling: float = 1.0,
               n_group: int = 1, topk_group: int = 1,
               expert_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, top_k] fp32, ids [T, top_k] int32)."""
    t, e = logits.shape
    w = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t == 0:
        return w, ids
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    gs = e // n_group
    # One token per program on a GPU (decode: T is tiny); the interpreter pays per program, so
    # it takes up to 32 tokens at once.
    bt = min(32, triton.next_power_of_2(t)) if INTERPRET else 1
    _route_topk_kernel[(triton.cdiv(t, bt),)](
        logits, bias if bias is not None else logits, expert_scale if expert_scale is not None
        else logits, w, ids, t, logits.stride(0), float(scaling), SCORING=_SCORING[scoring],
        HAS_BIAS=bias is not None, HAS_ESCALE=expert_scale is not None, RENORM=bool(renormalize),
        NG=n_group, GS=gs, TOPK_GROUP=topk_group, K=top_k, NG_P=triton.next_power_of_2(n_group),
        GS_P=triton.next_power_of_2(gs), K_P=max(2, triton.next_power_of_2(top_k)), BT=bt,
        num_warps=4 if e <= 512 else 8)
    return w, ids


def route_hash(logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor, *,
               scoring: str = "sqrtsoftplus", renormalize: bool = True,
               scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E], token_ids [T], tid2eid [V, k] -> (weights [T, k] fp32, ids [T, k] int32)."""
    t, e = logits.shape
    k = tid2eid.shape[1]
    w = torch.empty((t, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, k), dtype=torch.int32, device=logits.device)
    if t == 0 or k == 0:
        return w, ids
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    table = tid2eid if tid2eid.stride(-1) == 1 else tid2eid.contiguous()
    _route_hash_kernel[(t,)](
        logits, token_ids, table, w, ids, e, k, logits.stride(0), table.stride(0), float(scaling),
        SCORING=_SCORING[scoring], RENORM=bool(renormalize), E_P=triton.next_power_of_2(e),
        K_P=max(2, triton.next_power_of_2(k)), num_warps=4)
    return w, ids


def _logits_ok(logits) -> str | None:
    if logits.dim() != 2 or not logits.is_floating_point():
        return "logits must be a float [T, E] tensor"
    if logits.shape[1] > 1024:
        return f"E={logits.shape[1]} > 1024 (one program holds a row)"
    return None


def route_topk_supported(logits, top_k, scoring="softmax", bias=None, n_group=1, topk_group=1,
                         expert_scale=None, **_) -> str | None:
    """Per-call check: rows of <= 1024 experts, top_k <= 32, valid group arguments (invalid ones
    go to the reference, which raises the contract's error)."""
    why = _logits_ok(logits)
    if why:
        return why
    e = logits.shape[1]
    if scoring not in _SCORING or not 1 <= top_k <= min(32, e):
        return f"scoring {scoring!r} / top_k {top_k} unsupported"
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group or topk_group > 32:
        return "group arguments not supported"
    if n_group > 1 and (e // n_group < 2 or top_k > topk_group * (e // n_group)):
        return "group arguments not supported"
    for extra in (bias, expert_scale):
        if extra is not None and (tuple(extra.shape) != (e,) or extra.stride(0) != 1):
            return "bias / expert_scale must be contiguous [E]"
    return None


def route_hash_supported(logits, token_ids, tid2eid, scoring="sqrtsoftplus", **_) -> str | None:
    """Per-call check: shapes as the contract says, k <= 64 (table contents are trusted)."""
    why = _logits_ok(logits)
    if why:
        return why
    if token_ids.dim() != 1 or tid2eid.dim() != 2 or token_ids.shape[0] != logits.shape[0]:
        return "need token_ids [T] and tid2eid [V, k]"
    if token_ids.is_floating_point() or tid2eid.is_floating_point() or tid2eid.shape[1] > 64:
        return "integer token_ids / tid2eid with k <= 64 only"
    if scoring not in _SCORING:
        return f"scoring {scoring!r} unsupported"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    # DeepSeek-V4 (sqrtsoftplus + bias, 256 experts, top-6), Kimi/GLM (sigmoid + groups, 384 / 8).
    for name, scoring, ng, topk_group, e, k in (("dsv4", 2, 1, 1, 256, 6),
                                                ("kimi_groups", 1, 8, 4, 384, 8),
                                                ("qwen35", 0, 1, 1, 512, 10)):
        sig = {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "escale_ptr": "*fp32", "w_ptr": "*fp32",
               "ids_ptr": "*i32", "T": "i32", "stride_l": "i32", "scaling": "fp32",
               **{a: "constexpr" for a in ("SCORING", "HAS_BIAS", "HAS_ESCALE", "RENORM", "NG",
                                           "GS", "TOPK_GROUP", "K", "NG_P", "GS_P", "K_P", "BT")}}
        gs = e // ng
        cx = {"SCORING": scoring, "HAS_BIAS": scoring != 0, "HAS_ESCALE": False, "RENORM": True,
              "NG": ng, "GS": gs, "TOPK_GROUP": topk_group, "K": k,
              "NG_P": triton.next_power_of_2(ng), "GS_P": triton.next_power_of_2(gs),
              "K_P": triton.next_power_of_2(k), "BT": 1}
        specs.append(AotSpec(f"route_topk[{name}]", _route_topk_kernel, sig, cx))
    sig = {"logits_ptr": "*bf16", "tok_ptr": "*i64", "table_ptr": "*i32", "w_ptr": "*fp32",
           "ids_ptr": "*i32", "E": "i32", "K": "i32", "stride_l": "i32", "stride_tab": "i32",
           "scaling": "fp32", "SCORING": "constexpr", "RENORM": "constexpr", "E_P": "constexpr",
           "K_P": "constexpr"}
    specs.append(AotSpec("route_hash[dsv4]", _route_hash_kernel, sig,
                         {"SCORING": 2, "RENORM": True, "E_P": 256, "K_P": 8}))
    return specs


AOT_SPECS = _aot_specs()
