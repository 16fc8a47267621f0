"""Decode steps replayed from CUDA graphs.

A decode step (every request adds one token) launches hundreds of small kernels; at small batch
the GPU finishes them faster than the host can launch them. :class:`DecodeGraphs` captures the
model's decode forward and its lm_head once per batch size and replays the graph: one launch per
step.

Everything a captured step reads lives at a fixed address and no shape depends on the batch's
values:

* the step's inputs (token ids, positions, lengths, slots, the cache row each new token is
  written to) are copied into static buffers (one host-to-device copy per step); what the host
  can compute it does, so the graph does not spend kernels on it;
* each slot's block-table row lives on the device and is written when its request gains blocks
  (every ``block_size`` tokens), not rebuilt per step; the graph gathers the rows of its slots;
* a batch is padded to the next captured size with rows that use the pool's padding slot and
  block (``CachePool(padding=True)``): they compute garbage nobody reads;
* the ForwardBatch the layers see carries only host values that hold on every replay: one new
  token per request and the block table's capacity as the length bound (``max_seq_len``).

Models opt in with ``graph_decode = True`` once their decode path is free of host syncs and of
host values that would be baked into the graph. On CUDA the warm-up forward runs under torch's
sync debug mode "error", so a sync that slips in disables graphs with a reason (``disabled``)
instead of failing a capture. On other devices the same static-buffer path runs eagerly, which
is how the padding and table logic is tested without a GPU.
"""
from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from hwinfer.engine.pool import CachePool
from hwinfer.engine.request import Request
from hwinfer.runtime.batch import ForwardBatch

log = logging.getLogger("hwinfer.engine")
DEFAULT_MAX_LEN = 32768
_SAMPLED = 6   # the input buffer's device-written row (see DecodeGraphs.__init__)
# Each captured step ends with the greedy argmax of its logits (the ``greedy_tokens`` op) written
# to the sampled-token row: an all-greedy overlapped step then launches nothing outside its
# graph but the copy of the tokens to the host (the argmax kernel and the copy into the row ran
# between replays before, where they delay the next replay). Steps that sample otherwise
# overwrite the row (``publish``); they pay one argmax over their logits for it.
GREEDY_IN_GRAPH = True


def _where(err: BaseException) -> str:
    """The innermost hwinfer frames of ``err``'s traceback, for a message that says where."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "hwinfer" in f.filename]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))


class Alternating:
    """Two buffers handed out in turn (``next()``): the host fills one while an asynchronous
    copy from the other may still be queued (why each user needs two: where it makes them)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._items, self._turn = (make(), make()), 0

    def next(self) -> Any:
        item = self._items[self._turn]
        self._turn ^= 1
        return item


class NotCapturable(RuntimeError):
    """A step's forward cannot be replayed from a graph; the message says why and where."""


def capture(forward, mempool, what: str):
    """Warm ``forward`` up twice on a side stream (compiling its kernels; the second run under
    torch's sync debug mode "error", so a host sync raises), then capture it into a CUDA graph
    allocating from ``mempool``. Returns (graph, forward's static output); raises
    :class:`NotCapturable` naming ``what`` and the cause."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    previous = torch.cuda.get_sync_debug_mode()
    try:
        with torch.cuda.stream(stream):
            forward()
            torch.cuda.set_sync_debug_mode("error")
            forward()
    except RuntimeError as err:
        raise NotCapturable(f"the {what} syncs with or reads the host ({err}) at {_where(err)}") from err
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=mempool):
            out = forward()
    except RuntimeError as err:
        raise NotCapturable(f"capturing the {what} failed ({err})") from err
    return graph, out


def capture_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 up to 64, every 32 after, and max_batch."""
    sizes = [s for s in (1, 2, 4) if s < max_batch]
    sizes += list(range(8, min(max_batch, 64) + 1, 8)) + list(range(96, max_batch + 1, 32))
    return sorted({s for s in sizes if s <= max_batch} | {max_batch})


class DecodeGraphs:
    """Decode forwards (+ lm_head) of up to ``max_batch`` requests of at most ``max_len`` tokens.

    ``run(reqs)`` -> fp32 logits [len(reqs), V] of every request's next token, with the tokens
    at ``req.tokens(req.num_computed, req.num_computed + 1)`` written to the cache, exactly as the eager step would.
    """

    def __init__(self, model, pool: CachePool, *, max_batch: int, max_len: int | None = None) -> None:
        if pool.pad_slot is None:
            raise ValueError("DecodeGraphs needs a CachePool built with padding=True")
        self.model, self.pool = model, pool
        device = model.device
        cap = pool.num_blocks * pool.block_size
        limit = max_len or min(int(model.config.get("max_position_embeddings") or DEFAULT_MAX_LEN),
                               DEFAULT_MAX_LEN)
        self.width = pool.blocks_for(min(limit, cap))
        self.sizes = capture_sizes(max_batch)
        self.capture = device.type == "cuda"
        self.disabled: str | None = None
        size = self.sizes[-1]
        # Host-written rows (one pinned copy per step): token id, position, gather index, slot,
        # cache row, lengths. Device row ``_SAMPLED``: the tokens sampled by the previous step.
        # The gather index picks each row's token from this buffer, flattened: its own entry of
        # row 0 when the host knows the token, the previous step's sampled token (row
        # _SAMPLED) when it is still in flight (an overlapped step). The cache row is the slot
        # mapping of the token being written (``ForwardBatch.token_rows``) and the lengths are
        # int32, two to an entry of row 5 (the kernels take int32 seq_lens): both computed here
        # because each would otherwise be a handful of torch kernels inside every replay, and a
        # torch kernel in a decode step also stalls the programmatic dependent launch of the
        # GEMV after it (docs/engine.md, tenth session).
        self._cols = size
        # A padding column: token 0 (gathered from its own entry, set per column) at position 0
        # of the padding slot, whose cache row is the padding block's first (length: set apart).
        self._pad = torch.tensor([0, 0, 0, pool.pad_slot, pool.pad_block * pool.block_size, 0])
        # Two pinned staging buffers, alternating: with overlapped steps the host writes step
        # N+1's inputs while step N's copy may still wait in the stream behind step N-1.
        self._staging = Alternating(lambda: torch.empty(_SAMPLED, size, dtype=torch.int64,
                                                        pin_memory=self.capture))
        pad = torch.empty(_SAMPLED + 1, size, dtype=torch.int64)
        pad[_SAMPLED] = 0
        self._pad_rows(pad, 0, size)
        self.inputs = pad.to(device)
        self.sampled = self.inputs[_SAMPLED]
        # Two host copies of sampled tokens, alternating: a step's copy must survive until the
        # host has read it, while the next step's copy is already queued.
        self._readback = Alternating(lambda: torch.zeros(size, dtype=torch.int64, pin_memory=self.capture))
        self.tables = torch.full((pool.pad_slot + 1, self.width), pool.pad_block, dtype=torch.int32,
                                 device=device)
        # A pinned mirror the table rows are copied from without blocking the host (a blocking
        # copy waits for the step in flight). A mirror row changes only by appending block ids,
        # or from column 0 when a new request takes the slot, which the engine does only after
        # draining the step in flight: a queued copy never reads a row that is being rewritten.
        self._tables_host = torch.empty(self.tables.shape, dtype=torch.int32, pin_memory=self.capture)
        self.cu = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.rows = torch.arange(size, device=device)
        self._synced: dict[int, tuple[list[int], int]] = {}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}  # None: eager
        self._mempool = None
        self.replays = 0  # steps served by this path
        self.greedy = GREEDY_IN_GRAPH   # (read once: the captured graphs hold the choice)
        self.greedy_steps = 0  # steps whose tokens were the graph's own argmax

    # --- which steps qualify ---------------------------------------------------------------
    def fits(self, scheduled: list[tuple[Request, int]]) -> bool:
        """A decode step of at most ``max_batch`` requests whose blocks fit the table width."""
        return (self.disabled is None and 0 < len(scheduled) <= self.sizes[-1]
                and all(n == 1 and r.num_computed > 0 and len(r.blocks) <= self.width
                        for r, n in scheduled))

    # --- one step ----------------------------------------------------------------------------
    def run(self, reqs: list[Request], inflight_rows: dict[str, int] | None = None) -> torch.Tensor | None:
        """Logits [n, V] of the step, or None when graphs just got disabled (run it eagerly).
        ``inflight_rows``: request id -> row of the step still in flight, for the requests whose
        next token was sampled there and is not read back yet (``req.inflight``)."""
        n = len(reqs)
        size = next(s for s in self.sizes if s >= n)
        # Capture first: capturing fills the static inputs with padding rows, so the step's own
        # inputs must be copied in after it (a replay right after a capture would otherwise run
        # the padding rows and leave the requests' tokens unwritten).
        if size not in self.graphs and not self._capture(size):
            return None
        self._sync_tables(reqs)
        host = self._staging.next()[:, :size]
        self._pad_rows(host, n, size)
        ids, index, rows, bs = [], [], [], self.pool.block_size
        for i, r in enumerate(reqs):
            pos = r.num_computed
            if r.inflight:
                if inflight_rows is None or r.id not in inflight_rows:
                    raise RuntimeError(f"request {r.id}: its next token is in flight in no known step")
                ids.append(0)
                index.append(_SAMPLED * self._cols + inflight_rows[r.id])
            else:
                ids.append(r.tokens(pos, pos + 1)[0])
                index.append(i)
            rows.append(r.blocks[pos // bs] * bs + pos % bs)
        host[:5, :n] = torch.tensor([ids, [r.num_computed for r in reqs], index,
                                     [r.slot for r in reqs], rows], dtype=torch.int64)
        host[5].view(torch.int32)[:n] = torch.tensor([r.num_computed + 1 for r in reqs],
                                                     dtype=torch.int32)
        self.inputs[:_SAMPLED, :size].copy_(host, non_blocking=True)
        self.replays += 1
        graph, logits = self.graphs[size]
        if graph is None:  # not CUDA: the same fixed-size step, run eagerly
            return self._forward(size)[:n]
        graph.replay()
        return logits[:n]

    def _sync_tables(self, reqs: list[Request]) -> None:
        """Write the block ids each request gained since its slot's row was last written."""
        for r in reqs:
            known = self._synced.get(r.slot)
            start = known[1] if known is not None and known[0] is r.blocks else 0
            if start < len(r.blocks):
                row = self._tables_host[r.slot, start:len(r.blocks)]
                row.copy_(torch.tensor(r.blocks[start:], dtype=torch.int32))
                self.tables[r.slot, start:len(r.blocks)].copy_(row, non_blocking=True)
            # Holding the list object keeps its identity unique while we compare against it.
            self._synced[r.slot] = (r.blocks, len(r.blocks))

    def publish(self, tokens: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        """Keep a step's sampled ``tokens`` [n] (device) for the next step's inputs and start
        copying them to the host: returns (host tensor [n], the event that marks the copy done;
        None off CUDA, where the copy is done already)."""
        self.sampled[:tokens.shape[0]].copy_(tokens)
        return self._read_back(tokens.shape[0])

    def publish_argmax(self, n: int) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        """As :meth:`publish` for a step whose tokens are its own greedy argmax of its n rows,
        already in the sampled row (``self.greedy``)."""
        if not self.greedy:
            raise RuntimeError("publish_argmax: these graphs do not take the greedy argmax")
        self.greedy_steps += 1
        return self._read_back(n)

    def _read_back(self, n: int) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        host = self._readback.next()[:n]
        host.copy_(self.sampled[:n], non_blocking=self.capture)
        if not self.capture:
            return host, None
        event = torch.cuda.Event()
        event.record()
        return host, event

    def _pad_rows(self, buf: torch.Tensor, start: int, stop: int) -> None:
        """Padding in columns [start, stop) of host-written rows: token 0 (its own) at position
        0 of the padding slot, length 1 (attention reads only the row it has just written)."""
        buf[:_SAMPLED, start:stop] = self._pad[:, None]
        buf[2, start:stop] = torch.arange(start, stop)
        buf[5].view(torch.int32)[start:stop] = 1

    def _batch(self, size: int) -> ForwardBatch:
        ids = self.inputs.view(-1).index_select(0, self.inputs[2, :size])   # see __init__
        pos, slots, rows = self.inputs[1, :size], self.inputs[3, :size], self.inputs[4, :size]
        table = self.tables.index_select(0, slots)
        batch = ForwardBatch(ids, pos, self.cu[:size + 1], self.inputs[5].view(torch.int32)[:size],
                             self.pool.cache, slots, table, new_lens=[1] * size,
                             context_lens_host=[1] * size, token_requests=self.rows[:size],
                             max_seq_len=self.width * self.pool.block_size)
        batch.scratch[("token_rows", 1)] = rows   # what ForwardBatch.token_rows() would compute
        return batch

    def _forward(self, size: int) -> torch.Tensor:
        logits = self.model.logits(self.model.forward_batch(self._batch(size)))
        if self.greedy:   # ties to the lowest id, as the sampler's greedy rows
            self.model.ops.greedy_tokens(logits, self.sampled[:size])
        return logits

    # --- capture -----------------------------------------------------------------------------
    def _capture(self, size: int) -> bool:
        """Warm up (compiling kernels; syncs are errors), then capture; False (and ``disabled``
        says why) if the decode forward cannot be captured. Inputs are the padding rows at
        capture time, so nothing but the padding slot is touched. Off CUDA only the warm-up
        runs (it touches the same state), and the size then runs eagerly."""
        self._pad_rows(self.inputs, 0, size)
        if not self.greedy:
            return self._warm_and_capture(size)
        # The warm-up forwards write their argmax into the sampled row, where a step still in
        # flight keeps the tokens the next step gathers: keep the row and put it back after.
        kept = self.sampled.clone()
        try:
            return self._warm_and_capture(size)
        finally:
            self.sampled.copy_(kept)

    def _warm_and_capture(self, size: int) -> bool:
        if not self.capture:
            self._forward(size)
            self.graphs[size] = (None, None)
            return True
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        try:
            self.graphs[size] = capture(lambda: self._forward(size), self._mempool, "decode forward")
        except NotCapturable as err:
            self.disabled = str(err)
            log.warning("CUDA graphs off: %s", self.disabled)
            return False
        return True

    def capture_all(self) -> None:
        """Capture every size now, largest first (smaller graphs then reuse its memory)."""
        if self.capture:
            for size in reversed(self.sizes):
                if size not in self.graphs and not self._capture(size):
                    return
