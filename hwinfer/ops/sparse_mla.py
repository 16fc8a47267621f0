"""Sparse MLA contracts: one shared latent K=V head attended at per-token index lists.

Used by DeepSeek-V4 (sliding window + compressed entries [+ indexer top-k], with sinks and
inverse RoPE on the output), GLM-5 DSA and HY4 (absorbed MLA over the indexer's top-2048 tokens).
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randn
from hwinfer.ops.kv_pack import FP8_DS_BYTES, FP8_DS_DIM, pack_fp8_ds_mla, unpack_fp8_ds_mla

_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)}


def check_sparse_mla_args(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                          sinks: torch.Tensor | None, v_dim: int | None,
                          out_rope: tuple[torch.Tensor, torch.Tensor] | None, op: str) -> int:
    """Shape checks shared by both ops (q [T,H,D], kv [N,D], indices [T,K]); returns v_dim."""
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [T, H, D], got shape {tuple(q.shape)}")
    if kv.dim() != 2 or kv.shape[1] != q.shape[2]:
        raise ValueError(f"{op}: kv must be [N, D={q.shape[2]}], got shape {tuple(kv.shape)}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"{op}: indices must be [T={q.shape[0]}, K], got shape {tuple(indices.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: indices must be int32 (or int64), got {indices.dtype}")
    if not q.is_floating_point() or kv.dtype != q.dtype:
        raise ValueError(f"{op}: q and kv must share one float dtype, got {q.dtype} and {kv.dtype}")
    if sinks is not None and tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"{op}: sinks must be [H={q.shape[1]}], got shape {tuple(sinks.shape)}")
    d = q.shape[2]
    dv = d if v_dim is None else int(v_dim)
    if not 0 < dv <= d:
        raise ValueError(f"{op}: v_dim must be in 1..D={d}, got {v_dim}")
    if out_rope is not None:
        cos, sin = out_rope
        if cos.dim() != 2 or cos.shape[0] != q.shape[0] or cos.shape != sin.shape:
            raise ValueError(f"{op}: out_rope cos/sin must both be [T={q.shape[0]}, R/2], got "
                             f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        if 2 * cos.shape[1] > dv:
            raise ValueError(f"{op}: rope width R={2 * cos.shape[1]} exceeds the output width {dv}")
    return dv


def check_index_range(indices: torch.Tensor, n_rows: int, op: str) -> None:
    """Entries must be -1 (invalid) or a row of kv; anything else is a caller bug."""
    if indices.numel() and (int(indices.min()) < -1 or int(indices.max()) >= n_rows):
        raise ValueError(f"{op}: indices must lie in [-1, {n_rows}); got values in "
                         f"[{int(indices.min())}, {int(indices.max())}]")


def inverse_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (2i, 2i+1) of the last R = 2*cos.shape[-1] channels of fp32 ``x`` by -angle.

    x [T, H, Dv] fp32; cos, sin [T, R/2]. Returns a new tensor (x is not modified).
    """
    r = 2 * cos.shape[-1]
    if r == 0:
        return x
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    even, odd = x[..., x.shape[-1] - r::2], x[..., x.shape[-1] - r + 1::2]
    rot = torch.stack((even * c + odd * s, odd * c - even * s), dim=-1).flatten(-2)
    return torch.cat((x[..., : x.shape[-1] - r], rot), dim=-1)


def sparse_mla_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                       sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                       out_rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Sparse multi-query attention over one shared latent K=V head, rows chosen per token.

    For token t and head h, with J_t = the entries j of ``indices[t]`` that are >= 0:

        l_j  = scale * q[t, h] . kv[indices[t, j]]                       (j in J_t)
        p    = softmax([l_j for j in J_t] ++ [sinks[h]])   (the sink column only if sinks given)
        o    = sum_j p_j * kv[indices[t, j], :v_dim]                    (sink column dropped)

    so with sinks the weights sum to < 1. Keys are the full rows (width D), values their first
    ``v_dim`` channels (``v_dim=None``: V = K = kv, DeepSeek-V4). No causal or window mask is
    applied: the index list *is* the mask, so the caller must already have turned future or
    not-yet-complete entries into -1. A duplicated index is a gather, not a set: it counts twice
    (its weight doubles); the models never produce duplicates but every kernel must agree. A row
    with no valid index gives 0 (with or without sinks). ``out_rope=(cos, sin)`` then rotates
    pairs (2i, 2i+1) of the output's last R = 2*cos.shape[1] channels by **-angle** (inverse
    interleaved RoPE at the query position; DeepSeek-V4 §2.5: V = K carries RoPE on its last
    64 channels, so the output is rotated back before the grouped output projection).
    Everything runs in fp32 and is cast to q.dtype once at the end.

    Shapes / dtypes: q [T, H, D] float; kv [N, D] same dtype (a gathered workspace or the whole
    cache viewed as rows); indices [T, K] int32 (int64 accepted), entries in [-1, N), -1 =
    invalid; sinks [H] float (used in fp32) or None; cos, sin [T, R/2] fp32, R even, R <= v_dim.
    Returns [T, H, v_dim or D] in q.dtype.

    Model usage:
    * DeepSeek-V4 (MODELS.md §2.5-2.7): D = ``head_dim`` 512, H = ``num_attention_heads``,
      kv rows = raw sliding-window KV (``sliding_window`` 128, RoPE already applied) followed by
      the layer's compressed entries; indices[t] = the window rows of t then the compressed rows
      (all completed ones for HCA, the indexer's ``index_topk`` for CSA); sinks = ``attn_sink``;
      scale = 512**-0.5; out_rope = the layer's rope table (main or compress) with R =
      ``qk_rope_head_dim`` 64.
    * GLM-5 DSA (``glm_moe_dsa``), absorbed MLA: q = [q_nope @ W_UK (kv_lora_rank 512) | q_pe
      (qk_rope_head_dim 64)], kv = [kv_a_layernorm(latent) | roped k_pe] (D = 576),
      v_dim = 512; indices = the indexer's top-``index_topk`` token positions (2048), future
      picks set to -1; no sinks; output then goes through W_UV (-> ``v_head_dim``) and o_proj.
      Easy to get wrong: scale stays (qk_nope_head_dim + qk_rope_head_dim)**-0.5 = 256**-0.5
      (times YaRN mscale^2 when ``rope_parameters`` has ``mscale_all_dim``), not 576**-0.5.
    * HY4 (``hy_v4``): as GLM-5 plus sinks (``learnable_sink_param``); its sigmoid output gate
      (``gate_proj`` [H*v_head_dim, hidden]) multiplies the per-head output *after* the W_UV
      up-projection, just before o_proj, so it is not part of this op.
    """
    dv = check_sparse_mla_args(q, kv, indices, sinks, v_dim, out_rope, "sparse_mla_prefill")
    check_index_range(indices, kv.shape[0], "sparse_mla_prefill")
    t_len, heads, _ = q.shape
    out = torch.zeros(t_len, heads, dv, dtype=torch.float32, device=q.device)
    for t in range(t_len):
        rows = indices[t][indices[t] >= 0].long()
        keys = kv[rows].float()                                    # [n, D]; duplicates kept
        logits = (q[t].float() @ keys.T) * scale                   # [H, n]
        if sinks is not None:
            logits = torch.cat((logits, sinks.float()[:, None]), dim=1)
        if logits.shape[1] == 0:
            continue                                               # no valid index: output 0
        probs = torch.softmax(logits, dim=1)[:, : rows.numel()]    # drop the sink column
        out[t] = probs @ keys[:, :dv]
    if out_rope is not None:
        out = inverse_rope_interleaved(out, *out_rope)
    return out.to(q.dtype)


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                      out_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                      extra_kv_cache: torch.Tensor | None = None,
                      extra_indices: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse MLA decode over a paged latent cache: :func:`sparse_mla_prefill` per (b, s).

    Same math as ``sparse_mla_prefill`` with q[b, s] as the query and the cache viewed as rows:
    entry ``indices[b, s, j]`` is a GLOBAL slot ``block_id * block_size + offset`` into
    ``kv_cache`` (-1 invalid). The caller resolves each request's positions (window rows,
    compressed entries, indexer picks) through its block table; this op never sees one.
    S > 1 covers speculative / MTP decoding (each of the S query tokens has its own list).

    ``extra_kv_cache`` [blocks2, block_size2, D] with ``extra_indices`` [B, S, K2] (global slots
    into it, -1 invalid; both or neither) adds a second set of rows to the *same* softmax (as
    FlashMLA's ``extra_k_cache`` / ``extra_indices_in_kvcache``): DeepSeek-V4 decode attends its
    sliding-window ring (``kv_cache`` = the ring viewed [slots, window, D]) and its compressed
    entries (``extra_kv_cache`` = the paged entry store) at once. The result equals the call
    on one cache holding both row sets with the two index lists concatenated.

    Shapes / dtypes: q [B, S, H, D] float; kv_cache [num_blocks, block_size, D] same dtype
    (unquantized rows); indices [B, S, K] int32 (int64 accepted), entries in
    [-1, num_blocks * block_size); sinks [H] or None; out_rope cos, sin [B, S, R/2] fp32.
    Returns [B, S, H, v_dim or D] in q.dtype.

    DeepSeek-V4's FP8 cache: with D = 512, ``kv_cache`` (and ``extra_kv_cache``, both or
    neither) may instead be uint8 [blocks, block_size, 584], each row one entry in the
    ``fp8_ds_mla`` layout (448 e4m3 NoPE values with 7 UE8M0 group scales, 64 bf16 RoPE values;
    :mod:`hwinfer.ops.kv_pack`). The result is the op on the exactly dequantized rows (in
    q.dtype), so an impl that dequantizes in its gather loses nothing. (V3.2 / GLM-5's 656 B
    layout is not covered.)
    """
    if q.dim() != 4:
        raise ValueError(f"sparse_mla_decode: q must be [B, S, H, D], got shape {tuple(q.shape)}")
    if kv_cache.dim() != 3:
        raise ValueError("sparse_mla_decode: kv_cache must be [num_blocks, block_size, D], got "
                         f"shape {tuple(kv_cache.shape)}")
    b, s, h, d = q.shape
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s):
        raise ValueError(f"sparse_mla_decode: indices must be [B={b}, S={s}, K], got shape "
                         f"{tuple(indices.shape)}")
    rope = None
    if out_rope is not None:
        cos, sin = out_rope
        if cos.dim() != 3 or tuple(cos.shape[:2]) != (b, s) or cos.shape != sin.shape:
            raise ValueError(f"sparse_mla_decode: out_rope cos/sin must both be [B={b}, S={s}, R/2], "
                             f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
        rope = (cos.reshape(b * s, -1), sin.reshape(b * s, -1))
    if check_packed_caches(q, kv_cache, extra_kv_cache):
        kv_cache = unpack_fp8_ds_mla(kv_cache).to(q.dtype)
        if extra_kv_cache is not None:
            extra_kv_cache = unpack_fp8_ds_mla(extra_kv_cache).to(q.dtype)
    rows, idx = kv_cache.reshape(-1, kv_cache.shape[-1]), indices.reshape(b * s, -1)
    if (extra_kv_cache is None) != (extra_indices is None):
        raise ValueError("sparse_mla_decode: give extra_kv_cache and extra_indices together")
    if extra_kv_cache is not None:
        check_extra_args(q, extra_kv_cache, extra_indices)
        check_index_range(indices, rows.shape[0], "sparse_mla_decode")
        check_index_range(extra_indices, extra_kv_cache.shape[0] * extra_kv_cache.shape[1], "sparse_mla_decode")
        extra = extra_indices.reshape(b * s, -1).long()
        idx = torch.cat((idx.long(), torch.where(extra >= 0, extra + rows.shape[0], -1)), dim=1)
        rows = torch.cat((rows, extra_kv_cache.reshape(-1, d)))
    out = sparse_mla_prefill(q.reshape(b * s, h, d), rows, idx, sinks, scale=scale, v_dim=v_dim,
                             out_rope=rope)
    return out.reshape(b, s, h, -1)


def check_packed_caches(q: torch.Tensor, kv_cache: torch.Tensor,
                        extra_kv_cache: torch.Tensor | None) -> bool:
    """Whether sparse_mla_decode's caches are fp8_ds_mla packed (uint8 [..., 584] with D = 512,
    both or neither); raises on a mix or a wrong shape."""
    packed = kv_cache.dtype == torch.uint8
    if extra_kv_cache is not None and (extra_kv_cache.dtype == torch.uint8) != packed:
        raise ValueError("sparse_mla_decode: kv_cache and extra_kv_cache must both be packed "
                         f"(uint8) or both float, got {kv_cache.dtype} and {extra_kv_cache.dtype}")
    if packed:
        for name, cache in (("kv_cache", kv_cache), ("extra_kv_cache", extra_kv_cache)):
            if cache is not None and (cache.dim() != 3 or cache.shape[-1] != FP8_DS_BYTES):
                raise ValueError(f"sparse_mla_decode: a packed {name} must be uint8 [blocks, "
                                 f"block_size, {FP8_DS_BYTES}], got {tuple(cache.shape)}")
        if q.shape[-1] != FP8_DS_DIM:
            raise ValueError(f"sparse_mla_decode: a packed (fp8_ds_mla) cache holds D = "
                             f"{FP8_DS_DIM} entries, q has D = {q.shape[-1]}")
    return packed


def check_extra_args(q: torch.Tensor, extra_kv_cache: torch.Tensor, extra_indices: torch.Tensor) -> None:
    """Shapes of sparse_mla_decode's second row set (see its docstring)."""
    b, s, _, d = q.shape
    if extra_kv_cache.dim() != 3 or extra_kv_cache.shape[-1] != d or extra_kv_cache.dtype != q.dtype:
        raise ValueError(f"sparse_mla_decode: extra_kv_cache must be [blocks, block_size, D={d}] in "
                         f"{q.dtype}, got {extra_kv_cache.dtype} {tuple(extra_kv_cache.shape)}")
    if extra_indices.dim() != 3 or tuple(extra_indices.shape[:2]) != (b, s) or \
            extra_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"sparse_mla_decode: extra_indices must be int32 [B={b}, S={s}, K2], got "
                         f"{extra_indices.dtype} {tuple(extra_indices.shape)}")


# ----------------------------------------------------------------------------------------------
# Cases (scaled-down model shapes; logits O(1) because q, kv ~ N(0, 1) and scale ~ D^-0.5).


def _rope_table(positions: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r)
    ang = positions.float()[..., None] * inv_freq
    return ang.cos(), ang.sin()


def _dsv4_rows(gen: torch.Generator, t_len: int, start: int, window: int, ratio: int, topk: int):
    """DeepSeek-V4-style index lists: raw rows 0..start+t_len-1, then the compressed entries.

    Token at position p lists its window rows p-window+1..p (-1 before position 0) followed by
    up to ``topk`` random distinct completed entries (w < (p+1)//ratio), -1 padded.
    """
    n_raw = start + t_len
    n_comp = n_raw // ratio
    rows = torch.full((t_len, window + topk), -1, dtype=torch.int32)
    for t in range(t_len):
        p = start + t
        win = torch.arange(p - window + 1, p + 1)
        rows[t, :window] = torch.where(win >= 0, win, -1).to(torch.int32)
        done = (p + 1) // ratio
        pick = torch.randperm(done, generator=gen)[: min(topk, done)]
        rows[t, window: window + pick.numel()] = (n_raw + pick).to(torch.int32)
    return rows, n_raw + n_comp


def _dsa_rows(gen: torch.Generator, t_len: int, start: int, topk: int) -> torch.Tensor:
    """GLM-5/HY4-style lists: up to ``topk`` random distinct past positions, -1 padded."""
    rows = torch.full((t_len, topk), -1, dtype=torch.int32)
    for t in range(t_len):
        pick = torch.randperm(start + t + 1, generator=gen)[:topk]
        rows[t, : pick.numel()] = pick.to(torch.int32)
    return rows


def _prefill_case(t_len: int, heads: int, dim: int, *, kind: str, rope: int = 0, sinks: bool = True,
                  v_dim: int | None = None, start: int = 0, empty_row: int | None = None,
                  duplicate_row: int | None = None):
    def make(gen, dtype, device):
        if kind == "dsv4":
            idx, n = _dsv4_rows(gen, t_len, start, window=16, ratio=4, topk=8)
        else:
            idx, n = _dsa_rows(gen, t_len, start, topk=32), start + t_len
        if empty_row is not None:
            idx[empty_row] = -1
        if duplicate_row is not None:
            idx[duplicate_row, 1] = idx[duplicate_row, 0]
        inputs = {
            "q": randn(gen, t_len, heads, dim, dtype=dtype, device=device),
            "kv": randn(gen, n, dim, dtype=dtype, device=device),
            "indices": idx.to(device),
            "sinks": randn(gen, heads, dtype=torch.float32, device=device) if sinks else None,
            "scale": dim ** -0.5, "v_dim": v_dim,
        }
        if rope:
            cos, sin = _rope_table(torch.arange(start, start + t_len), rope)
            inputs["out_rope"] = (cos.to(device), sin.to(device))
        return inputs
    return make


def _decode_extra_case(batch: int, heads: int, dim: int, *, window: int = 8, ratio: int = 4, topk: int = 4):
    """DeepSeek-V4 decode: window rows from a per-slot ring, entries from a paged store."""
    def make(gen, dtype, device):
        slots, blocks, block_size = batch + 2, 6, 16 // ratio
        win = torch.full((batch, 1, window), -1, dtype=torch.int32)
        extra = torch.full((batch, 1, topk), -1, dtype=torch.int32)
        for bi in range(batch):
            pos = int(torch.randint(0, 40, (1,), generator=gen))
            seen = torch.arange(max(0, pos - window + 1), pos + 1)
            win[bi, 0, : seen.numel()] = (bi + 1) * window + seen % window
            done = (pos + 1) // ratio
            pick = torch.randperm(blocks * block_size, generator=gen)[: min(topk, done)]
            extra[bi, 0, : pick.numel()] = pick.to(torch.int32)
        return {
            "q": randn(gen, batch, 1, heads, dim, dtype=dtype, device=device),
            "kv_cache": randn(gen, slots, window, dim, dtype=dtype, device=device),
            "indices": win.to(device),
            "sinks": randn(gen, heads, dtype=torch.float32, device=device),
            "scale": dim ** -0.5,
            "out_rope": tuple(t[:, None].to(device) for t in _rope_table(torch.arange(batch) * 7, 16)),
            "extra_kv_cache": randn(gen, blocks, block_size, dim, dtype=dtype, device=device),
            "extra_indices": extra.to(device),
        }
    return make


def _packed(make):
    """The same case with its caches in DeepSeek-V4's fp8_ds_mla layout (D = 512)."""
    def packed(gen, dtype, device):
        inputs = make(gen, dtype, device)
        for name in ("kv_cache", "extra_kv_cache"):
            if inputs.get(name) is not None:
                inputs[name] = pack_fp8_ds_mla(inputs[name])
        return inputs
    return packed


def _decode_case(batch: int, s: int, heads: int, dim: int, *, rope: int = 0, sinks: bool = True,
                 v_dim: int | None = None, k: int = 24, blocks: int = 12, block_size: int = 16):
    def make(gen, dtype, device):
        slots = blocks * block_size
        idx = torch.full((batch, s, k), -1, dtype=torch.int32)
        for bi in range(batch):
            for si in range(s):
                n_valid = k - int(torch.randint(0, k // 3, (1,), generator=gen))
                idx[bi, si, :n_valid] = torch.randperm(slots, generator=gen)[:n_valid].to(torch.int32)
        idx[batch - 1, s - 1] = -1                      # one row with no valid entry
        inputs = {
            "q": randn(gen, batch, s, heads, dim, dtype=dtype, device=device),
            "kv_cache": randn(gen, blocks, block_size, dim, dtype=dtype, device=device),
            "indices": idx.to(device),
            "sinks": randn(gen, heads, dtype=torch.float32, device=device) if sinks else None,
            "scale": dim ** -0.5, "v_dim": v_dim,
        }
        if rope:
            pos = torch.randint(0, 4096, (batch, s), generator=gen)
            cos, sin = _rope_table(pos, rope)
            inputs["out_rope"] = (cos.to(device), sin.to(device))
        return inputs
    return make


SPARSE_MLA_PREFILL = define_op(
    sparse_mla_prefill,
    cases=[
        Case("dsv4_d128_window_plus_compressed", _prefill_case(20, 8, 128, kind="dsv4", rope=64, start=5,
                                                                empty_row=3)),
        Case("dsv4_d512", _prefill_case(6, 8, 512, kind="dsv4", rope=64, start=40)),
        Case("glm5_absorbed_no_sinks", _prefill_case(12, 8, 160, kind="dsa", sinks=False, v_dim=128,
                                                     start=30, empty_row=0)),
        Case("hy4_absorbed_sinks_dup", _prefill_case(10, 4, 160, kind="dsa", v_dim=128, start=3,
                                                     duplicate_row=5)),
        # few tokens over a long context: index lists barely overlap
        Case("glm5_long_context", _prefill_case(4, 8, 160, kind="dsa", sinks=False, v_dim=128, start=700)),
    ],
    tolerance=_TOL,
)

SPARSE_MLA_DECODE = define_op(
    sparse_mla_decode,
    cases=[
        Case("dsv4_d128_s1", _decode_case(4, 1, 8, 128, rope=64)),
        Case("dsv4_d512_s2", _decode_case(2, 2, 8, 512, rope=64)),
        Case("glm5_absorbed_s2", _decode_case(3, 2, 8, 160, sinks=False, v_dim=128, k=32)),
        Case("dsv4_ring_plus_entries", _decode_extra_case(3, 8, 64)),
        Case("dsv4_fp8_cache_s2", _packed(_decode_case(2, 2, 8, 512, rope=64))),
        Case("dsv4_fp8_ring_plus_entries", _packed(_decode_extra_case(2, 8, 512))),
        # DeepSeek-V4's own head count: the shape NVIDIA Hopper's Gluon kernels take (bf16, packed)
        Case("dsv4_h64_ring_plus_entries", _decode_extra_case(2, 64, 512, window=16, topk=12)),
        Case("dsv4_h64_fp8_ring_plus_entries",
             _packed(_decode_extra_case(2, 64, 512, window=16, topk=12))),
        # GLM-5's absorbed rows at its head count (576 = 512 latent + 64 RoPE, values 512)
        Case("glm5_h64_d576_s2", _decode_case(2, 2, 64, 576, sinks=False, v_dim=512, k=40)),
    ],
    tolerance=_TOL,
)

__all__ = ["check_extra_args", "check_index_range", "check_packed_caches", "check_sparse_mla_args",
           "inverse_rope_interleaved", "sparse_mla_decode", "sparse_mla_prefill"]
