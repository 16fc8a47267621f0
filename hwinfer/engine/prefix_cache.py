"""Prefix caching: reuse the cache of a prompt's prefix computed by an earlier request.

A request's tokens are cut into chunks of ``chunk_tokens`` (a multiple of the block size, so of
every compression ratio: a chunk boundary is always a compression-block boundary). When a
request's computed tokens reach the end of a chunk, the chunk is registered under a chained hash
of all tokens up to it: the cache keeps a reference to the chunk's KV blocks and, for models with
ring or per-request state (sliding windows, compressor partial state, linear-attention and conv
state), a copy of that state taken exactly at the boundary (a checkpoint slot). A new request
whose prompt starts with registered chunks shares their blocks, gets the last chunk's state
copied into its slot, and starts computing after them; at least one prompt token is always left
to compute, so the first sampled token comes from a real forward.

For stateful models the scheduler ends prefill chunks at chunk boundaries (so the state is
captured exactly there); outputs are identical with and without prefix caching up to the
floating-point differences of batching. Entries are evicted least recently used first, and only
when no request shares their blocks.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from hwinfer.engine.pool import CachePool
from hwinfer.engine.request import Request


@dataclass
class _Entry:
    blocks: list[int]
    checkpoint: int | None


@dataclass
class PrefixStats:
    queries: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


@dataclass
class _ReqProgress:
    hashes: list[bytes] = field(default_factory=list)


class PrefixCache:
    def __init__(self, pool: CachePool, chunk_tokens: int) -> None:
        if chunk_tokens % pool.block_size:
            raise ValueError(f"prefix chunk {chunk_tokens} is not a multiple of the block size {pool.block_size}")
        self.pool = pool
        self.chunk = chunk_tokens
        self.blocks_per_chunk = chunk_tokens // pool.block_size
        self.stateful = pool.has_state
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.progress: dict[str, _ReqProgress] = {}
        self.stats = PrefixStats()
        pool.reclaimer = self.evict

    # --- lookup ----------------------------------------------------------------------------------
    def _hashes(self, req: Request, upto_chunks: int) -> list[bytes]:
        prog = self.progress.setdefault(req.id, _ReqProgress())
        while len(prog.hashes) < upto_chunks:
            i = len(prog.hashes)
            parent = prog.hashes[-1] if prog.hashes else b""
            chunk = req.tokens(i * self.chunk, (i + 1) * self.chunk)
            prog.hashes.append(hashlib.sha256(parent + repr(chunk).encode()).digest())
        return prog.hashes[:upto_chunks]

    def peek(self, req: Request) -> int:
        """Tokens of ``req`` a lookup would reuse now (no side effects besides hashing)."""
        usable = (req.num_tokens - 1) // self.chunk
        hit = 0
        for h in self._hashes(req, usable):
            entry = self.entries.get(h)
            if entry is None or (self.stateful and entry.checkpoint is None):
                break
            hit += 1
        return hit * self.chunk

    def record(self, req: Request, hit_tokens: int) -> None:
        """Count one admitted request's lookup (for the hit rate)."""
        self.stats.queries += 1
        self.stats.query_tokens += req.num_tokens
        self.stats.hit_tokens += hit_tokens

    def apply(self, req: Request, hit_tokens: int) -> None:
        """Give ``req`` (which holds its slot, no blocks yet) the cached prefix of ``hit_tokens``."""
        if hit_tokens == 0:
            return
        hashes = self._hashes(req, hit_tokens // self.chunk)
        for h in hashes:
            entry = self.entries[h]
            self.entries.move_to_end(h)
            for block in entry.blocks:
                self.pool.share(block)
                req.blocks.append(block)
        last = self.entries[hashes[-1]]
        if self.stateful and last.checkpoint is not None:
            self.pool.copy_state(last.checkpoint, req.slot)
        req.num_computed = hit_tokens

    # --- registration ----------------------------------------------------------------------------
    def chunk_limit(self, req: Request, n: int) -> int:
        """Stateful models: end this step's chunk at the next chunk boundary."""
        if not self.stateful:
            return n
        return min(n, self.chunk - req.num_computed % self.chunk)

    def register(self, req: Request) -> None:
        """After a step: register every chunk ``req`` has completed that the cache lacks."""
        done = req.num_computed // self.chunk
        for i, h in enumerate(self._hashes(req, done)):
            if h in self.entries:
                continue
            at_boundary = (i + 1) * self.chunk == req.num_computed
            if self.stateful and not at_boundary:
                continue  # its state is gone: without it the chunk cannot be resumed from
            blocks = req.blocks[i * self.blocks_per_chunk:(i + 1) * self.blocks_per_chunk]
            checkpoint = None
            if self.stateful:
                checkpoint = self._take_checkpoint()
                if checkpoint is None:
                    continue
                self.pool.copy_state(req.slot, checkpoint)
            for block in blocks:
                self.pool.share(block)
            self.entries[h] = _Entry(list(blocks), checkpoint)

    def forget(self, req: Request) -> None:
        self.progress.pop(req.id, None)

    # --- eviction --------------------------------------------------------------------------------
    def _take_checkpoint(self) -> int | None:
        if not self.pool.free_checkpoints:
            self._evict_one(lambda e: e.checkpoint is not None)
        return self.pool.free_checkpoints.popleft() if self.pool.free_checkpoints else None

    def _evict_one(self, wanted=lambda e: True) -> bool:
        for h, entry in self.entries.items():  # least recently used first
            if wanted(entry) and all(self.pool.refs[b] == 1 for b in entry.blocks):
                self._drop(h)
                return True
        return False

    def _drop(self, h: bytes) -> None:
        entry = self.entries.pop(h)
        for block in entry.blocks:
            self.pool.unref(block)
        if entry.checkpoint is not None:
            self.pool.free_checkpoints.append(entry.checkpoint)

    def evict(self, blocks_needed: int) -> None:
        """Free at least ``blocks_needed`` blocks if entries no request uses can give them."""
        start = len(self.pool.free_blocks)
        while len(self.pool.free_blocks) - start < blocks_needed and self._evict_one():
            pass

    def clear(self) -> None:
        for h in list(self.entries):
            self._drop(h)
