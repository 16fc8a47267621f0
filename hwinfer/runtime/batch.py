"""ForwardBatch: everything a forward step needs besides weights, passed explicitly to layers.

Tokens of N requests are packed: ``input_ids`` [T]; request i's new tokens are
``cu_seqlens[i] .. cu_seqlens[i+1]-1`` at positions ``context_lens[i] ..  seq_lens[i]-1``
(``context_lens`` = tokens already in the cache). ``cache=None`` is a plain full forward over
the given tokens (no prefix, nothing stored).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable

import torch

from hwinfer.cache.model_cache import ModelCache
from hwinfer.ops.paging import paged_rows
from hwinfer.runtime.capture import StateCapture


def host_to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``torch.tensor(values, device=device)`` (a list of ints, or of lists) without waiting for
    the device: a blocking host to device copy synchronizes the CUDA stream (torch waits for the
    copy, and so for every kernel queued before it), which empties the launch queue of a prefill.
    On CUDA the values are staged in pinned memory (torch's caching host allocator keeps the
    block until the copy is done) and copied asynchronously; elsewhere the copy stays blocking."""
    return _upload(torch.tensor(values, dtype=dtype), device)


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without waiting for it (as :func:`host_to_device`)."""
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def packed_spans(starts: list[int], lengths: list[int], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Spans ``starts[i] .. starts[i] + lengths[i] - 1`` of every request i, packed request after
    request: (request index [K], value [K]) int64, K = sum(lengths), without reading the device
    (two asynchronous copies of host lists, a few kernels)."""
    total, n = sum(lengths), len(lengths)
    if total == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return empty, empty
    offsets = list(accumulate(lengths, initial=0))[:-1]
    req = torch.repeat_interleave(torch.arange(n, device=device), host_to_device(lengths, device),
                                  output_size=total)
    shift = host_to_device([s - o for s, o in zip(starts, offsets)], device)
    return req, torch.arange(total, device=device) + shift[req]


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor          # [T] int64
    positions: torch.Tensor          # [T] int64
    cu_seqlens: torch.Tensor         # [N+1] int32, new tokens per request
    seq_lens: torch.Tensor           # [N] int32, cached + new
    cache: ModelCache | None = None
    slots: torch.Tensor | None = None        # [N] int64 request slots (ring / request state)
    block_table: torch.Tensor | None = None  # [N, max_blocks] int32
    # Host-side copies, so layers never sync with the device to learn the batch's shape.
    new_lens: list[int] = field(default_factory=list)
    context_lens_host: list[int] = field(default_factory=list)
    # Speculative decoding: recurrent layers record their per-token inputs here for replay.
    capture: StateCapture | None = None
    # Per-forward scratch shared between layers (e.g. a KV-shared layer reusing its owner's
    # gathered sliding-window rows); empty at the start of every forward.
    scratch: dict = field(default_factory=dict)
    # [T] int64 request index of every packed token; built once per batch (see request_of_token).
    token_requests: torch.Tensor | None = None
    # Host-side upper bound of seq_lens: sizes a decode's gathers without reading the device.
    # A graph-captured decode sets it to the capacity of its block table.
    max_seq_len: int | None = None

    def shared(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()`` computed once per forward under ``key`` and shared by every layer that
        asks: tensors that depend on the batch only (cache rows, index lists, rope tables). In
        a decode step each costs kernels, once per layer otherwise."""
        if key not in self.scratch:
            self.scratch[key] = build()
        return self.scratch[key]

    def rope(self, ops, rotary_dim: int, base: float, scaling: dict | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ops.rope_tables`` of this batch's positions, computed once per forward and shared
        by every layer that asks with the same parameters (a table costs several kernels)."""
        return self.shared(("rope", rotary_dim, base, repr(scaling)), lambda: ops.rope_tables(
            self.positions, rotary_dim=rotary_dim, base=base, scaling=scaling))

    @property
    def num_requests(self) -> int:
        return len(self.new_lens)

    @property
    def is_decode(self) -> bool:
        """Every request adds exactly one token after a cached prefix (the prefix is checked
        first: a graph-captured prefill's new-token counts cannot be read, see
        :mod:`hwinfer.engine.prefill_graphs`)."""
        return all(c > 0 for c in self.context_lens_host) and all(n == 1 for n in self.new_lens)

    @property
    def has_prefix(self) -> bool:
        return any(c > 0 for c in self.context_lens_host)

    @property
    def context_lens(self) -> torch.Tensor:
        return self.seq_lens - (self.cu_seqlens[1:] - self.cu_seqlens[:-1])

    @property
    def cu_seqlens_k(self) -> torch.Tensor:
        """[N+1] int32 cumulative total lengths (for attention over prefix + new tokens)."""
        out = torch.zeros(self.num_requests + 1, dtype=torch.int32, device=self.seq_lens.device)
        out[1:] = torch.cumsum(self.seq_lens, 0)
        return out

    def token_rows(self, ratio: int = 1) -> torch.Tensor:
        """Global cache row of every new token's position (``per="token"`` tensors, ratio 1);
        computed once per forward and ratio (every attention layer writes the same rows)."""
        return self.shared(("token_rows", ratio),
                           lambda: self.rows_for(self.positions, self.request_of_token(), ratio))

    def ring_rows(self, size: int) -> torch.Tensor:
        """[T] row of every new token in a ring of ``size`` rows a request slot (a ring tensor
        flattened to [slots * size, ...]); computed once per forward and ring size."""
        def build() -> torch.Tensor:
            slots = self.slots.long()
            if not self.is_decode:  # in decode token i is request i: no gather
                slots = slots[self.request_of_token()]
            return slots * size + self.positions % size
        return self.shared(("ring_rows", size), build)

    def entry_rows(self, ratio: int = 1, ops=None) -> torch.Tensor:
        """[N, seq_len_bound // ratio] global rows of every request's entries 0, 1, ... in a
        paged ``per="token"`` tensor with ``ratio`` (the positions 0, ratio, 2 * ratio, ...),
        -1 past the request's completed ones (``seq_lens // ratio``). The width is the host-side
        length bound and the counts come from the device, so nothing reads the device (under
        CUDA graphs the width is the block table's capacity). Computed once per forward and
        ratio: every layer reading that tensor shares it. Built by ``ops.paged_rows`` (the
        device's impl: one launch on GPUs) or, without ``ops``, its reference."""
        assert self.cache is not None and self.block_table is not None

        def build() -> torch.Tensor:
            fn = paged_rows if ops is None else ops.paged_rows
            return fn(self.block_table, self.seq_lens, block_size=self.cache.block_size,
                      ratio=ratio, width=self.seq_len_bound // ratio)
        return self.shared(("entry_rows", ratio), build)

    def pick_rows(self, ratio: int = 1, dtype: torch.dtype = torch.int64, ops=None) -> torch.Tensor:
        """[N * (seq_len_bound // ratio) + 1] :meth:`entry_rows` flattened, its unused slots as
        row 0 (outside every query's key range, so never scored), and one -1 after them; once
        per forward, ratio and dtype. ``pick_rows[:-1]`` is a lightning indexer's ``k_rows``
        over the paged store, and ``pick_rows[picks]`` turns its picks into store rows in one
        gather, a pick of -1 (none) reading the trailing -1."""
        def build() -> torch.Tensor:
            rows = self.entry_rows(ratio, ops).clamp(min=0).flatten()
            return torch.cat([rows, rows.new_full((1,), -1)]).to(dtype)
        return self.shared(("pick_rows", ratio, dtype), build)

    def request_of_token(self) -> torch.Tensor:
        """[T] int64: which request each packed token belongs to (computed once per batch; from
        the device cu_seqlens with the host's token count, so nothing waits on the device)."""
        if self.token_requests is None:
            n = len(self.new_lens)
            arange = torch.arange(n, device=self.input_ids.device)
            if self.is_decode:
                self.token_requests = arange
            else:
                lens = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()
                self.token_requests = torch.repeat_interleave(arange, lens, output_size=sum(self.new_lens))
        return self.token_requests

    @property
    def cu_seqlens_host(self) -> torch.Tensor:
        """[N+1] int32 on the CPU: ``cu_seqlens`` from the host lengths. For ops that read the
        sequence bounds on the host (the torch ``attention``): a device copy would cost a sync.
        Pinned on CUDA, so an impl that wants the bounds on the device (the Triton ones) uploads
        them without waiting. Built once per forward."""
        return self.shared(("cu_seqlens_host",), lambda: self._host_bounds(self.new_lens))

    @property
    def cu_seqlens_k_host(self) -> torch.Tensor:
        """[N+1] int32 on the CPU: ``cu_seqlens_k`` (cached + new lengths) from the host lists;
        once per forward."""
        return self.shared(("cu_seqlens_k_host",), lambda: self._host_bounds(self.seq_lens_host))

    def _host_bounds(self, lengths: list[int]) -> torch.Tensor:
        bounds = torch.tensor(list(accumulate(lengths, initial=0)), dtype=torch.int32)
        return bounds.pin_memory() if self.input_ids.device.type == "cuda" else bounds

    @property
    def seq_lens_host(self) -> list[int]:
        """Cached + new length of every request, on the host."""
        return [c + n for c, n in zip(self.context_lens_host, self.new_lens)]

    def context_rows(self) -> torch.Tensor:
        """Global rows of positions 0 .. seq_len-1 of every request in a paged ``per="token"``
        tensor, packed request after request (the key layout ``cu_seqlens_k`` describes); once
        per forward."""
        def build() -> torch.Tensor:
            n = self.num_requests
            requests, positions = packed_spans([0] * n, self.seq_lens_host, self.positions.device)
            return self.rows_for(positions, requests)
        return self.shared(("context_rows",), build)

    def tail_tokens(self, keep: int) -> torch.Tensor:
        """[K] int64 packed indices of each request's last ``min(new, keep)`` new tokens: the
        ones a ring of ``keep`` rows a request retains (an earlier token's row is overwritten by
        a later one of the same step; writing both in one scatter would race). Host lists only,
        so a prefill does not wait on the device (a mask over the tokens would); once per
        forward and ``keep``."""
        def build() -> torch.Tensor:
            cu = list(accumulate(self.new_lens, initial=0))
            kept = [min(n, keep) for n in self.new_lens]
            return packed_spans([e - k for e, k in zip(cu[1:], kept)], kept, self.input_ids.device)[1]
        return self.shared(("tail_tokens", keep), build)

    def ring_sources(self, keep: int) -> torch.Tensor:
        """[T] int64: for every packed token, the packed index of its request's last token that
        lands on the same row of a ring of ``keep`` rows (itself when no later token does). A
        store of ``rows[t] <- x[ring_sources[t]]`` over all T tokens writes each row only with
        the value that survives, so its repeated rows race harmlessly (equal values), and it has
        the shape of the step: from the device bounds, without the host's new-token counts,
        which a graph-captured prefill cannot read. Once per forward and ``keep``."""
        def build() -> torch.Tensor:
            tokens = self.input_ids.shape[0]
            t = torch.arange(tokens, device=self.input_ids.device)
            end = self.cu_seqlens[1:].long()[self.request_of_token()]   # exclusive ends
            return t + keep * torch.div(end - 1 - t, keep, rounding_mode="floor")
        return self.shared(("ring_sources", keep), build)

    @property
    def total_len_bound(self) -> int:
        """An upper bound of the sum of every request's cached + new length, known on the host
        (a captured step: the requests times their length bound)."""
        if self.max_seq_len is not None:
            return self.max_seq_len * self.num_requests
        return sum(self.seq_lens_host)

    def packed_entry_rows(self, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [K], starts [N]) int64: global rows of every request's completed entries in a
        paged ``per="token"`` tensor with ``ratio`` (``seq_lens // ratio`` of them, entry e at
        position e * ratio), packed request after request, and each request's first index.
        K = ``total_len_bound // ratio``: proportional to the batch's lengths (unlike
        :meth:`entry_rows`' N x bound), from device counts; indices past the device total point
        at a request's last entry row and are never meant to be read. Once per forward and
        ratio."""
        assert self.cache is not None and self.block_table is not None

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            counts = self.seq_lens.long() // ratio
            cum = torch.cumsum(counts, 0)
            starts = cum - counts
            j = torch.arange(self.total_len_bound // ratio, device=counts.device)
            req = torch.searchsorted(cum, j, right=True).clamp(max=self.num_requests - 1)
            e = torch.minimum(j - starts[req], counts[req] - 1).clamp(min=0)
            return self.rows_for(e * ratio, req, ratio), starts
        return self.shared(("packed_entry_rows", ratio), build)

    @property
    def seq_len_bound(self) -> int:
        """An upper bound of every request's cached + new length, known on the host."""
        if self.max_seq_len is not None:
            return self.max_seq_len
        return max(self.seq_lens_host, default=0)

    def rows_for(self, positions: torch.Tensor, requests: torch.Tensor, ratio: int = 1) -> torch.Tensor:
        """Global row of (request, position) in a paged ``per="token"`` tensor with ``ratio``."""
        assert self.cache is not None and self.block_table is not None
        bs = self.cache.block_size
        block = self.block_table[requests, positions // bs].to(torch.int64)
        return block * (bs // ratio) + (positions % bs) // ratio

    @classmethod
    def full(cls, input_ids: torch.Tensor, lengths: list[int]) -> "ForwardBatch":
        """A cacheless forward over packed sequences of ``lengths`` tokens starting at position 0."""
        device = input_ids.device
        positions = packed_spans([0] * len(lengths), list(lengths), device)[1]
        cu = host_to_device(list(accumulate(lengths, initial=0)), device, torch.int32)
        return cls(input_ids, positions, cu, host_to_device(list(lengths), device, torch.int32),
                   new_lens=list(lengths), context_lens_host=[0] * len(lengths))

    @classmethod
    def from_host(cls, ids: list[int], new_lens: list[int], context_lens: list[int],
                  cache: ModelCache, slots: list[int], blocks: list[list[int]],
                  device: torch.device) -> "ForwardBatch":
        """:meth:`step` from the host's lists (token ids, each request's slot and cache blocks),
        with the positions, each token's request and its cache row (:meth:`token_rows`, the
        slot mapping) computed on the host and everything uploaded in two copies: on the device
        those take ~17 small kernels and ~7 copies, each a launch that a short, host-bound
        prefill pays (docs/engine.md, sixteenth session)."""
        n, total = len(new_lens), len(ids)
        lens = torch.tensor(new_lens, dtype=torch.int64)
        requests = torch.repeat_interleave(torch.arange(n), lens, output_size=total)
        starts = torch.tensor(context_lens, dtype=torch.int64) - (torch.cumsum(lens, 0) - lens)
        positions = torch.arange(total) + starts[requests]
        width = max((len(b) for b in blocks), default=0)
        table = torch.tensor([b + [0] * (width - len(b)) for b in blocks], dtype=torch.int64)
        bs = cache.block_size
        # -1 for a position past the request's blocks (only a step that never writes per-token
        # cache rows has one; a write through -1 fails loudly)
        col = positions // bs
        inside = col < width
        rows = (torch.where(inside, table[requests, col.clamp(max=max(width - 1, 0))] * bs
                            + positions % bs, -1) if total and width
                else torch.full((total,), -1, dtype=torch.int64))
        longs = _upload(torch.cat([torch.tensor(ids, dtype=torch.int64), positions, requests, rows,
                                   torch.tensor(slots, dtype=torch.int64)]), device)
        cu = list(accumulate(new_lens, initial=0))
        seq = [a + c for a, c in zip(new_lens, context_lens)]
        ints = _upload(torch.cat([torch.tensor(cu + seq, dtype=torch.int32),
                                  table.to(torch.int32).flatten()]), device)
        ids_d, pos_d, req_d, rows_d, slots_d = longs.split([total] * 4 + [n])
        batch = cls(ids_d, pos_d, ints[:n + 1], ints[n + 1:2 * n + 1], cache, slots_d,
                    ints[2 * n + 1:].view(n, width), list(new_lens), list(context_lens),
                    token_requests=req_d)
        batch.scratch[("token_rows", 1)] = rows_d
        return batch

    @classmethod
    def step(cls, input_ids: torch.Tensor, new_lens: list[int], context_lens: list[int],
             cache: ModelCache, slots: torch.Tensor, block_table: torch.Tensor) -> "ForwardBatch":
        """A cached step: request i adds ``new_lens[i]`` tokens after ``context_lens[i]`` cached."""
        device = input_ids.device
        positions = packed_spans(list(context_lens), list(new_lens), device)[1]
        cu = host_to_device(list(accumulate(new_lens, initial=0)), device, torch.int32)
        seq = host_to_device([n + c for n, c in zip(new_lens, context_lens)], device, torch.int32)
        return cls(input_ids, positions, cu, seq, cache, slots, block_table, list(new_lens), list(context_lens))
