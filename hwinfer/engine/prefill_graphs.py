"""Prefill steps of one new request replayed from CUDA graphs.

A batch-1 prefill of a small model is host-bound: Qwen3.5-0.8B's 1 x 1,024 step launched ~650
kernels with 6 ms of GPU work in a 56 ms step on the H200 (docs/engine.md, fifteenth
session). :class:`PrefillGraphs` captures the forward (and the lm_head of the last token) of a
step that prefills one request from position 0, once per token bucket (128, 256, ... up to the
step's token budget), and replays it: one launch per step.

A request of L tokens runs in the smallest bucket T >= L as two packed sequences: its own L
tokens, then T - L padding tokens that form a second sequence in the pool's padding slot and
block (``CachePool(padding=True)``): they never attend to or mix with the request's tokens
(every op keeps sequences apart) and write only padding rows. Everything the graph reads lives
in static buffers written by one host-to-device copy per step: token ids, positions, each
token's sequence and cache row, the sequence bounds [0, L, T], the slots, the row to take the
logits from.

What the layers see must hold on every replay, and the new-token counts do not (L changes within
a bucket). The batch therefore carries them as :class:`UnfixedLengths`, which fails when read:
a layer that sizes or indexes anything from the host lengths (a sliding-window ring, a prefix
gather) makes the warm-up raise, and graphs are disabled with that reason instead of replaying
a wrong value. The sequence bounds an op reads on the host (``cu_seqlens_host``) are the
device's here: the Triton impls read them there; an impl that copies them to the host syncs,
which the warm-up (under torch's sync debug mode "error") also turns into a reason.

Models opt in with ``graph_prefill = True``; the engine uses it by default on CUDA
(``Engine(prefill_graphs=...)``). Off CUDA the same fixed-size path runs eagerly when asked,
which is how the padding logic is tested without a GPU. On the H200 (2026-12-05) it took
Qwen3.5-0.8B's 1 x 1,024 prefill from 24,472 to 131,086 tok/s and Kimi-Linear's (4 layers)
from 64,928 to 113,640 (docs/engine.md, seventeenth session).
"""
from __future__ import annotations

import logging

import torch

from hwinfer.engine.graphs import Alternating, NotCapturable, _where, capture
from hwinfer.engine.pool import CachePool
from hwinfer.engine.request import Request
from hwinfer.runtime.batch import ForwardBatch

log = logging.getLogger("hwinfer.engine")


def bucket_sizes(max_tokens: int, smallest: int = 128) -> list[int]:
    """Token buckets: powers of two from ``smallest`` up to ``max_tokens`` (and it)."""
    sizes, size = [], smallest
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return sizes + [max_tokens]


class UnfixedLengths:
    """The new-token counts of a graph-captured prefill: how many sequences there are is fixed
    (``len``), their lengths change between replays, so reading them raises (not a list
    subclass: C code such as ``torch.tensor`` reads a list's items without ``__getitem__``)."""

    def __init__(self, count: int) -> None:
        self._count = count

    def __len__(self) -> int:
        return self._count

    def _refuse(self, *_):
        raise RuntimeError("a graph-captured prefill cannot read the host's new-token counts "
                           "(they change between replays)")

    __iter__ = __getitem__ = __reversed__ = __eq__ = _refuse
    __hash__ = None


class PrefillGraphs:
    """Prefill forwards of one request from position 0, up to ``max_tokens`` tokens.

    ``run(req, n)`` -> fp32 logits [1, V] of the request's next token (or [0, V] when the prompt
    goes on past this step), with the request's first ``n`` tokens written to the cache exactly
    as the eager step would write them.
    """

    def __init__(self, model, pool: CachePool, *, max_tokens: int) -> None:
        if pool.pad_slot is None:
            raise ValueError("PrefillGraphs needs a CachePool built with padding=True")
        self.model, self.pool = model, pool
        device = model.device
        self.sizes = bucket_sizes(max_tokens)
        self.width = pool.blocks_for(self.sizes[-1])
        self.capture = device.type == "cuda"
        self.disabled: str | None = None
        size = self.sizes[-1]
        # Host-written inputs, one pinned copy each a step. ``_longs`` rows: token id, position,
        # sequence (0 the request, 1 padding), cache row, then [slot, padding slot, the row
        # whose logits are taken]; ``_ints``: bounds [0, L, T], lengths [L, T - L], the block
        # table's two rows (the request's blocks, the padding block).
        # Two pinned staging sets, alternating: a step's asynchronous copy may still be queued
        # when the host writes the next step's inputs (a step that samples nothing reads
        # nothing back, so nothing waits for it).
        self._staging = Alternating(lambda: (
            torch.empty(4 * size + 3, dtype=torch.int64, pin_memory=self.capture),
            torch.empty(5 + 2 * self.width, dtype=torch.int32, pin_memory=self.capture)))
        self._longs = torch.zeros(4 * size + 3, dtype=torch.int64, device=device)
        self._ints = torch.zeros(5 + 2 * self.width, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}
        self._mempool = None
        self.replays = 0  # steps served by this path

    # --- which steps qualify ---------------------------------------------------------------
    def fits(self, scheduled: list[tuple[Request, int]]) -> bool:
        """One request prefilling from position 0, at most the largest bucket of tokens."""
        if self.disabled is not None or len(scheduled) != 1:
            return False
        req, n = scheduled[0]
        return req.num_computed == 0 and 0 < n <= self.sizes[-1] and len(req.blocks) <= self.width

    # --- one step ----------------------------------------------------------------------------
    def run(self, req: Request, n: int) -> torch.Tensor | None:
        """Logits of the step (see the class docstring), or None when graphs just got disabled
        (run it eagerly)."""
        size = next(s for s in self.sizes if s >= n)
        # Capture first: it runs on padding inputs, and the step's own are written after it.
        if size not in self.graphs and not self._capture(size):
            return None
        self._write_inputs(size, n, req.tokens(0, n), req.slot, req.blocks)
        self.replays += 1
        graph, logits = self.graphs[size]
        if graph is None:  # not CUDA: the same fixed-size step, run eagerly
            logits = self._forward(size)
        else:
            graph.replay()
        return logits if req.num_pending == n else logits[:0]

    def _write_inputs(self, size: int, n: int, ids: list[int], slot: int, blocks: list[int]) -> None:
        """The static inputs of a step: the request's ``n`` tokens ``ids`` (slot, cache blocks),
        then ``size - n`` padding tokens in the padding slot and block."""
        bs, pad, top = self.pool.block_size, self.pool.pad_block, self.sizes[-1]
        longs, ints = self._staging.next()
        pos = torch.arange(size)
        pos[n:] -= n
        table = torch.tensor(blocks, dtype=torch.int64)
        ids_row, pos_row, seq_row, rows_row = longs[:4 * top].view(4, top)[:, :size]
        ids_row[:n] = torch.tensor(ids, dtype=torch.int64)
        ids_row[n:] = 0
        pos_row.copy_(pos)
        seq_row[:n], seq_row[n:] = 0, 1
        rows_row[:n] = table[pos[:n] // bs] * bs + pos[:n] % bs
        rows_row[n:] = pad * bs + pos[n:] % bs
        longs[4 * top:] = torch.tensor([slot, self.pool.pad_slot, n - 1])
        ints[:5] = torch.tensor([0, n, size, n, size - n], dtype=torch.int32)
        rows = ints[5:].view(2, self.width)
        rows.fill_(pad)
        rows[0, :len(blocks)] = table.to(torch.int32)
        self._longs.copy_(longs, non_blocking=self.capture)
        self._ints.copy_(ints, non_blocking=self.capture)

    def _batch(self, size: int) -> ForwardBatch:
        top = self.sizes[-1]
        ids, pos, seq, rows = self._longs[:4 * top].view(4, top)[:, :size]
        slots = self._longs[4 * top:4 * top + 2]
        cu, lens = self._ints[:3], self._ints[3:5]
        table = self._ints[5:].view(2, self.width)
        batch = ForwardBatch(ids, pos, cu, lens, self.pool.cache, slots, table,
                             new_lens=UnfixedLengths(2), context_lens_host=[0, 0],
                             token_requests=seq, max_seq_len=size)
        # What ForwardBatch would build from the host lengths, from the static buffers instead.
        batch.scratch[("token_rows", 1)] = rows
        batch.scratch[("cu_seqlens_host",)] = cu
        batch.scratch[("cu_seqlens_k_host",)] = cu
        return batch

    def _forward(self, size: int) -> torch.Tensor:
        hidden = self.model.forward_batch(self._batch(size))
        last = self._longs[4 * self.sizes[-1] + 2:]
        return self.model.logits(hidden.index_select(0, last))

    # --- capture -----------------------------------------------------------------------------
    def _capture(self, size: int) -> bool:
        """Warm up (compiling kernels; syncs are errors), then capture; False (``disabled``
        says why) if the prefill forward cannot be captured. At capture both sequences are
        padding (half the bucket each), so no request's cache or state is touched."""
        self._write_inputs(size, size // 2, [0] * (size // 2), self.pool.pad_slot,
                           [self.pool.pad_block] * self.width)
        if not self.capture:
            try:
                self._forward(size)
            except RuntimeError as err:
                return self._disable(f"the prefill forward reads host values ({err}) at {_where(err)}")
            self.graphs[size] = (None, None)
            return True
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        try:
            self.graphs[size] = capture(lambda: self._forward(size), self._mempool, "prefill forward")
        except NotCapturable as err:
            return self._disable(str(err))
        return True

    def _disable(self, reason: str) -> bool:
        self.disabled = reason
        log.warning("prefill CUDA graphs off: %s", reason)
        return False
