"""DeepSeek-V4 attention: sliding window + compressed KV entries (+ lightning indexer), MODELS.md
§2.5-2.7, ENGINES.md §2.1-2.2.

Every layer attends, in one softmax with a per-head sink, the raw KV of the last ``sliding_window``
tokens and (CSA / HCA layers) the layer's compressed entries: one per complete window of ``m``
tokens (:class:`Compressor`). HCA layers see every completed entry; CSA layers only the
``index_topk`` the :class:`Indexer` picks. K = V is one 512-wide head with RoPE on its last
``qk_rope_head_dim`` channels, so the output is rotated back at the query position.

Cache per layer (all declared as :class:`CacheTensor`): ``swa`` a ring of ``sliding_window`` raw
KV rows per request; ``comp`` the compressed entries (per token, ratio m); ``comp_kv`` /
``comp_score`` the compressor's fp32 partial-window ring (``c*m`` rows); for CSA also ``idx`` (the
indexer keys, ratio m) and ``idx_kv`` / ``idx_score``. Decode reads everything through global
rows (``sparse_mla_decode`` on the ring plus the entry store); prefill and chunked prefill gather
the rows they need into one workspace for ``sparse_mla_prefill``. Nothing is ever recomputed.
Rings are indexed by position modulo their row count (read from the tensor): with speculative
decoding they carry spare rows, so rejected draft tokens need no undo.

Packed FP8 storage (``cache_specs(..., packed=True)``, the model's ``kv_format="fp8"``): ``swa``
and ``comp`` are then uint8 [.., 584] ``fp8_ds_mla`` rows (:mod:`hwinfer.ops.kv_pack`; D = 512,
64 RoPE channels). A packed row is exactly ``pack_fp8_ds_mla`` of the row the model-dtype cache
would hold. Every write packs (:func:`_to_store`; decode through the ``kv_store_fp8_ds_mla`` op,
one kernel a write), every read outside ``sparse_mla_decode`` unpacks (:func:`_from_store`), and
decode hands the uint8 caches to ``sparse_mla_decode``, which
dequantizes only the rows it gathers. Which storage a tensor has is read from its dtype, never
from a flag, so the code cannot disagree with the cache it is given. Every row a cached step
attends is the row as stored: prefill attends its new tokens' KV round-tripped through the
packed format, as decode (which reads its own row back from the ring) does, so outputs do not
depend on how a sequence is split into steps. The cache-less forward (``model(ids)``) stores
nothing and quantizes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor, fp8_indexer_row_bytes, fp8_v4_row_bytes
from hwinfer.layers.basic import Linear, RMSNorm
from hwinfer.ops.kv_pack import FP8_DS_BYTES, FP8_DS_DIM, pack_fp8_ds_mla, unpack_fp8_ds_mla
from hwinfer.runtime.batch import ForwardBatch, host_to_device

RopeTables = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class RopeSpec:
    """Interleaved RoPE on the last ``dim`` channels: ``base`` and optional YaRN ``scaling``."""

    dim: int
    base: float
    scaling: dict[str, Any] | None = None

    def tables(self, ops: OpTable, positions: torch.Tensor) -> RopeTables:
        return ops.rope_tables(positions, rotary_dim=self.dim, base=self.base, scaling=self.scaling)


@dataclass
class StepInfo:
    """What every layer needs about the step besides the batch (built once per forward)."""

    batch: ForwardBatch
    cached: bool
    requests: torch.Tensor          # [T] int64, batch-local request of each packed token
    ctx: list[int]                  # host: tokens already cached per request (0 without a cache)
    tables: dict[str, RopeTables]   # "main" / "compress": (cos, sin) [T, r/2] at token positions

    @property
    def new(self) -> list[int]:
        """Host: new tokens per request (only the cacheless forward reads them; a captured
        prefill cannot)."""
        return self.batch.new_lens

    @property
    def starts(self) -> list[int]:
        """Host: the first packed token of each request (cacheless forward only)."""
        return [0, *accumulate(self.new[:-1])]

    @property
    def decode(self) -> bool:
        return self.cached and self.batch.is_decode


def _to_store(rows: torch.Tensor, store: torch.Tensor) -> torch.Tensor:
    """rows [..., D] in the model dtype -> what ``store`` holds: packed uint8 [..., 584]
    (``fp8_ds_mla``) when ``store`` is uint8, else the rows cast to its dtype."""
    return pack_fp8_ds_mla(rows) if store.dtype == torch.uint8 else rows.to(store.dtype)


def _from_store(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Stored rows [..., 584] uint8 or [..., D] float -> [..., D] in ``dtype`` (exact unpack)."""
    return unpack_fp8_ds_mla(rows).to(dtype) if rows.dtype == torch.uint8 else rows.to(dtype)


def _exclusive_cumsum(counts: list[int], device: torch.device) -> torch.Tensor:
    """[N] int64 on ``device``: 0, c0, c0 + c1, ... summed on the host (no device read)."""
    return host_to_device(list(accumulate(counts, initial=0))[:-1], device)


class Compressor(nn.Module):
    """Per-window softmax pooling of ``wkv x`` gated by ``wgate x + ape`` -> RMSNorm -> RoPE at
    the window's first position (``kv_compress`` / ``kv_compress_step``). ``overlap`` (CSA):
    2*dim-wide projections, entry w pools window w-1's first half with window w's second half.
    Parameters: wkv, wgate [c*dim, H]; ape [m, c*dim] fp32; norm [dim]."""

    def __init__(self, ops: OpTable, hidden: int, dim: int, ratio: int, overlap: bool, rope: RopeSpec,
                 eps: float, dtype: torch.dtype, name: str) -> None:
        super().__init__()
        width = (2 if overlap else 1) * dim
        self.wkv = Linear(hidden, width, dtype=dtype)
        self.wgate = Linear(hidden, width, dtype=dtype)
        self.ape = nn.Parameter(torch.empty(ratio, width, dtype=torch.float32), requires_grad=False)
        self.norm = RMSNorm(ops, dim, eps)
        self.ops, self.dim, self.ratio, self.overlap, self.rope, self.eps = ops, dim, ratio, overlap, rope, eps
        self.name, self.rows = name, (2 if overlap else 1) * ratio

    def cache_specs(self, dtype: torch.dtype, spare_rows: int = 0, packed: bool = False) -> list[CacheTensor]:
        """``spare_rows``: room for that many rejected draft tokens (rounded up to m, the op
        wants R % m == 0), so their writes never clobber rows the next step still reads.
        ``packed``: store the entries as 584-byte ``fp8_ds_mla`` rows (the caller checked D)."""
        width, rows = self.ape.shape[1], self.rows + -(-spare_rows // self.ratio) * self.ratio
        # Deployed FP8 rows: entries as fp8_ds_mla, indexer keys ("idx") as e4m3 + fp32 scale.
        fp8 = fp8_indexer_row_bytes(self.dim) if self.name == "idx" else fp8_v4_row_bytes(self.dim, self.rope.dim)
        return [CacheTensor(self.name, "token", (self.dim,), dtype, ratio=self.ratio, fp8_row_bytes=fp8,
                            packed_bytes=FP8_DS_BYTES if packed else None),
                CacheTensor(f"{self.name}_kv", "ring", (width,), torch.float32, rows=rows),
                CacheTensor(f"{self.name}_score", "ring", (width,), torch.float32, rows=rows)]

    def counts(self, step: StepInfo) -> list[int]:
        """Completed entries per request after this step."""
        return [(c + n) // self.ratio for c, n in zip(step.ctx, step.new)]

    def entries(self, x: torch.Tensor, step: StepInfo, cache: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Compress the step's tokens; return every request's entries packed [K, dim] and each
        request's first row [N]. Without a cache: K = sum E_i, from the host counts. With one:
        read back from the store as stored (unpacked from a packed store, in x.dtype) through
        ``packed_entry_rows``, K the host's bound of that sum (rows past the device count are
        never indexed), so nothing is sized by the host's new-token counts."""
        new = self.update(x, step, cache)
        if cache is None:
            return new, _exclusive_cumsum(self.counts(step), x.device)
        rows, starts = step.batch.packed_entry_rows(self.ratio)
        got = cache[self.name].flatten(0, 1).index_select(0, rows)
        return _from_store(got, x.dtype), starts

    def update(self, x: torch.Tensor, step: StepInfo, cache: dict | None) -> torch.Tensor | None:
        """Without a cache: every request's entries, packed. With one: store the new entries and
        the ring state; returns None."""
        kv, score = self.wkv(x), self.wgate(x)
        if cache is not None and step.decode:
            # the op reads the projections in the model dtype (its math is fp32): no casts
            self._step(kv, score, step, cache, x.dtype)
            return None
        kv, score = kv.float(), score.float()
        if cache is None:
            parts = [self._pool(kv[s:s + n], score[s:s + n], 0) for s, n in zip(step.starts, step.new)]
            return torch.cat(parts).to(x.dtype)
        self._prefill_store(kv, score, step, cache, x.dtype)
        return None

    def _prefill_store(self, kv: torch.Tensor, score: torch.Tensor, step: StepInfo, cache: dict,
                       dtype: torch.dtype) -> None:
        """A cached prefill step, every request at once and from device values only (no host
        lengths, no loop over requests): kv, score fp32 [T, c*dim] of the step's tokens.

        Entry slots: a step of T tokens and N requests closes at most T // m + N windows.
        Slot k takes the k-th closing window of the step (request ``req``, entry ``e``); its
        window (and, with overlap, the one before: its Ca half) is gathered from the step's
        tokens or, for positions already cached, from the ring (which keeps every position an
        emission can still read; its logits hold ``ape``, taken off here since the pooling
        adds it). Positions before 0 (entry 0's Ca half) are absent: value 0, Ca logit -inf,
        weight exactly 0 as the op defines it. The windows pool in one ``kv_compress`` call
        (with overlap as pairs: the second entry of each pair is the slot's). A slot past the
        step's count repeats the last real slot's row and value (or, when no window closes,
        rewrites the row it points at with its own content), so one scatter writes every
        slot and repeated rows carry one value. Then the ring takes every token's row with the
        value of its request's last token on that row (``ring_sources``)."""
        ring_kv, ring_score = cache[f"{self.name}_kv"], cache[f"{self.name}_score"]
        b, m, ov = step.batch, self.ratio, int(self.overlap)
        rows, t = ring_kv.shape[1], kv.shape[0]
        # The same for every compressor of this ratio, overlap and ring size in the step (main
        # and indexer ones, every layer): built once.
        valid, req, e, p, at, dest = b.shared(("prefill_slots", m, ov, rows),
                                              lambda: self._prefill_slots(b, t, rows))
        rope = b.shared(("prefill_slot_rope", m, ov, self.rope.dim, self.rope.base,
                         repr(self.rope.scaling)),
                        lambda: self.rope.tables(self.ops, (e * m).repeat_interleave(1 + ov)))
        # One gather from the step's rows followed by each request's ring (row j of a ring
        # holds a position = j mod m, its logit with ape[j % m] taken off).
        slots = b.slots.long()
        src_kv = torch.cat((kv, ring_kv[slots].flatten(0, 1)))
        src_score = torch.cat((score, (ring_score[slots] - self.ape.repeat(rows // m, 1)).flatten(0, 1)))
        g_kv, g_score = src_kv[at], src_score[at]
        if ov:
            absent = (p < 0)[..., None]
            g_kv = g_kv.masked_fill(absent, 0.0)
            half = torch.arange(g_score.shape[-1], device=kv.device) < self.dim   # the Ca channels
            g_score = g_score.masked_fill(absent & half, float("-inf"))
        pooled = self.ops.kv_compress(g_kv.flatten(0, 1), g_score.flatten(0, 1), self.ape,
                                      self.norm.weight, ratio=m, overlap=self.overlap, eps=self.eps,
                                      rope=rope, rope_dim=self.rope.dim)
        store = cache[self.name].flatten(0, 1)
        fresh = _to_store(pooled[ov::1 + ov].to(dtype), store)
        store[dest] = torch.where(valid[:, None], fresh, store[dest])
        src, ring = b.ring_sources(rows), b.ring_rows(rows)
        ring_kv.flatten(0, 1)[ring] = kv[src]
        ring_score.flatten(0, 1)[ring] = score[src] + self.ape[b.positions % m]

    def _prefill_slots(self, b: ForwardBatch, t: int, rows: int) -> tuple[torch.Tensor, ...]:
        """The entry slots of a cached prefill step (see ``_prefill_store``): (valid [E], request
        [E], entry [E], window positions p [E, span], gather index [E, span] into the step's
        rows followed by every request's ring of ``rows`` rows, store row [E])."""
        m, ov, dev = self.ratio, int(self.overlap), b.positions.device
        cu, ctx = b.cu_seqlens.long(), b.context_lens.long()
        first = ctx // m                                   # each request's first closing entry
        count = (ctx + cu[1:] - cu[:-1]) // m - first
        cum = torch.cumsum(count, 0)
        total = cum[-1]
        k = torch.arange(t // m + b.num_requests, device=dev)
        k = torch.where(k < total, k, (total - 1).clamp(min=0))
        req = torch.searchsorted(cum, k, right=True).clamp(max=b.num_requests - 1)
        e = first[req] + k - (cum[req] - count[req])
        p = ((e - ov) * m)[:, None] + torch.arange((1 + ov) * m, device=dev)   # [E, span]
        ctx_e = ctx[req][:, None]
        at = torch.where(p >= ctx_e, (cu[:-1][req][:, None] + p - ctx_e).clamp(0, t - 1),
                         t + req[:, None] * rows + p % rows)
        return k < total, req, e, p, at, b.rows_for(e * m, req, m)

    def _pool(self, kv: torch.Tensor, score: torch.Tensor, first: int) -> torch.Tensor:
        """kv, score fp32 [L, c*dim] of positions first.. (first a multiple of m) -> [L // m, dim]."""
        pos = first + self.ratio * torch.arange(kv.shape[0] // self.ratio, device=kv.device)
        return self.ops.kv_compress(kv, score, self.ape, self.norm.weight, ratio=self.ratio,
                                    overlap=self.overlap, eps=self.eps, rope=self.rope.tables(self.ops, pos),
                                    rope_dim=self.rope.dim)

    def _step(self, kv: torch.Tensor, score: torch.Tensor, step: StepInfo, cache: dict, dtype: torch.dtype) -> None:
        """One token per request, in place: the op writes the token's ring row into the pool
        and, where a window closes, its entry into the store row of the window's first
        position. Which rows change is decided on the device (CUDA graphs). A packed store
        cannot take the op's float write: the op returns the step's candidate entries [B, D]
        and ``emitted`` [B] instead, and ``kv_store_fp8_ds_mla`` packs only the rows whose
        window closed (a device-side mask)."""
        b, m = step.batch, self.ratio

        def window_starts() -> tuple[torch.Tensor, torch.Tensor]:
            start = (b.positions // m) * m   # each request's current window (one token each)
            return start, b.rows_for(start, torch.arange(b.num_requests, device=kv.device), m)

        # Shared by every compressor of this ratio in the step (main and indexer ones).
        start, rows = b.shared(("window_start_rows", m), window_starts)
        rope = b.shared(("window_start_rope", m, self.rope.dim, self.rope.base,
                         repr(self.rope.scaling)), lambda: self.rope.tables(self.ops, start))
        store = cache[self.name].flatten(0, 1)
        packed = store.dtype == torch.uint8
        entries, emitted, _, _ = self.ops.kv_compress_step(
            kv, score, b.positions, cache[f"{self.name}_kv"], cache[f"{self.name}_score"], self.ape,
            self.norm.weight, ratio=m, overlap=self.overlap, eps=self.eps,
            rope=rope, rope_dim=self.rope.dim, state_slots=b.slots,
            entry_store=None if packed else store, entry_rows=None if packed else rows)
        if packed:  # one kernel packs the closed windows' entries into their rows
            self.ops.kv_store_fp8_ds_mla(entries.to(dtype), store, rows, emitted)


class Indexer(nn.Module):
    """Lightning indexer of CSA layers: its own overlapping compressor at ``index_head_dim``
    gives keys; queries ``wq_b · qr`` [Hi, Di] (compress RoPE); head weights ``weights_proj x``
    * Hi^-1/2; score ``sum_h w_h ReLU(q_h . k) * Di^-1/2``; top ``index_topk`` visible entries."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, ratio: int, rope: RopeSpec, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.heads, self.dim, self.topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
        self.wq_b = Linear(cfg["q_lora_rank"], self.heads * self.dim, dtype=dtype)
        self.weights_proj = Linear(h, self.heads, dtype=dtype)
        self.compressor = Compressor(ops, h, self.dim, ratio, True, rope, eps, dtype, "idx")
        self.ops, self.rope, self.ratio = ops, rope, ratio

    def forward(self, x: torch.Tensor, qr: torch.Tensor, step: StepInfo, cache: dict | None) -> torch.Tensor:
        """x [T, H] (normed block input), qr [T, q_lora] -> [T, topk] entry ids of the token's
        request (relative, -1 = none); in a cached decode step the picked entries' global rows
        in the paged entry stores instead (every store of this ratio shares its row layout)."""
        t = x.shape[0]
        cos, sin = step.tables["compress"]
        q = self.ops.apply_rope(self.wq_b(qr).view(t, self.heads, self.dim), cos, sin,
                                start=self.dim - self.rope.dim, interleaved=True)
        # transformers scales these by heads^-0.5 in fp32. The indexer returns only the order of
        # its scores, which one positive factor a query does not change (for 64 heads, 1/8,
        # not even by rounding), and it reads the weights in fp32 itself: no cast, no product.
        weights = self.weights_proj(x)
        b, m = step.batch, self.ratio
        if cache is not None and not step.decode:
            # Prefill: score the entry store in place through the packed entry rows.
            self.compressor.update(x, step, cache)
            keys = cache[self.compressor.name].flatten(0, 1)
            rows, starts = b.packed_entry_rows(m)
            base, base32, end32 = self._ranges(starts, step)
        elif cache is not None:
            # Decode: through every request's entry rows at the batch's length bound (fixed
            # width, no host value: CUDA graphs); padding rows -> 0.
            self.compressor.update(x, step, cache)
            keys = cache[self.compressor.name].flatten(0, 1)

            def ranges() -> tuple[torch.Tensor, ...]:
                starts = torch.arange(b.num_requests, device=x.device) * (b.seq_len_bound // m)
                return self._ranges(starts, step)

            # The same for every indexer of this ratio in the step.
            base, base32, end32 = b.shared(("indexer_ranges", m), ranges)
            pick_rows = b.pick_rows(m, ops=self.ops)
            rows = pick_rows[:-1]
        else:
            keys, starts = self.compressor.entries(x, step, cache)
            rows, (base, base32, end32) = None, self._ranges(starts, step)
        # A host-side bound of the visible entries, so kernels size their scratch without a sync.
        bound = b.seq_len_bound // m
        picks = self.ops.lightning_indexer(q, keys.to(q.dtype), weights, base32, end32,
                                           topk=self.topk, scale=self.dim ** -0.5,
                                           max_len=bound, k_rows=rows)
        if rows is not None and step.decode:   # the picked entries' global rows in the stores
            return pick_rows[picks]
        # Prefill: entry ids relative to the request (the layer's entries come in the same
        # packed layout, Compressor.entries).
        return torch.where(picks >= 0, picks.long() - base[:, None], -1)

    def _ranges(self, starts: torch.Tensor, step: StepInfo) -> tuple[torch.Tensor, ...]:
        """Every token's first key (its request's start) and end of visible entries:
        (base int64, base int32, end int32), [T] each."""
        base = starts[step.requests]
        end = base + (step.batch.positions + 1) // self.ratio
        return base, base.to(torch.int32), end.to(torch.int32)


class DeepseekV4Attention(nn.Module):
    """x [T, H] (``attn_norm``-ed) -> [T, H]. ``ratio`` 0: sliding window only; with ``indexer``
    (CSA) the indexer picks the entries; otherwise (HCA) all completed entries are attended.
    Parameters (checkpoint ``attn.*``): wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink,
    compressor.*, indexer.*."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype, *, ratio: int,
                 indexer: bool, rope: RopeSpec, rope_key: str) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.heads, self.head_dim = cfg["num_attention_heads"], cfg["head_dim"]
        self.groups, self.window = cfg["o_groups"], cfg["sliding_window"]
        q_lora, o_lora = cfg["q_lora_rank"], cfg["o_lora_rank"]
        self.wq_a = Linear(h, q_lora, dtype=dtype)
        self.q_norm = RMSNorm(ops, q_lora, eps)
        self.wq_b = Linear(q_lora, self.heads * self.head_dim, dtype=dtype)
        self.wkv = Linear(h, self.head_dim, dtype=dtype)
        self.kv_norm = RMSNorm(ops, self.head_dim, eps)
        self.wo_a = Linear(self.heads * self.head_dim // self.groups, self.groups * o_lora, dtype=dtype)
        self.wo_b = Linear(self.groups * o_lora, h, dtype=dtype)
        self.attn_sink = nn.Parameter(torch.empty(self.heads, dtype=torch.float32), requires_grad=False)
        # CSA (the layers with an indexer) compresses overlapping windows; HCA disjoint ones.
        self.compressor = Compressor(ops, h, self.head_dim, ratio, indexer, rope, eps, dtype, "comp") \
            if ratio else None
        self.indexer = Indexer(cfg, ops, ratio, rope, dtype) if indexer else None
        self.ops, self.rope, self.rope_key, self.eps, self.ratio = ops, rope, rope_key, eps, ratio

    @property
    def packs_fp8(self) -> bool:
        """Can ``swa`` / ``comp`` be stored as ``fp8_ds_mla`` rows? Its layout is fixed: D = 512
        with the RoPE on the last 64 channels (every released V4)."""
        return self.head_dim == FP8_DS_DIM and fp8_v4_row_bytes(self.head_dim, self.rope.dim) == FP8_DS_BYTES

    def cache_specs(self, dtype: torch.dtype, spare_rows: int = 0, packed: bool = False) -> list[CacheTensor]:
        """``spare_rows`` > 0 (speculative decoding): every ring gets room for that many rejected
        draft tokens (ENGINES.md §3.4); the layer reads ring sizes from the tensors. ``packed``:
        ``swa`` and ``comp`` stored as uint8 [.., 584] ``fp8_ds_mla`` rows (module docstring);
        the compressor state stays fp32 and the indexer keys ``idx`` keep ``dtype``: their FP8
        format is another one (e4m3 + one fp32 scale per 128, 132 B), not implemented."""
        if packed and not self.packs_fp8:
            raise ValueError(f"fp8_ds_mla storage needs head_dim {FP8_DS_DIM} with 64 RoPE channels, this layer "
                             f"has head_dim {self.head_dim} and {self.rope.dim}")
        specs = [CacheTensor("swa", "ring", (self.head_dim,), dtype, rows=self.window + spare_rows,
                             fp8_row_bytes=fp8_v4_row_bytes(self.head_dim, self.rope.dim),
                             packed_bytes=FP8_DS_BYTES if packed else None)]
        if self.compressor is not None:
            specs += self.compressor.cache_specs(dtype, spare_rows, packed)
        if self.indexer is not None:
            specs += self.indexer.compressor.cache_specs(dtype, spare_rows)
        return specs

    def decode_entries(self, context: int) -> int:
        """KV rows one decode step attends with ``context`` tokens cached: the window, plus every
        completed entry (HCA) or the indexer's top ``index_topk`` of them (CSA)."""
        entries = context // self.ratio if self.ratio else 0
        if self.indexer is not None:
            entries = min(entries, self.indexer.topk)
        return min(self.window, context) + entries

    def forward(self, x: torch.Tensor, step: StepInfo, cache: dict | None) -> torch.Tensor:
        ops, t, start = self.ops, x.shape[0], self.head_dim - self.rope.dim
        cos, sin = step.tables[self.rope_key]
        qr = self.q_norm(self.wq_a(x))
        q = ops.rms_norm(self.wq_b(qr).view(t, self.heads, self.head_dim), None, eps=self.eps)
        q = ops.apply_rope(q, cos, sin, start=start, interleaved=True)
        kv = ops.apply_rope(self.kv_norm(self.wkv(x)), cos, sin, start=start, interleaved=True)
        picks = self.indexer(x, qr, step, cache) if self.indexer is not None else None
        if step.decode:
            o = self._decode(q, kv, x, picks, step, cache)
        else:
            o = self._prefill(q, kv, x, picks, step, cache)
        # Grouped output projection: group j of heads through rows j*o_lora.. of wo_a.
        w = self.wo_a.weight.view(self.groups, -1, self.wo_a.weight.shape[1])
        y = torch.einsum("tgk,gok->tgo", o.reshape(t, self.groups, -1), w)
        return self.wo_b(y.reshape(t, -1))

    def _window(self, pos: torch.Tensor) -> torch.Tensor:
        """[T, W] positions p-W+1 .. p of each token's window (negative before the start)."""
        return pos[:, None] - self.window + 1 + torch.arange(self.window, device=pos.device)

    def _prefill(self, q: torch.Tensor, kv: torch.Tensor, x: torch.Tensor, picks: torch.Tensor | None,
                 step: StepInfo, cache: dict | None) -> torch.Tensor:
        """Workspace rows: W - 1 rows a request for its cached window (from the ring; rows
        before position 0 are gathered but never indexed), the step's new KV, then every
        request's compressed entries. Index lists point into it. Everything is sized by the
        step's token and request counts, not by the host's new-token counts (captured
        prefills)."""
        b, w, dev = step.batch, self.window, x.device
        req, pos = step.requests, b.positions
        n, t = b.num_requests, kv.shape[0]
        stored = None
        if cache is not None:
            stored = _to_store(kv, cache["swa"])
            if stored.dtype == torch.uint8:
                # Attend the new rows as stored, as decode does (it reads its own row back from
                # the ring): the output then does not depend on how a sequence was split into
                # steps (prefill chunks, speculative verifies).
                kv = _from_store(stored, kv.dtype)
        win = self._window(pos)                                    # [T, W] positions
        ctx = b.context_lens.long() if cache is not None else torch.zeros(n, dtype=torch.long, device=dev)
        ctx_t, first = ctx[req][:, None], b.cu_seqlens.long()[:-1][req][:, None]
        held = w - 1 if cache is not None else 0                   # cached window rows a request
        fresh = n * held + first + win - ctx_t                     # rows of the step's tokens
        idx = torch.where(win >= ctx_t, fresh, req[:, None] * held + win - (ctx_t - held))
        idx = torch.where(win >= 0, idx, -1)
        rows = kv
        if cache is not None:
            r = cache["swa"].shape[1]
            p = (ctx[:, None] - held + torch.arange(held, device=dev)).clamp(min=0)   # [N, W-1]
            ring = cache["swa"][b.slots.long()[:, None], p % r].flatten(0, 1)
            rows = torch.cat((_from_store(ring, kv.dtype), kv))
            # Every token writes its ring row with the value of its request's last token on
            # that row (one value a row; after the gather above, which reads the old rows).
            cache["swa"].flatten(0, 1)[b.ring_rows(r)] = stored[b.ring_sources(r)]
        if self.compressor is not None:
            entries, starts = self.compressor.entries(x, step, cache)
            base = rows.shape[0] + starts[req]
            if picks is not None:
                comp = torch.where(picks >= 0, base[:, None] + picks, -1)
            else:
                width = b.seq_len_bound // self.ratio if cache is not None else max(self.compressor.counts(step))
                e = torch.arange(width, device=dev)
                comp = torch.where(e[None] < ((pos + 1) // self.ratio)[:, None], base[:, None] + e, -1)
            rows, idx = torch.cat((rows, entries.to(rows.dtype))), torch.cat((idx, comp), dim=1)
        cos, sin = step.tables[self.rope_key]
        return self.ops.sparse_mla_prefill(q, rows, idx, self.attn_sink, scale=self.head_dim ** -0.5,
                                           out_rope=(cos, sin))

    def _decode(self, q: torch.Tensor, kv: torch.Tensor, x: torch.Tensor, picks: torch.Tensor | None,
                step: StepInfo, cache: dict) -> torch.Tensor:
        """One token per request: the window through global slots of the ring [slots, W, D], the
        entries through global rows of the paged store, in one ``sparse_mla_decode`` (which
        takes the packed uint8 [.., 584] ring and store as they are)."""
        b, ring = step.batch, cache["swa"]
        r = ring.shape[1]

        def window_rows() -> torch.Tensor:
            win = self._window(b.positions)
            return torch.where(win >= 0, b.slots[:, None] * r + win % r, -1)

        # The new token's ring row and its window's rows: the same in every layer of this ring
        # size and window, built once a step.
        new_row = b.ring_rows(r)
        idx = b.shared(("ring_window_rows", r, self.window), window_rows)
        if ring.dtype == torch.uint8:
            self.ops.kv_store_fp8_ds_mla(kv, ring, new_row)
        else:
            ring.view(-1, ring.shape[-1])[new_row] = kv.to(ring.dtype)
        extra = extra_idx = None
        if self.compressor is not None:
            self.compressor.update(x, step, cache)
            extra = cache["comp"]
            # CSA: the indexer's picks, already store rows in decode; HCA: every completed entry
            extra_idx = picks if picks is not None else b.entry_rows(self.ratio, self.ops)
            extra_idx = extra_idx[:, None]
        cos, sin = step.tables[self.rope_key]
        out = self.ops.sparse_mla_decode(q[:, None], ring, idx[:, None], self.attn_sink, scale=self.head_dim ** -0.5,
                                         out_rope=(cos[:, None], sin[:, None]), extra_kv_cache=extra,
                                         extra_indices=extra_idx)
        return out[:, 0]
