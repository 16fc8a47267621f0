"""The cache pool: one ModelCache for every cache kind of a model, handed out in blocks and slots.

Per-token tensors (KV, compressed entries, indexer keys) are paged in blocks of ``block_size``
tokens; ring and per-request tensors (sliding windows, compressor partial state, linear-attention
and conv state) live in request slots. Sizing comes from a byte budget: each slot costs the
model's fixed bytes per request, each block ``block_size`` x its bytes per token.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from hwinfer.cache.model_cache import ModelCache
from hwinfer.engine.request import Request


def keeps_state(model) -> bool:
    """Does ``model`` keep ring or per-request cache state (sliding windows, compressor partial
    windows, linear-attention / conv state), which KV blocks alone cannot restore?"""
    return any(s.per != "token" for layer in model.cache_specs() for s in layer)


@dataclass(frozen=True)
class CacheBytes:
    per_token: float
    per_request: int

    @classmethod
    def of(cls, model) -> "CacheBytes":
        specs = [s for layer in model.cache_specs() for s in layer]
        return cls(sum(s.bytes_per_token() for s in specs), sum(s.fixed_bytes() for s in specs))


def plan(model, *, budget_bytes: int, max_num_seqs: int, block_size: int) -> tuple[int, int]:
    """(num_blocks, num_slots) that fit ``budget_bytes``."""
    cost = CacheBytes.of(model)
    slots = max_num_seqs
    left = budget_bytes - slots * cost.per_request
    block_bytes = max(cost.per_token * block_size, 1.0)
    blocks = int(left // block_bytes)
    if blocks < 1:
        raise ValueError(f"cache budget {budget_bytes} B is too small: {slots} request slots need "
                         f"{slots * cost.per_request} B and one block {block_bytes:.0f} B")
    return blocks, slots


class CachePool:
    """Blocks and slots of one ModelCache, with a free list each.

    Blocks are reference-counted: a request holds one reference to each of its blocks, and the
    prefix cache one to each block it keeps for reuse; a block is free when nobody holds it.
    ``checkpoint_slots`` extra slots hold copies of a request's ring / per-request state taken at
    prefix-cache boundaries. When blocks run short, ``reclaimer(n)`` (the prefix cache's LRU
    eviction) is asked to give back at least ``n``.

    ``padding=True`` adds one block and one slot that are never handed out: rows a fixed-size
    (graph-captured) batch adds to fill up its size read and write there (``pad_block``,
    ``pad_slot``), never in anybody's cache.
    """

    def __init__(self, model, *, num_blocks: int, num_slots: int, block_size: int | None = None,
                 checkpoint_slots: int = 0, padding: bool = False) -> None:
        self.block_size = block_size or model.cache_block_size()
        extra = int(padding)
        self.cache = ModelCache.allocate(model.cache_specs(),
                                         num_slots=num_slots + checkpoint_slots + extra,
                                         num_blocks=num_blocks + extra, block_size=self.block_size,
                                         device=model.device)
        self.pad_block = num_blocks if padding else None
        self.pad_slot = num_slots + checkpoint_slots if padding else None
        self.num_blocks, self.num_slots = num_blocks, num_slots
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.free_slots: deque[int] = deque(range(num_slots))
        self.free_checkpoints: deque[int] = deque(range(num_slots, num_slots + checkpoint_slots))
        self.refs = [0] * num_blocks
        self.reclaimer: Callable[[int], None] | None = None

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def has_blocks(self, n: int) -> bool:
        """At least ``n`` free blocks, after asking the reclaimer if needed."""
        if len(self.free_blocks) < n and self.reclaimer is not None:
            self.reclaimer(n - len(self.free_blocks))
        return len(self.free_blocks) >= n

    def can_admit(self, num_tokens: int) -> bool:
        return bool(self.free_slots) and self.has_blocks(self.blocks_for(num_tokens))

    def take_slot(self, req: Request) -> None:
        req.slot = self.free_slots.popleft()
        self.cache.reset_slots(torch.tensor([req.slot], device=self._device))

    def grow(self, req: Request, num_tokens: int) -> bool:
        """Make ``req`` own enough blocks for ``num_tokens`` tokens; False if the pool is short."""
        need = max(self.blocks_for(num_tokens) - len(req.blocks), 0)
        if not self.has_blocks(need):
            return False
        for _ in range(need):
            block = self.free_blocks.popleft()
            self.refs[block] = 1
            req.blocks.append(block)
        return True

    def share(self, block: int) -> None:
        """One more holder of ``block`` (a request reusing a cached prefix, or the cache)."""
        self.refs[block] += 1

    def unref(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free_blocks.append(block)

    def release(self, req: Request) -> None:
        for block in req.blocks:
            self.unref(block)
        req.blocks = []
        if req.slot is not None:
            self.free_slots.append(req.slot)
            req.slot = None

    def copy_state(self, src: int, dst: int) -> None:
        """Copy every ring / per-request tensor row of slot ``src`` into slot ``dst``."""
        self.cache.copy_slots(src, dst)

    @property
    def has_state(self) -> bool:
        """Does the model keep ring or per-request state (not restorable from KV blocks alone)?"""
        return any(spec.per != "token" for layer in self.cache.layers if layer for spec in layer.specs.values())

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def used_slots(self) -> int:
        return self.num_slots - len(self.free_slots)

    def is_empty(self) -> bool:
        """No block or slot is held by anyone (requests or the prefix cache)."""
        return self.used_blocks == 0 and self.used_slots == 0

    def usage(self) -> float:
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def _device(self) -> torch.device:
        for layer in self.cache.layers:
            if layer:
                return next(iter(layer.values())).device
        return torch.device("cpu")
