"""Paged-KV-cache attention contract (decode and speculative verification).

Declared by :mod:`hwinfer.ops.attention` (which imports this module), family ``attention``;
masking rule, window and sink semantics are those of that module's docstring.
"""
from __future__ import annotations

import math

import torch

from hwinfer.ops.attention import DTYPES, TOL, _rank, attend, check_extras, check_heads
from hwinfer.ops.contract import Case, define_op, randn


def check_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
                block_table: torch.Tensor, seq_lens: torch.Tensor, window: int | None,
                sinks: torch.Tensor | None, gate: torch.Tensor | None) -> list[int]:
    """Validate :func:`paged_attention`'s inputs (except block ids); return seq_lens as a list."""
    op = "paged_attention"
    _rank(q, 4, "q", "[B, Sq, Hq, Dk]", op)
    _rank(k_cache, 4, "k_cache", "[num_blocks, block_size, Hkv, Dk]", op)
    if v_cache is not None:
        _rank(v_cache, 4, "v_cache", "[num_blocks, block_size, Hkv, Dv]", op)
        if v_cache.shape[:3] != k_cache.shape[:3]:
            raise ValueError(f"{op}: v_cache {tuple(v_cache.shape)} and k_cache "
                             f"{tuple(k_cache.shape)} differ in [num_blocks, block_size, Hkv]")
    _rank(block_table, 2, "block_table", "[B, max_blocks]", op)
    _rank(seq_lens, 1, "seq_lens", "[B]", op)
    b, sq, hq, dk = q.shape
    if k_cache.shape[3] != dk:
        raise ValueError(f"{op}: q head dim {dk} != k_cache head dim {k_cache.shape[3]}")
    check_heads(hq, k_cache.shape[2], op)
    if block_table.is_floating_point() or seq_lens.is_floating_point():
        raise ValueError(f"{op}: block_table and seq_lens must be integer (int32) tensors")
    if block_table.shape[0] != b or seq_lens.shape[0] != b:
        raise ValueError(f"{op}: batch {b} but block_table has {block_table.shape[0]} rows and "
                         f"seq_lens {seq_lens.shape[0]} entries")
    dv = (v_cache if v_cache is not None else k_cache).shape[3]
    check_extras(op, hq, (b, sq, hq, dv), window, sinks, gate)
    lens = [int(x) for x in seq_lens.tolist()]
    capacity = block_table.shape[1] * k_cache.shape[1]
    for i, n in enumerate(lens):
        if n < sq or n > capacity:
            raise ValueError(f"{op}: seq_lens[{i}] = {n} must lie in [Sq={sq}, max_blocks * "
                             f"block_size = {capacity}] (it counts the Sq new tokens)")
    return lens


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
                    window: int | None = None, sinks: torch.Tensor | None = None,
                    gate: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a few new tokens per sequence over a paged KV cache.

    Sequence ``b`` holds ``L = seq_lens[b]`` tokens, *including* its ``Sq`` new ones, whose K/V
    the caller has already written to the cache. Query ``j`` (0 <= j < Sq) sits at position
    ``L - Sq + j`` and sees positions ``<= L - Sq + j`` (and, with ``window=W``, ``>= L - Sq + j
    - W + 1``); Sq = 1 is decode, Sq > 1 speculative verification / MTP drafts. Token position
    ``p`` of sequence ``b`` lives at ``k_cache[block_table[b, p // block_size], p %
    block_size]``. The math per query equals :func:`hwinfer.ops.attention.attention` on the same
    keys gathered contiguously (bottom-right causal), with the same window / sinks / gate.

    Only the block_table entries covering positions some query can see are read: entries past
    ``ceil(L / block_size)``, and with a window the entries whose blocks lie entirely before the
    first query's window (vLLM frees those and points them at a null block), may hold any value
    (-1, 0, out-of-range ids) and must never be dereferenced. Cache slots at positions >= L
    (the unwritten tail of the last block) may hold anything, NaN included (caches are allocated
    uninitialised): they must not influence the output, not even as ``0 * NaN``.

    Args:
      q: [B, Sq, Hq, Dk] float.
      k_cache: [num_blocks, block_size, Hkv, Dk]; Hq % Hkv == 0 (GQA, head h reads h // (Hq/Hkv)).
      v_cache: [num_blocks, block_size, Hkv, Dv] or None (V = K, DeepSeek-V4 shared KV).
      block_table: [B, max_blocks] int32 block ids.
      seq_lens: [B] int32, Sq <= seq_lens[b] <= max_blocks * block_size.
      scale: logit multiplier (see ``attention``).
      window: sliding window W >= 1 (Gemma 4 sliding layers, DeepSeek-V4 SWA).
      sinks: [Hq] per-head sink logits (fp32 use), unscaled (DeepSeek-V4, HY4).
      gate: [B, Sq, Hq, Dv]; output multiplied by sigmoid(gate) (Qwen3.5, HY4).

    Returns [B, Sq, Hq, Dv] in q.dtype (fp32 math).
    """
    lens = check_paged(q, k_cache, v_cache, block_table, seq_lens, window, sinks, gate)
    v_cache = k_cache if v_cache is None else v_cache
    num_blocks, block_size = k_cache.shape[:2]
    b_count, sq = q.shape[:2]
    outs = []
    for b in range(b_count):
        n = lens[b]
        first = n - sq
        start = 0 if window is None else max(0, first - window + 1)
        pos = torch.arange(start, n, device=q.device)
        blocks = block_table[b].long()[pos // block_size]
        if blocks.numel() and (blocks.min() < 0 or blocks.max() >= num_blocks):
            raise ValueError(f"paged_attention: block_table[{b}] holds ids outside [0, {num_blocks}) "
                             f"for positions {start}..{n - 1}")
        offs = pos % block_size
        k = k_cache[blocks, offs]
        v = v_cache[blocks, offs]
        q_pos = torch.arange(first, n, device=q.device)
        outs.append(attend(q[b], k, v, q_pos, pos, scale=scale, causal=True, window=window,
                           sinks=sinks))
    dv = v_cache.shape[3]
    out = torch.stack(outs) if outs else torch.zeros(0, sq, q.shape[2], dv, device=q.device)
    if gate is not None:
        out = out * torch.sigmoid(gate.float())
    return out.to(q.dtype)


def _paged_case(seq_lens: list[int], sq: int, hq: int, hkv: int, dk: int, dv: int | None,
                block_size: int, *, window: int | None = None, sinks: bool = False,
                gate: bool = False, unused: str = "neg"):
    """Random data in every cache slot, except NaN in the slots past each sequence's end in its
    last block (an uninitialised cache may hold NaN there: an impl must not let 0 * NaN reach the
    output); each sequence's blocks are a random permutation slice; block_table entries no query
    may read are -1 (``unused="neg"``) or out-of-range ids (``unused="big"``)."""
    def make(gen, dtype, device):
        needed = [math.ceil(n / block_size) for n in seq_lens]
        num_blocks = sum(needed) + 3
        max_blocks = max(needed) + 1
        perm = torch.randperm(num_blocks, generator=gen)
        fill = -1 if unused == "neg" else num_blocks + 5
        table = torch.full((len(seq_lens), max_blocks), fill, dtype=torch.int32)
        used = 0
        for b, n in enumerate(seq_lens):
            table[b, :needed[b]] = perm[used:used + needed[b]].to(torch.int32)
            used += needed[b]
            if window is not None:
                first_visible = max(0, n - sq - window + 1)
                table[b, :first_visible // block_size] = fill
        k_cache = randn(gen, num_blocks, block_size, hkv, dk, dtype=torch.float32, device="cpu")
        v_cache = None if dv is None else randn(gen, num_blocks, block_size, hkv, dv,
                                                dtype=torch.float32, device="cpu")
        for b, n in enumerate(seq_lens):
            last = int(table[b, (n - 1) // block_size])
            for cache in (k_cache, v_cache):
                if cache is not None:
                    cache[last, (n - 1) % block_size + 1:] = float("nan")
        inputs = {
            "q": randn(gen, len(seq_lens), sq, hq, dk, dtype=dtype, device=device),
            "k_cache": k_cache.to(device=device, dtype=dtype),
            "v_cache": None if v_cache is None else v_cache.to(device=device, dtype=dtype),
            "block_table": table.to(device),
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device),
            "scale": 1.0 / math.sqrt(dk),
            "window": window,
        }
        if sinks:
            inputs["sinks"] = randn(gen, hq, dtype=torch.float32, device=device, scale=2.0)
        if gate:
            inputs["gate"] = randn(gen, len(seq_lens), sq, hq, dv or dk, dtype=dtype,
                                   device=device, scale=2.0)
        return inputs
    return make


PAGED_ATTENTION = define_op(
    paged_attention,
    family="attention",
    cases=[
        # Qwen3.5-like (head_dim 256 scaled to 64), ragged lengths incl. a 1-token sequence.
        Case("decode_bs16_gqa4", _paged_case([1, 17, 40, 33], 1, 8, 2, 64, 64, 16)),
        Case("decode_bs64_gqa8", _paged_case([65, 130, 7], 1, 16, 2, 64, 64, 64, unused="big")),
        Case("decode_mha_gqa1", _paged_case([23, 48], 1, 4, 4, 32, 32, 16)),
        Case("decode_window24", _paged_case([100, 37, 5, 64], 1, 4, 2, 32, 32, 16, window=24)),
        # DeepSeek-V4 sliding layer decode: shared K = V latent, one kv head, sinks, window.
        Case("dsv4_swa_sinks_kv_shared", _paged_case([90, 12], 1, 8, 1, 64, None, 16, window=32,
                                                      sinks=True, unused="big")),
        # MLA absorbed decode at a width that is not a multiple of 16 (latent 32 + rope 8).
        Case("mla_absorbed_dim40", _paged_case([30, 7], 1, 4, 1, 40, None, 16)),
        Case("dk24_dv40", _paged_case([19, 52], 1, 4, 2, 24, 40, 16)),
        Case("qwen35_gated", _paged_case([50, 3, 29], 1, 8, 2, 64, 64, 16, gate=True)),
        # Speculative verification: 3 new tokens per sequence attend causally among themselves.
        Case("spec_verify_sq3", _paged_case([3, 20, 70], 3, 8, 2, 64, 64, 16)),
        Case("spec_verify_sq3_window_sinks", _paged_case([45, 9], 3, 4, 1, 32, 32, 16, window=10,
                                                         sinks=True, gate=True)),
    ],
    tolerance=TOL,
    dtypes=DTYPES,
)
