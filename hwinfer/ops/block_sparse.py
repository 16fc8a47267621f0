"""Block-sparse attention contracts (MiniMax-M3 ``minimax_m3_sparse`` layers, MODELS.md §5).

A "lightning indexer" picks, per query token and KV group, a few blocks of ``block_size``
consecutive key positions; GQA attention then runs over the keys of those blocks only.
Sequences are packed: queries [T, ...] split by ``cu_seqlens_q``, keys [S, ...] by
``cu_seqlens_k``; a sequence's queries are its *last* q_len key positions (bottom-right causal
alignment, as in dense attention with a cache), so query i of a sequence sits at position
``k_len - q_len + i`` and block ids count from the sequence's first key (position // block_size).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.contract import EXACT, Case, Tol, define_op, randn

_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)}


def seq_ranges(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, t_len: int, s_len: int,
               op: str) -> list[tuple[int, int, int, int]]:
    """Validate the two cu_seqlens and return ``(q0, q1, k0, k1)`` per sequence."""
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, t_len), ("cu_seqlens_k", cu_seqlens_k, s_len)):
        if cu.dim() != 1 or cu.numel() < 2 or cu.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{op}: {name} must be a 1-D int32 tensor [N+1], got {cu.dtype} "
                             f"shape {tuple(cu.shape)}")
        vals = cu.tolist()
        if vals[0] != 0 or vals[-1] != total or any(b < a for a, b in zip(vals, vals[1:])):
            raise ValueError(f"{op}: {name} must rise from 0 to {total}, got {vals}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"{op}: cu_seqlens_q and cu_seqlens_k describe different sequence counts")
    qs, ks = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = []
    for q0, q1, k0, k1 in zip(qs, qs[1:], ks, ks[1:]):
        if q1 - q0 > k1 - k0:
            raise ValueError(f"{op}: a sequence has q_len {q1 - q0} > k_len {k1 - k0} (queries must be "
                             "the last q_len key positions)")
        out.append((q0, q1, k0, k1))
    return out


def indexer_block_scores(q: torch.Tensor, k: torch.Tensor, block_size: int,
                         local_blocks: int) -> torch.Tensor:
    """One sequence's pooled block scores [H, q_len, n_blocks] in fp32 (-inf: no visible key,
    +inf: forced local block). q [q_len, H, D], k [k_len, D] (q_len <= k_len)."""
    q_len, k_len = q.shape[0], k.shape[0]
    pos = torch.arange(k_len - q_len, k_len, device=q.device)
    scores = torch.einsum("thd,sd->hts", q.float(), k.float())
    future = torch.arange(k_len, device=q.device)[None, None, :] > pos[None, :, None]
    scores = scores.masked_fill(future, float("-inf"))
    n_blocks = -(-k_len // block_size)
    scores = F.pad(scores, (0, n_blocks * block_size - k_len), value=float("-inf"))
    scores = scores.view(q.shape[1], q_len, n_blocks, block_size).amax(dim=-1)
    rows = torch.arange(q_len, device=q.device)
    for back in range(local_blocks):
        scores[:, rows, (pos // block_size - back).clamp(min=0)] = float("inf")
    return scores


def check_indexer_args(q: torch.Tensor, k: torch.Tensor, topk_blocks: int, local_blocks: int,
                       block_size: int) -> None:
    """Shape / option checks of :func:`block_sparse_indexer`."""
    if q.dim() != 3 or k.dim() != 2 or k.shape[1] != q.shape[2]:
        raise ValueError(f"block_sparse_indexer: expected q [T, H, D] and k [S, D], got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if not q.is_floating_point() or k.dtype != q.dtype:
        raise ValueError(f"block_sparse_indexer: q and k must share one float dtype, got {q.dtype}, "
                         f"{k.dtype}")
    if block_size < 1 or topk_blocks < 1 or not 0 <= local_blocks <= topk_blocks:
        raise ValueError("block_sparse_indexer: need block_size >= 1 and 0 <= local_blocks <= "
                         f"topk_blocks >= 1, got {block_size}, {local_blocks}, {topk_blocks}")


def block_sparse_indexer(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, *, block_size: int, topk_blocks: int,
                         local_blocks: int = 1) -> torch.Tensor:
    """MiniMax-M3 lightning-indexer block selection: top-k key blocks per query and head.

    For a query at position p (see module docstring) and indexer head h:

        s[j]  = q[t, h] . k[j]            (fp32, no scale, no ReLU, no per-head weights)
                for key positions j <= p, -inf for j > p
        B[b]  = max over j in block b (positions b*block_size .. +block_size-1) of s[j]
        B[b]  = +inf for the ``local_blocks`` forced blocks p//block_size - l, l = 0..local-1
                (clamped at block 0)
        out   = the min(topk_blocks, n_blocks) blocks with the largest B, those with B = -inf
                (no visible key) replaced by -1; -1 pads the row to ``topk_blocks`` entries.

    The forced local blocks are *part of* the top-``topk_blocks`` budget (M3: 16 blocks in all,
    the query's own block among them), not extra. Valid entries are left-packed and distinct;
    their order is unspecified (the reference gives descending score): compare as sets
    (:func:`compare_block_selection`). Exact score ties between unforced blocks have no defined
    winner. Each head selects independently; index heads = KV heads, so head h's blocks serve
    query heads h*G .. h*G+G-1 of :func:`block_sparse_attention`.

    Shapes / dtypes: q [T, H, D] (indexer queries, already q_norm-ed and roped), k [S, D] (the
    single indexer key head, k_norm-ed and roped, all cached positions of every sequence),
    cu_seqlens_q / cu_seqlens_k [N+1] int32. Returns [T, H, topk_blocks] int32.

    Model usage (``minimax_m3_vl_text``, layers with ``layer_types[i] == "minimax_m3_sparse"``):
    H = ``index_n_heads`` (4 = ``num_key_value_heads``), D = ``index_head_dim`` 128,
    ``block_size`` = ``index_block_size`` 128, ``topk_blocks`` = ``index_topk_blocks`` 16,
    ``local_blocks`` = ``index_local_blocks`` 1. q = index_q_proj(x) per head, k = index_k_proj(x)
    (one head), both through Gemma-style RMSNorm (weight 1 + w) and rotate-half (neox) RoPE on
    their leading channels with the main attention's cos/sin table (theta 5e6; MODELS.md §5:
    partial, 64 dims), all before this op.
    """
    check_indexer_args(q, k, topk_blocks, local_blocks, block_size)
    out = torch.full((q.shape[0], q.shape[1], topk_blocks), -1, dtype=torch.int32, device=q.device)
    for q0, q1, k0, k1 in seq_ranges(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                     "block_sparse_indexer"):
        if q1 == q0:
            continue
        scores = indexer_block_scores(q[q0:q1], k[k0:k1], block_size, local_blocks)
        top, idx = scores.topk(min(topk_blocks, scores.shape[-1]), dim=-1)
        idx = idx.masked_fill(top == float("-inf"), -1)
        out[q0:q1, :, : idx.shape[-1]] = idx.permute(1, 0, 2).to(torch.int32)
    return out


def compare_block_selection(out, ref, inputs, tol) -> str | None:
    """Selections agree if every row holds the same set of blocks, or (near-ties only) a set
    that is still a valid top-k: same count, distinct, left-packed, forced blocks included, and
    no unchosen visible block scoring above a chosen one by more than fp32 rounding."""
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != ref.dtype:
        return f"expected an int32 tensor of shape {tuple(ref.shape)}, got {getattr(out, 'shape', out)}"
    out, ref = out.cpu(), ref.cpu()
    valid = out >= 0
    if bool((valid[..., 1:] & ~valid[..., :-1]).any()):
        return "valid entries are not left-packed (a block index follows a -1)"
    if not torch.equal(valid.sum(-1), (ref >= 0).sum(-1)):
        return "number of selected blocks differs from the reference in some rows"
    srt = out.sort(dim=-1).values
    if bool(((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)).any()):
        return "a row selects the same block twice"
    bad = (srt != ref.cpu().sort(dim=-1).values).any(-1)           # [T, H]
    if not bool(bad.any()):
        return None
    q, k = inputs["q"].cpu(), inputs["k"].cpu()
    for q0, q1, k0, k1 in seq_ranges(inputs["cu_seqlens_q"].cpu(), inputs["cu_seqlens_k"].cpu(),
                                     q.shape[0], k.shape[0], "compare_block_selection"):
        if not bool(bad[q0:q1].any()):
            continue
        scores = indexer_block_scores(q[q0:q1], k[k0:k1], inputs["block_size"],
                                      inputs.get("local_blocks", 1))
        for t, h in bad[q0:q1].nonzero().tolist():
            row, picked = scores[h, t], out[q0 + t, h][out[q0 + t, h] >= 0].long()
            if int(picked.max()) >= row.numel():
                return f"token {q0 + t} head {h}: block {int(picked.max())} beyond the key range"
            chosen = torch.zeros_like(row, dtype=torch.bool)
            chosen[picked] = True
            if bool((row[picked] == float("-inf")).any()) or bool((~chosen & (row == float("inf"))).any()):
                return f"token {q0 + t} head {h}: a future block chosen or a forced local block missing"
            finite = row[torch.isfinite(row)]
            slack = 1e-5 * (1.0 + float(finite.abs().max())) if finite.numel() else 0.0
            lo = row[chosen & torch.isfinite(row)]
            hi = row[~chosen & torch.isfinite(row)]
            if lo.numel() and hi.numel() and float(hi.max()) > float(lo.min()) + slack:
                return (f"token {q0 + t} head {h}: unchosen block scores {float(hi.max()):.6g} > chosen "
                        f"{float(lo.min()):.6g} (not a tie)")
    return None


def check_attention_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         block_indices: torch.Tensor, block_size: int) -> tuple[int, int]:
    """Shape checks of :func:`block_sparse_attention`; returns (Hq, Hkv)."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or k.shape[2] != q.shape[2]:
        raise ValueError(f"block_sparse_attention: expected q [T, Hq, D] and k, v [S, Hkv, D], got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not q.is_floating_point() or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"block_sparse_attention: q, k, v must share one float dtype, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"block_sparse_attention: Hq={hq} is not a multiple of Hkv={hkv}")
    if block_indices.dim() != 3 or tuple(block_indices.shape[:2]) != (q.shape[0], hkv):
        raise ValueError(f"block_sparse_attention: block_indices must be [T={q.shape[0]}, Hkv={hkv}, "
                         f"n_sel], got {tuple(block_indices.shape)}")
    if block_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_sparse_attention: block_indices must be int32, got {block_indices.dtype}")
    if block_size < 1:
        raise ValueError(f"block_sparse_attention: block_size must be >= 1, got {block_size}")
    return hq, hkv


def checked_blocks(sel: torch.Tensor, n_blocks: int, k_len: int) -> torch.Tensor:
    """One sequence's block indices as int64, after checking they lie in [-1, n_blocks)."""
    sel = sel.long()
    if sel.numel() and (int(sel.min()) < -1 or int(sel.max()) >= n_blocks):
        raise ValueError(f"block_sparse_attention: block indices must lie in [-1, {n_blocks}) for a "
                         f"sequence of {k_len} keys, got [{int(sel.min())}, {int(sel.max())}]")
    return sel


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           block_indices: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, *, block_size: int, scale: float) -> torch.Tensor:
    """Causal GQA attention restricted to selected key blocks (MiniMax-M3 sparse layers).

    Query token t (position p in its sequence) and query head h use KV head g = h // (Hq / Hkv)
    (consecutive query heads share a KV head) and attend to the key positions j with

        j // block_size  in  {block_indices[t, g, :]} (entries -1 ignored)   and   j <= p,

    softmax(scale * q.k) over those keys, output sum p_j v_j. The selection is a *set*: a block
    listed twice is attended once (transformers' mask semantics; the indexer never repeats one).
    A selected block may straddle or follow p; only its keys <= p count. A row with no usable key
    gives 0 (transformers' eager mask would average every key there instead; the indexer's forced
    own block makes such rows unreachable in the model). fp32 accumulation, result in q.dtype.

    Shapes / dtypes: q [T, Hq, D]; k, v [S, Hkv, D] (same dtype as q); block_indices
    [T, Hkv, n_sel] int32 (int64 accepted), entries in [-1, ceil(k_len / block_size)) of the
    token's own sequence (block 0 = the sequence's first key); cu_seqlens_q / cu_seqlens_k
    [N+1] int32. Returns [T, Hq, D].

    Model usage (``minimax_m3_vl_text``, ``minimax_m3_sparse`` layers): Hq = 64, Hkv = 4,
    D = ``head_dim`` 128, scale = 128**-0.5, block_size = ``index_block_size`` 128, block_indices
    from :func:`block_sparse_indexer` (n_sel = 16); q, k after q_norm/k_norm and partial RoPE.
    Decode against a paged cache is :func:`block_sparse_decode`; here k, v are the contiguous
    keys of each sequence.
    """
    hq, hkv = check_attention_args(q, k, v, block_indices, block_size)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for q0, q1, k0, k1 in seq_ranges(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                     "block_sparse_attention"):
        q_len, k_len = q1 - q0, k1 - k0
        n_blocks = -(-k_len // block_size)
        sel = checked_blocks(block_indices[q0:q1], n_blocks, k_len)
        keep = torch.zeros(q_len, hkv, n_blocks + 1, dtype=torch.bool, device=q.device)
        keep.scatter_(-1, torch.where(sel < 0, n_blocks, sel), True)     # -1 -> spare column
        key_pos = torch.arange(k_len, device=q.device)
        q_pos = torch.arange(k_len - q_len, k_len, device=q.device)
        allowed = keep[..., key_pos // block_size] & (key_pos[None, None, :] <= q_pos[:, None, None])
        for h in range(hq):
            g = h // (hq // hkv)
            logits = (q[q0:q1, h].float() @ k[k0:k1, g].float().T) * scale       # [q_len, k_len]
            logits = logits.masked_fill(~allowed[:, g], float("-inf"))
            probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)               # empty rows -> 0
            out[q0:q1, h] = probs @ v[k0:k1, g].float()
    return out.to(q.dtype)


def check_decode_args(q: torch.Tensor, index_q: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, index_k_cache: torch.Tensor, rows: torch.Tensor,
                      block_size: int, topk_blocks: int, local_blocks: int) -> None:
    """Shape / option checks of :func:`block_sparse_decode` (no device reads)."""
    op = "block_sparse_decode"
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape or \
            k_cache.shape[2] != q.shape[2]:
        raise ValueError(f"{op}: expected q [N, Hq, D] and k_cache, v_cache [R, Hkv, D], got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    n, hq, hkv = q.shape[0], q.shape[1], k_cache.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"{op}: Hq={hq} is not a multiple of Hkv={hkv}")
    if index_q.dim() != 3 or tuple(index_q.shape[:2]) != (n, hkv):
        raise ValueError(f"{op}: index_q must be [N={n}, Hkv={hkv}, Di], got {tuple(index_q.shape)}")
    if index_k_cache.dim() != 2 or index_k_cache.shape != (k_cache.shape[0], index_q.shape[2]):
        raise ValueError(f"{op}: index_k_cache must be [R={k_cache.shape[0]}, Di={index_q.shape[2]}], "
                         f"got {tuple(index_k_cache.shape)}")
    if rows.dim() != 2 or rows.shape[0] != n or rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: rows must be an int32/int64 [N={n}, W] tensor, got {rows.dtype} "
                         f"shape {tuple(rows.shape)}")
    if not all(t.is_floating_point() for t in (q, index_q, k_cache, v_cache, index_k_cache)):
        raise ValueError(f"{op}: q, index_q and the caches must be float tensors")
    if block_size < 1 or topk_blocks < 1 or not 0 <= local_blocks <= topk_blocks:
        raise ValueError(f"{op}: need block_size >= 1 and 0 <= local_blocks <= topk_blocks >= 1, "
                         f"got {block_size}, {local_blocks}, {topk_blocks}")


def block_sparse_decode(q: torch.Tensor, index_q: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, index_k_cache: torch.Tensor, rows: torch.Tensor, *,
                        block_size: int, topk_blocks: int, local_blocks: int = 1,
                        scale: float) -> torch.Tensor:
    """One decode step of a MiniMax-M3 sparse layer over a paged cache: block selection by the
    indexer, then attention over the selected blocks, for one new token per request.

    Request n has L_n = the number of entries >= 0 of ``rows[n]`` cached positions (its new
    token's keys already written), stored at rows ``rows[n, 0 .. L_n-1]`` of the caches
    (``rows[n, j]`` = the cache row of position j; -1 from L_n on, so valid entries are
    left-packed and L_n >= 1). With k_n, v_n, ik_n those rows of ``k_cache``, ``v_cache``,
    ``index_k_cache``, the result for request n is

        blocks = block_sparse_indexer(index_q[n:n+1], ik_n, [0, 1], [0, L_n], block_size=,
                                      topk_blocks=, local_blocks=)
        out[n] = block_sparse_attention(q[n:n+1], k_n, v_n, blocks, [0, 1], [0, L_n],
                                        block_size=, scale=)

    i.e. the query sits at position L_n - 1 and block b holds positions b*block_size .. +
    block_size-1 of its own request. Nothing here depends on a host-side length: ``rows`` has a
    fixed width W (any bound >= every L_n; a CUDA-graph decode uses its block table's capacity),
    so an impl can run without reading the device.

    Shapes / dtypes: q [N, Hq, D]; index_q [N, Hkv, Di] (one index head per KV head, q_norm-ed
    and roped); k_cache, v_cache [R, Hkv, D] and index_k_cache [R, Di] (the per-token stores with
    their block axes flattened, any float dtype; fp32 math); rows [N, W] int32. Returns
    [N, Hq, D] in q.dtype.

    Model usage: MiniMax-M3 ``minimax_m3_sparse`` layers in decode, with ``rows =
    ForwardBatch.entry_rows()`` and the caches' ``k``, ``v``, ``index_k`` (Hq 64, Hkv 4, D 128,
    Di 128, block_size 128, topk_blocks 16, local_blocks 1).
    """
    check_decode_args(q, index_q, k_cache, v_cache, index_k_cache, rows, block_size,
                      topk_blocks, local_blocks)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    one = torch.tensor([0, 1], dtype=torch.int32, device=q.device)
    for n in range(q.shape[0]):
        valid = rows[n] >= 0
        length = int(valid.sum())
        if length == 0 or not bool(valid[:length].all()):
            raise ValueError(f"block_sparse_decode: rows[{n}] must hold L >= 1 cache rows "
                             "followed only by -1")
        r = rows[n, :length].long()
        cu_k = torch.tensor([0, length], dtype=torch.int32, device=q.device)
        k_n, v_n = k_cache[r].float(), v_cache[r].float()
        blocks = block_sparse_indexer(index_q[n:n + 1].float(), index_k_cache[r].float(), one, cu_k,
                                      block_size=block_size, topk_blocks=topk_blocks,
                                      local_blocks=local_blocks)
        out[n] = block_sparse_attention(q[n:n + 1].float(), k_n, v_n, blocks, one, cu_k,
                                        block_size=block_size, scale=scale)[0].to(q.dtype)
    return out


# ----------------------------------------------------------------------------------------------
# Cases: packed sequences given as (q_len, k_len); fresh prefill (q_len = k_len), chunked
# prefill after a cached prefix (q_len < k_len) and decode (q_len = 1), k_len not a multiple of
# the block size. Continuous random q, k make exact block-score ties vanishingly unlikely.


def _cu(lens: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    cu_q = torch.tensor([0] + [q for q, _ in lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + [k for _, k in lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    return cu_q.to(device), cu_k.to(device)


def _indexer_case(lens, heads: int, dim: int, block_size: int, topk: int, local: int):
    def make(gen, dtype, device):
        cu_q, cu_k = _cu(lens, device)
        return {
            "q": randn(gen, int(cu_q[-1]), heads, dim, dtype=dtype, device=device),
            "k": randn(gen, int(cu_k[-1]), dim, dtype=dtype, device=device),
            "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "block_size": block_size, "topk_blocks": topk, "local_blocks": local,
        }
    return make


def _random_blocks(gen: torch.Generator, lens, hkv: int, n_sel: int, block_size: int) -> torch.Tensor:
    """Per (token, KV head): the query's own block first, then random distinct others (future
    blocks included: only their keys <= p may count), a random number of them valid, -1 after.
    The first row selects nothing and the second repeats its first block."""
    rows = []
    for q_len, k_len in lens:
        n_blocks = -(-k_len // block_size)
        for p in range(k_len - q_len, k_len):
            for _ in range(hkv):
                own = p // block_size
                others = [b for b in torch.randperm(n_blocks, generator=gen).tolist() if b != own]
                picks = ([own] + others)[: int(torch.randint(1, n_sel + 1, (1,), generator=gen))]
                rows.append(picks + [-1] * (n_sel - len(picks)))
    out = torch.tensor(rows, dtype=torch.int32).view(-1, hkv, n_sel)
    out[0, 0] = -1
    out[1, 0, 1] = out[1, 0, 0]
    return out


def _attention_case(lens, hq: int, hkv: int, dim: int, block_size: int, n_sel: int):
    def make(gen, dtype, device):
        cu_q, cu_k = _cu(lens, device)
        t_len, s_len = int(cu_q[-1]), int(cu_k[-1])
        return {
            "q": randn(gen, t_len, hq, dim, dtype=dtype, device=device),
            "k": randn(gen, s_len, hkv, dim, dtype=dtype, device=device),
            "v": randn(gen, s_len, hkv, dim, dtype=dtype, device=device),
            "block_indices": _random_blocks(gen, lens, hkv, n_sel, block_size).to(device),
            "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "block_size": block_size, "scale": dim ** -0.5,
        }
    return make


BLOCK_SPARSE_INDEXER = define_op(
    block_sparse_indexer,
    cases=[
        Case("varlen_prefill_chunk_decode", _indexer_case([(40, 40), (24, 100), (1, 77)], 4, 64, 16, 4, 1)),
        Case("local2_topk_over_blocks", _indexer_case([(30, 30), (5, 50)], 4, 32, 8, 8, 2)),
        Case("m3_like_d128", _indexer_case([(48, 300), (1, 513)], 4, 128, 32, 6, 1)),
    ],
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT},
    compare=compare_block_selection,
)

BLOCK_SPARSE_ATTENTION = define_op(
    block_sparse_attention,
    cases=[
        Case("varlen_gqa", _attention_case([(40, 40), (20, 90), (1, 65)], 8, 2, 64, 16, 4)),
        Case("long_keys_few_blocks", _attention_case([(2, 600), (1, 301)], 8, 2, 64, 16, 4)),
        Case("m3_like_d128", _attention_case([(64, 256)], 16, 4, 128, 32, 4)),
    ],
    tolerance=_TOL,
)


def _decode_case(lens: list[int], width: int, hq: int, hkv: int, dim: int, idim: int,
                 block_size: int, topk: int, local: int, store_rows: int):
    """Requests of the given cached lengths (new token included) at random distinct rows of a
    store (paging shuffles them), rows padded with -1 to ``width``."""
    def make(gen, dtype, device):
        perm = torch.randperm(store_rows, generator=gen)
        rows = torch.full((len(lens), width), -1, dtype=torch.int32)
        start = 0
        for n, length in enumerate(lens):
            rows[n, :length] = perm[start:start + length].to(torch.int32)
            start += length
        return {
            "q": randn(gen, len(lens), hq, dim, dtype=dtype, device=device),
            "index_q": randn(gen, len(lens), hkv, idim, dtype=dtype, device=device),
            "k_cache": randn(gen, store_rows, hkv, dim, dtype=dtype, device=device),
            "v_cache": randn(gen, store_rows, hkv, dim, dtype=dtype, device=device),
            "index_k_cache": randn(gen, store_rows, idim, dtype=dtype, device=device),
            "rows": rows.to(device), "block_size": block_size, "topk_blocks": topk,
            "local_blocks": local, "scale": dim ** -0.5,
        }
    return make


BLOCK_SPARSE_DECODE = define_op(
    block_sparse_decode,
    cases=[
        Case("gqa_varlen_paged", _decode_case([1, 37, 70], 80, 8, 2, 32, 16, 8, 4, 1, 200)),
        Case("local2_topk_over_blocks", _decode_case([5, 16, 61], 64, 4, 2, 16, 16, 4, 8, 2, 128)),
        Case("m3_like_d128", _decode_case([300, 129], 320, 16, 4, 128, 128, 32, 6, 1, 512)),
    ],
    tolerance=_TOL,
)
