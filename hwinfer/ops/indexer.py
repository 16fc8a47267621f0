"""Lightning indexer contract: per-query top-k key selection (DeepSeek-V4 CSA, GLM-5 DSA)."""
from __future__ import annotations

import torch

from hwinfer.ops.contract import EXACT, Case, Inputs, Tol, compare_tensor, define_op, randn, uniform


def check_indexer_args(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                       k_end: torch.Tensor, topk: int, op: str = "lightning_indexer",
                       max_len: int | None = None, k_rows: torch.Tensor | None = None) -> None:
    """Validate shapes, dtypes and the key ranges (ValueError naming the problem)."""
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [T, Hi, Di], got shape {tuple(q.shape)}")
    t, h, d = q.shape
    if k.dim() != 2 or k.shape[1] != d:
        raise ValueError(f"{op}: k must be [N, Di={d}], got shape {tuple(k.shape)}")
    if tuple(weights.shape) != (t, h):
        raise ValueError(f"{op}: weights shape {tuple(weights.shape)} != [T, Hi] = {(t, h)}")
    for name, x in (("k_start", k_start), ("k_end", k_end)):
        if tuple(x.shape) != (t,) or x.is_floating_point():
            raise ValueError(f"{op}: {name} must be an integer [T={t}] tensor, got {x.dtype} {tuple(x.shape)}")
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"{op}: topk must be a positive int, not {topk!r}")
    n_keys = k.shape[0]
    if k_rows is not None:
        if k_rows.dim() != 1 or k_rows.is_floating_point():
            raise ValueError(f"{op}: k_rows must be a 1-D integer tensor, got {k_rows.dtype} {tuple(k_rows.shape)}")
        if k_rows.numel() and (bool((k_rows < 0).any()) or int(k_rows.max()) >= k.shape[0]):
            raise ValueError(f"{op}: k_rows must hold rows of k, 0 <= row < {k.shape[0]} (pad with 0)")
        n_keys = k_rows.shape[0]
    if t and (bool((k_start < 0).any()) or bool((k_end < k_start).any()) or int(k_end.max()) > n_keys):
        raise ValueError(f"{op}: key ranges must satisfy 0 <= k_start <= k_end <= N = {n_keys}")
    if max_len is not None and t and int((k_end - k_start).max()) > max_len:
        raise ValueError(f"{op}: max_len={max_len} is below the widest key range "
                         f"{int((k_end - k_start).max())}")


def index_scores(q_t: torch.Tensor, keys: torch.Tensor, w_t: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 scores of one query against some keys: ``sum_h w[h] * ReLU(q[h] . k[s]) * scale``.

    q_t [Hi, Di], keys [n, Di], w_t [Hi] -> [n] fp32.
    """
    logits = q_t.float() @ keys.float().T                         # [Hi, n]
    return (torch.relu(logits) * scale * w_t.float()[:, None]).sum(dim=0)


def lightning_indexer(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                      k_end: torch.Tensor, *, topk: int, scale: float,
                      max_len: int | None = None, k_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k keys per query by the lightning-indexer score.

    Score of query t against key row s (fp32): ``I[t, s] = sum_h weights[t, h] * ReLU(q[t, h] .
    k[s]) * scale``, over the visible rows ``k_start[t] <= s < k_end[t]`` only. Row t of the
    output holds the ``n = min(topk, k_end[t] - k_start[t])`` visible rows with the highest
    scores as *absolute* row indices of ``k``, in descending score order (order among exactly
    equal scores unspecified), followed by ``topk - n`` entries of -1. Consumers must treat a row
    as a set: the conformance compare sorts each row (and accepts swaps between scores equal to
    ~1e-5 of the row's scale, since the sum's rounding depends on the order of accumulation).

    Args:
        q: [T, Hi, Di] float, the indexer queries (already roped).
        k: [N, Di] float, the keys; several sequences' keys may lie back to back.
        weights: [T, Hi] float, per-head weights (caller's scaling folded in).
        k_start, k_end: [T] int32, each query's visible key rows (absolute; empty when equal).
        topk: number of selections per query (output width). scale: multiplies every ReLU term.
        max_len: None, or a host-side upper bound of ``k_end - k_start`` (never below it): lets a
            kernel size its scratch without reading the ranges back from the device, as a
            CUDA-graph-captured decode needs. It does not change the result.
        k_rows: None, or [M] integer rows of ``k``: the keys are then ``k[k_rows]`` (key j is
            row ``k_rows[j]``), read in place, so a paged cache store serves as ``k`` without a
            gather. ``k_start`` / ``k_end`` and the returned indices then refer to these M keys.
            Every entry must be a row of k (pad unused ones with 0: rows outside every query's
            range are never scored).

    Returns: [T, topk] int32.

    DeepSeek-V4 CSA layers (MODELS.md §2.7; transformers ``DeepseekV4Indexer`` +
    ``DeepseekV4IndexerScorer``): keys = the indexer compressor's entries (``kv_compress`` at
    ``index_head_dim`` 128, ratio 4, overlap, RoPE on the *last* 64 dims at ``4w``); q =
    ``indexer.wq_b · qr`` reshaped [``index_n_heads`` 64, 128], roped at the token's position;
    ``weights = weights_proj(x) * index_n_heads^-0.5``; ``scale = index_head_dim^-0.5``;
    ``topk = index_topk`` (512); a query at position p sees its sequence's entries
    ``w < (p + 1) // 4`` (``k_end = seq_entry_offset + (p + 1) // 4``).
    GLM-5 DSA (``GlmMoeDsaIndexer``): keys are per-token ``LayerNorm(wk · x)`` (eps 1e-6, with
    bias) with RoPE on the *first* 64 dims (pairs (2i, 2i+1); transformers writes the rotated
    halves de-interleaved, the same permutation for q and k, so scores are unchanged); ``weights =
    weights_proj(x) * index_n_heads^-0.5`` (32 heads), ``scale = index_head_dim^-0.5`` (transformers
    applies it before the ReLU; the same for a positive scale), ``k_end = position + 1``, ``topk``
    2048. Engines (vLLM) fold ``scale * Hi^-0.5`` into the weights and pass ``scale = 1``.
    Ties: ReLU makes exact-zero scores common in random models (MODELS.md §9).
    """
    check_indexer_args(q, k, weights, k_start, k_end, topk, max_len=max_len, k_rows=k_rows)
    if k_rows is not None:
        k = k.index_select(0, k_rows.long())
    out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
    for t, (s0, s1) in enumerate(zip(k_start.tolist(), k_end.tolist())):
        if s1 <= s0:
            continue
        scores = index_scores(q[t], k[s0:s1], weights[t], scale)
        picked = torch.topk(scores, min(topk, s1 - s0)).indices
        out[t, : picked.numel()] = (picked + s0).to(torch.int32)
    return out


def compare_index_sets(out: torch.Tensor, ref: torch.Tensor, inputs: Inputs, tol: Tol) -> str | None:
    """Each row as a set: equal after sorting, or differing only between (near-)tied scores."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return compare_tensor(out, ref, EXACT)
    o, r = out.detach().cpu().long(), ref.detach().cpu().long()
    o_sorted, r_sorted = o.sort(dim=1).values, r.sort(dim=1).values
    if torch.equal(o_sorted, r_sorted):
        return None
    q, k, w = (inputs[n].detach().cpu() for n in ("q", "k", "weights"))
    if inputs.get("k_rows") is not None:
        k = k.index_select(0, inputs["k_rows"].detach().cpu().long())
    starts, ends = inputs["k_start"].tolist(), inputs["k_end"].tolist()
    for t in (o_sorted != r_sorted).any(dim=1).nonzero().flatten().tolist():
        s0, s1 = starts[t], ends[t]
        got, want = o[t][o[t] >= 0], r[t][r[t] >= 0]
        if got.numel() != want.numel():
            return f"row {t}: {got.numel()} selections {got.tolist()}, expected {want.numel()}: {want.tolist()}"
        if got.unique().numel() != got.numel():
            return f"row {t}: repeated selections in {got.tolist()}"
        if bool(((got < s0) | (got >= s1)).any()):
            return f"row {t}: selection {got.tolist()} outside its visible rows [{s0}, {s1})"
        scores = index_scores(q[t], k[s0:s1], w[t], inputs["scale"])
        slack = 1e-5 * float(scores.abs().max()) + 1e-30
        kth = float(scores[want - s0].min())
        worst = float(scores[got - s0].min())
        if worst < kth - slack:
            return (f"row {t}: selected a key scoring {worst:.7g} below the k-th best score {kth:.7g} "
                    f"(got {sorted(got.tolist())}, expected {sorted(want.tolist())})")
    return None


# ----------------------------------------------------------------------------------------------
# Cases. Tie-free by construction: positive weights, and q, k sharing a positive offset so most
# q.k are positive; with >= 16 heads every visible score is a distinct positive sum.


def _qkw(gen, t: int, n: int, heads: int, dim: int, dtype, device) -> Inputs:
    return {"q": randn(gen, t, heads, dim, dtype=torch.float32, device=device).add_(0.3).to(dtype),
            "k": randn(gen, n, dim, dtype=torch.float32, device=device).add_(0.3).to(dtype),
            "weights": uniform(gen, t, heads, lo=0.5, hi=1.5, dtype=dtype, device=device) * heads ** -0.5,
            "scale": dim ** -0.5}


def _dsv4_case(seq_lens: tuple[int, ...], heads: int, dim: int, topk: int, ratio: int = 4):
    """Prefill of packed sequences against their compressed entries (visible w < (p+1)//ratio)."""
    def make(gen, dtype, device):
        starts, ends, offset = [], [], 0
        for length in seq_lens:
            pos = torch.arange(length)
            starts.append(torch.full((length,), offset))
            ends.append(offset + (pos + 1) // ratio)
            offset += length // ratio
        inputs = _qkw(gen, sum(seq_lens), offset, heads, dim, dtype, device)
        inputs.update(k_start=torch.cat(starts).to(device, torch.int32),
                      k_end=torch.cat(ends).to(device, torch.int32), topk=topk)
        return inputs
    return make


def _dsa_case(prefix: int, chunk: int, heads: int, dim: int, topk: int):
    """GLM-5 DSA chunked prefill: per-token keys, query at position prefix+i sees keys 0..prefix+i."""
    def make(gen, dtype, device):
        inputs = _qkw(gen, chunk, prefix + chunk, heads, dim, dtype, device)
        inputs.update(k_start=torch.zeros(chunk, dtype=torch.int32, device=device),
                      k_end=torch.arange(prefix + 1, prefix + chunk + 1, dtype=torch.int32, device=device),
                      topk=topk)
        return inputs
    return make


def _decode_case(positions: tuple[int, ...], heads: int, dim: int, topk: int, ratio: int = 4):
    """One decode token per request; each request's entries back to back in k."""
    def make(gen, dtype, device):
        counts = [(p + 1) // ratio for p in positions]
        offsets = torch.tensor([0] + counts).cumsum(0)
        inputs = _qkw(gen, len(positions), int(offsets[-1]), heads, dim, dtype, device)
        inputs.update(k_start=offsets[:-1].to(device, torch.int32),
                      k_end=offsets[1:].to(device, torch.int32), topk=topk)
        return inputs
    return make


def _paged_decode_case(positions: tuple[int, ...], heads: int, dim: int, topk: int, ratio: int,
                       width: int):
    """Decode reading a paged store in place (``k_rows``): each request's entries lie in
    scattered store rows, listed at a fixed ``width`` per request (0-padded past its count),
    as a CUDA-graph decode lays them out."""
    def make(gen, dtype, device):
        counts = [(p + 1) // ratio for p in positions]
        store = 3 * len(positions) * width
        rows = torch.zeros(len(positions), width, dtype=torch.int64)
        perm = torch.randperm(store, generator=gen)
        for i, c in enumerate(counts):
            rows[i, :c] = perm[i * width:i * width + c]
        inputs = _qkw(gen, len(positions), store, heads, dim, dtype, device)
        start = torch.arange(len(positions)) * width
        inputs.update(k_start=start.to(device, torch.int32),
                      k_end=(start + torch.tensor(counts)).to(device, torch.int32), topk=topk,
                      max_len=width, k_rows=rows.flatten().to(device))
        return inputs
    return make


LIGHTNING_INDEXER = define_op(
    lightning_indexer,
    cases=[
        Case("dsv4_csa_prefill", _dsv4_case((96,), 16, 128, 8)),
        Case("dsv4_csa_two_seqs", _dsv4_case((40, 57), 16, 64, 6)),
        Case("dsv4_decode", _decode_case((3, 17, 64, 130, 255, 9), 16, 128, 16)),
        Case("paged_decode", _paged_decode_case((3, 17, 64, 130, 255, 9), 16, 128, 16, 4, 72)),
        # GLM-5 DSA decode over every cached token (ratio 1) of three requests.
        Case("paged_dsa_decode", _paged_decode_case((40, 199, 7), 32, 128, 64, 1, 208)),
        # 160 rows x 32 heads x 360 keys: large enough that chunked impls split the rows.
        Case("glm_dsa_chunk", _dsa_case(200, 160, 32, 128, 64)),
    ],
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT},
    compare=compare_index_sets,
)

__all__ = ["lightning_indexer", "check_indexer_args", "compare_index_sets", "index_scores"]
