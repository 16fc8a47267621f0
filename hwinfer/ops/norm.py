"""RMSNorm contracts: weighted, unweighted, zero-centred and gated forms."""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randint, randn

_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2), torch.float16: Tol(2e-3, 2e-3)}
# Norm then RoPE: the reference rounds the normed x to x.dtype before rotating, a fused impl
# may not. One bf16 ulp of a normed value in [2, 4) is 2^-6, and the rotation x1 c - x2 s can
# cancel to an output far smaller than its terms, so a relative bound cannot absorb it (the
# nvidia interpreted lane once saw 1.56e-2 = 2^-6 on one element of 20,480: 0.1357 against
# 0.1475). The absolute part covers one ulp of terms below 8 (2^-5) plus the output's rounding.
_ROPE_TOL = {**_TOL, torch.bfloat16: Tol(3.5e-2, 1e-2), torch.float16: Tol(5e-3, 2e-3)}


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
             weight_offset: float = 0.0) -> torch.Tensor:
    """RMS normalisation over the last dimension.

    ``y = x / sqrt(mean(x^2) + eps) * (weight_offset + weight)``, computed in fp32 and cast back
    to ``x.dtype`` once at the end. ``weight=None`` is the unweighted form (DeepSeek-V4's
    per-head q norm and mHC input norm); ``weight_offset=1.0`` is the zero-centred form of
    Qwen3.5 and Gemma 4 (``(1 + w)``, ``w`` stored initialised to 0).

    Shapes: x [..., D] any float dtype; weight [D] (any float dtype, used in fp32).
    Returns [..., D] in x.dtype.
    """
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.float() + weight_offset)
    return y.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, *,
                 eps: float = 1e-6, weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: the step between two sub-blocks of a pre-norm decoder.

    ``s = (x + residual)`` rounded to ``x.dtype`` (the residual stream, exactly what
    ``x + residual`` gives in that dtype), then ``y = rms_norm(s, weight, eps=eps,
    weight_offset=weight_offset)`` computed from the rounded ``s`` in fp32. Fused, it reads
    both inputs once and writes y and s: one kernel instead of an add and a norm, which is
    most of what these two cost in a batch-1 decode step.

    Shapes: x, residual [..., D] of one float dtype (the sub-block's output and the residual
    stream); weight [D] or None. Returns ``(y, s)``, both [..., D] in x.dtype.

    Uses: the decoder layers of Qwen3.5 (zero-centred, ``weight_offset=1``) between attention
    and MLP and from one layer to the next.
    """
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: residual {residual.dtype} {list(residual.shape)} must match "
                         f"x {x.dtype} {list(x.shape)}")
    s = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(s, weight, eps=eps, weight_offset=weight_offset), s


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None = None, *,
                   eps: float = 1e-6, activation: str = "silu") -> torch.Tensor:
    """Gated RMSNorm, the output norm of Gated DeltaNet and KDA.

    ``y = rms_norm(x, weight, eps) * act(gate)`` with ``act`` = SiLU (Qwen3.5 GDN) or sigmoid
    (KDA / Kimi); everything in fp32, cast to ``x.dtype`` at the end. The norm runs over the last
    dimension (one head's channels).

    Shapes: x [..., D]; gate [..., D] (same shape as x); weight [D] or None.
    Returns [..., D] in x.dtype.
    """
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    g = gate.float()
    if activation == "silu":
        y = y * torch.nn.functional.silu(g)
    elif activation == "sigmoid":
        y = y * torch.sigmoid(g)
    else:
        raise ValueError(f"rms_norm_gated: activation must be 'silu' or 'sigmoid', not {activation!r}")
    return y.to(x.dtype)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor,
                  sin: torch.Tensor, *, eps: float = 1e-6, weight_offset: float = 0.0,
                  start: int = 0, interleaved: bool = False) -> torch.Tensor:
    """Per-head RMSNorm then RoPE: the q / k path of attention layers with a q/k norm.

    Defined as ``apply_rope(rms_norm(x, weight, eps=eps, weight_offset=weight_offset), cos, sin,
    start=start, interleaved=interleaved)`` (:func:`rms_norm` over the last dim, then
    :func:`hwinfer.ops.rope.apply_rope` on channels ``start .. start+R-1``, R = 2 * cos.shape[-1]).
    The reference rounds to x.dtype between the two steps; a fused impl may keep fp32 throughout
    (at most one x.dtype ulp of the normed terms apart, which the absolute tolerance covers).

    Shapes: x [T, H, D] (or [T, D], one head), any float dtype; weight [D] or None; cos, sin
    [T, R/2] fp32 (from :func:`hwinfer.ops.rope.rope_tables`). Returns x's shape and dtype.

    Uses: Qwen3.5 full-attention q/k (``q_norm``/``k_norm`` zero-centred, ``weight_offset=1``,
    D 256, rotate-half on the first 64 channels); DeepSeek-V4 q (unweighted per-head norm) and
    kv (weighted ``kv_norm``), D 512, interleaved RoPE on the last 64 (``start = 448``).
    """
    from hwinfer.ops.rope import apply_rope

    return apply_rope(rms_norm(x, weight, eps=eps, weight_offset=weight_offset), cos, sin,
                      start=start, interleaved=interleaved)


def rms_norm_rope_kv_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                           cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, rows: torch.Tensor, *, eps: float = 1e-6,
                           weight_offset: float = 0.0, start: int = 0,
                           interleaved: bool = False) -> torch.Tensor:
    """The decode prologue of an attention layer with q / k norms, as one op (one kernel instead
    of four: q's and k's norm + RoPE, the K and V cache writes).

    Exactly ``k_cache.flatten(0, 1)[rows] = rms_norm_rope(k, k_weight, cos, sin, ...)``,
    ``v_cache.flatten(0, 1)[rows] = v`` (both cast to the cache dtype; in place) and returns
    ``rms_norm_rope(q, q_weight, cos, sin, ...)`` (:func:`rms_norm_rope`, the same ``eps``,
    ``weight_offset``, ``start``, ``interleaved`` for q and k).

    Shapes: q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] (strided views with a contiguous last
    dim are fine, e.g. slices of one projection); q_weight, k_weight [D] or None; cos, sin
    [T, R/2] fp32; k_cache [blocks, block_size, Hkv, D], v_cache [blocks, block_size, Hkv, Dv]
    (the paged caches); rows [T] integer: the flattened cache row of each token. Rows named twice
    get one of the values. Returns q's result [T, Hq, D] in q.dtype.

    Uses: Qwen3.5's full-attention layers in decode (zero-centred ``q_norm`` / ``k_norm``,
    ``weight_offset=1``, rotate-half RoPE on the first 64 of 256 channels).
    """
    return compose_rms_norm_rope_kv_store(rms_norm_rope, q, k, v, q_weight, k_weight, cos, sin,
                                          k_cache, v_cache, rows, eps=eps,
                                          weight_offset=weight_offset, start=start,
                                          interleaved=interleaved)


def compose_rms_norm_rope_kv_store(norm_rope, q, k, v, q_weight, k_weight, cos, sin, k_cache,
                                   v_cache, rows, **kw) -> torch.Tensor:
    """``rms_norm_rope_kv_store`` from an implementation of ``rms_norm_rope`` (the reference's
    definition; impls reuse it for the calls they do not fuse)."""
    t = q.shape[0]
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k.shape[0] != t or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"rms_norm_rope_kv_store: q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] "
                         f"expected, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[2:] != k.shape[1:] \
            or v_cache.shape[2:] != v.shape[1:] or rows.shape != (t,):
        raise ValueError(f"rms_norm_rope_kv_store: caches [blocks, block_size, {k.shape[1]}, D / Dv] "
                         f"and rows [{t}] expected, got {list(k_cache.shape)}, {list(v_cache.shape)}, "
                         f"{list(rows.shape)}")
    dest = rows.long()
    k_cache.flatten(0, 1)[dest] = norm_rope(k, k_weight, cos, sin, **kw).to(k_cache.dtype)
    v_cache.flatten(0, 1)[dest] = v.to(v_cache.dtype)
    return norm_rope(q, q_weight, cos, sin, **kw)


def _kv_store_case(t: int, hq: int, hkv: int, d: int, rotary: int, blocks: int, bs: int):
    def make(gen, dtype, device):
        base = _norm_rope_case(t, hq + 2 * hkv, d, rotary, 0, False, True, 1.0, base=1e7)(gen, dtype, device)
        qkv = base["x"]   # one projection's output, sliced as the model does
        k_cache = randn(gen, blocks, bs, hkv, d, dtype=dtype, device=device)
        return {"q": qkv[:, :hq], "k": qkv[:, hq:hq + hkv], "v": qkv[:, hq + hkv:],
                "q_weight": base["weight"], "k_weight": base["weight"].flip(0),
                "cos": base["cos"], "sin": base["sin"], "k_cache": k_cache,
                "v_cache": randn(gen, blocks, bs, hkv, d, dtype=dtype, device=device),
                "rows": torch.randperm(blocks * bs, generator=gen)[:t].to(device=device, dtype=torch.int32),
                "eps": 1e-6, "weight_offset": 1.0}
    return make


def _norm_case(rows: int, dim: int, weighted: bool, offset: float = 0.0):
    def make(gen, dtype, device):
        inputs = {"x": randn(gen, rows, dim, dtype=dtype, device=device, scale=3.0), "eps": 1e-6}
        if weighted:
            inputs["weight"] = randn(gen, dim, dtype=torch.float32, device=device, scale=0.5) + 1.0
        if offset:
            inputs["weight_offset"] = offset
        return inputs
    return make


def _gated_case(rows: int, heads: int, dim: int, activation: str):
    def make(gen, dtype, device):
        return {
            "x": randn(gen, rows, heads, dim, dtype=dtype, device=device),
            "gate": randn(gen, rows, heads, dim, dtype=dtype, device=device),
            "weight": randn(gen, dim, dtype=torch.float32, device=device, scale=0.1) + 1.0,
            "eps": 1e-5,
            "activation": activation,
        }
    return make


RMS_NORM = define_op(
    rms_norm,
    cases=[
        Case("weighted_4096", _norm_case(7, 4096, True)),
        Case("unweighted_head512", _norm_case(9, 512, False)),
        Case("zero_centred_odd", _norm_case(5, 200, True, offset=1.0)),
    ],
    tolerance=_TOL,
    dtypes=(torch.float32, torch.bfloat16, torch.float16),
)

def _add_case(rows: int, dim: int, weighted: bool, offset: float = 0.0):
    def make(gen, dtype, device):
        inputs = _norm_case(rows, dim, weighted, offset)(gen, dtype, device)
        inputs["residual"] = randn(gen, rows, dim, dtype=dtype, device=device, scale=3.0)
        return inputs
    return make


ADD_RMS_NORM = define_op(
    add_rms_norm,
    cases=[
        Case("qwen35_zero_centred_1024", _add_case(5, 1024, True, offset=1.0)),
        Case("weighted_odd_200", _add_case(3, 200, True)),
        Case("unweighted_4096", _add_case(2, 4096, False)),
    ],
    # y is normalised from the rounded sum: one ulp of difference in that rounding (the Triton
    # interpreter truncates fp32 -> bf16 where GPUs round to nearest) moves y by up to 2 ulps.
    tolerance={**_TOL, torch.bfloat16: Tol(2e-2, 2e-2)},
    dtypes=(torch.float32, torch.bfloat16),
)

RMS_NORM_GATED = define_op(
    rms_norm_gated,
    cases=[
        Case("gdn_silu", _gated_case(6, 4, 128, "silu")),
        Case("kda_sigmoid", _gated_case(5, 3, 64, "sigmoid")),
    ],
    tolerance=_TOL,
)


def _norm_rope_case(t: int, heads: int, d: int, rotary: int, start: int, interleaved: bool,
                    weighted: bool, offset: float = 0.0, base: float = 1e4):
    def make(gen, dtype, device):
        from hwinfer.ops.rope import rope_tables

        cos, sin = rope_tables(randint(gen, 0, 4096, t, device=device), rotary_dim=rotary,
                               base=base)
        shape = (t, heads, d) if heads else (t, d)
        weight = None
        if weighted:  # zero-centred weights sit around 0, plain ones around 1
            weight = randn(gen, d, dtype=torch.float32, device=device, scale=0.2)
            weight = weight if offset else weight + 1.0
        return {"x": randn(gen, *shape, dtype=dtype, device=device, scale=2.0), "weight": weight,
                "cos": cos, "sin": sin, "eps": 1e-6, "weight_offset": offset, "start": start,
                "interleaved": interleaved}
    return make


RMS_NORM_ROPE = define_op(
    rms_norm_rope,
    cases=[
        Case("qwen35_rotate_half_zero_centred", _norm_rope_case(7, 4, 256, 64, 0, False, True,
                                                                1.0, base=1e7)),
        Case("dsv4_q_unweighted_interleaved", _norm_rope_case(5, 8, 512, 64, 448, True, False)),
        Case("dsv4_kv_single_head_2d", _norm_rope_case(6, 0, 512, 64, 448, True, True)),
    ],
    tolerance=_ROPE_TOL,
)
RMS_NORM_ROPE_KV_STORE = define_op(
    rms_norm_rope_kv_store,
    cases=[Case("qwen35_decode_B3", _kv_store_case(3, 8, 2, 256, 64, 4, 16)),
           Case("gqa_B5_d64", _kv_store_case(5, 4, 1, 64, 32, 3, 8))],
    tolerance=_ROPE_TOL,
    mutates=("k_cache", "v_cache"),
)
