"""Continuous batching with chunked prefill under a token budget, admission by free memory,
preemption by recompute.

Each step: running requests first, in arrival order (a decode needs one token, an unfinished
prefill its next chunk), then waiting requests while the token budget, a free slot and enough
free blocks allow. When a running request cannot grow, the most recently admitted running
request is preempted: its blocks and slot go back to the pool and it returns to the front of the
queue with its generated tokens kept, to be recomputed (prompt + output) when readmitted.
With prefix caching, admission first reuses the longest cached prefix (see prefix_cache.py).
"""
from __future__ import annotations

from collections import deque

from hwinfer.engine.pool import CachePool
from hwinfer.engine.prefix_cache import PrefixCache
from hwinfer.engine.request import Request, Status


class Scheduler:
    def __init__(self, pool: CachePool, *, max_num_seqs: int, max_num_batched_tokens: int,
                 prefix: PrefixCache | None = None) -> None:
        self.pool = pool
        self.prefix = prefix
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Request, int]]:
        """The requests of the next step with their number of new tokens."""
        budget = self.token_budget
        step: list[tuple[Request, int]] = []
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            n = min(req.num_pending, budget)
            if self.prefix is not None:
                n = self.prefix.chunk_limit(req, n)
            while not self.pool.grow(req, req.num_computed + n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req.status is Status.RUNNING:
                step.append((req, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if not self.pool.free_slots:
                break
            hit = self.prefix.peek(req) if self.prefix is not None else 0
            n = min(req.num_tokens - hit, budget)
            if self.prefix is not None and self.prefix.stateful:
                n = min(n, self.prefix.chunk)  # end at the next boundary (hit is on one)
            self.waiting.popleft()
            self.pool.take_slot(req)
            if self.prefix is not None:
                # Sharing the hit blocks first protects them from eviction by grow() below.
                self.prefix.apply(req, hit)
            if not self.pool.grow(req, hit + n):
                self.pool.release(req)
                req.num_computed = 0
                self.waiting.appendleft(req)
                break
            if self.prefix is not None:
                self.prefix.record(req, hit)
            req.status = Status.RUNNING
            self.running.append(req)
            step.append((req, n))
            budget -= n
        return step

    def preempt(self, req: Request) -> None:
        """Free everything ``req`` holds; it will be recomputed from its tokens when readmitted."""
        self.running.remove(req)
        self.pool.release(req)
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def finish(self, req: Request, reason: str) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.pool.release(req)
        if self.prefix is not None:
            self.prefix.forget(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
