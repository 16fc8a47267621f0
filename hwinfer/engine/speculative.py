"""Speculative decoding with the checkpoint's MTP layers (Qwen3.5, DeepSeek-V4).

``Engine(model, num_speculative_tokens=k)`` replaces each plain step by :meth:`Speculator.step`:

1. **Schedule** as usual (the scheduler is unchanged). A request whose scheduled tokens finish
   its pending ones (a decode: the token sampled last step) and that holds drafts from the last
   step gets them appended, while the step's token budget has room and its blocks can grow; a
   draft never preempts anything.
2. **Verify** in one forward: the request adds ``n + m`` tokens (pending + drafts) after its
   cached prefix, which is the ForwardBatch prefill-with-prefix path. The target token at each
   of the ``m + 1`` positions is drawn with the engine's sampler, seed and output index, exactly
   as plain decoding would draw it; the longest prefix of drafts equal to the target's tokens is
   accepted and the target's token after it is the bonus. So the output is the plain decoding
   output token for token, greedy *and* sampled (counter-based noise makes the target's draw a
   deterministic function of its logits; no rejection sampling is needed) whatever the drafts.
3. **Roll back** what the rejected drafts wrote. Per-token KV rows need nothing: the request's
   length shrinks and the rows are rewritten before anyone reads them. Ring tensors (DeepSeek-V4
   sliding window, compressor partial windows) are allocated with ``k`` spare rows
   (``spec_cache_specs``), so a rejected token's write never lands on a row a later step reads.
   Per-request state (Qwen3.5 GDN recurrent and conv state) is restored from a copy taken before
   the forward and replayed over the accepted tokens from inputs the layers recorded in the
   forward (:mod:`hwinfer.runtime.capture`): a few recurrence steps, no second forward.
4. **Draft** ``k`` tokens per request for the next step with the drafter (:mod:`hwinfer.engine.
   drafter`), which also keeps the MTP layer's own cache filled for every committed position.

Acceptance is counted in :class:`SpecStats` (``Engine.spec_stats()``).

A model supports this with three methods: ``spec_cache_specs(k)`` (its cache layers with rings
sized for ``k`` drafts, then the MTP layer's), ``forward_batch_mtp(batch) -> (hidden, mtp_input)``
and ``mtp_forward(mtp_input, batch) -> (head_input, next_mtp_input)``. Rings need at least
``k - 1`` spare rows (a rejected write at position q lands on q - rows; the next step reads back
to one window before its first position); ``k`` are allocated. With prefix caching, a verify that
jumps over a chunk boundary of a stateful model registers nothing there (its state is only
exact at the step's end), so fewer chunks may be cached; outputs are unaffected.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hwinfer.engine.drafter import DraftJob, Drafter, MTPDrafter, request_batch
from hwinfer.engine.request import Request
from hwinfer.runtime.batch import host_to_device
from hwinfer.runtime.capture import StateCapture

if TYPE_CHECKING:
    from hwinfer.engine.engine import Engine


@dataclass
class SpecStats:
    """Counters over every verify (a request step that carried at least one draft)."""

    verify_steps: int = 0
    drafted: int = 0       # drafts verified
    accepted: int = 0      # drafts equal to the target's token
    emitted: int = 0       # tokens those steps produced (accepted + bonus, cut at a stop)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verify(self) -> float:
        return self.emitted / self.verify_steps if self.verify_steps else 0.0


class SpecCacheView:
    """The model as the cache pool sees it with speculation on: ``cache_specs()`` is
    ``model.spec_cache_specs(k)`` (rings with ``k`` spare rows, then the MTP layer's cache), so
    ``plan`` budgets for it and the pool allocates, resets and frees it with everything else."""

    def __init__(self, model, k: int) -> None:
        self._model, self._k = model, k

    def cache_specs(self):
        return self._model.spec_cache_specs(self._k)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def spec_cache_model(model, k: int):
    """What ``plan`` / ``CachePool`` should size from: the model itself when ``k == 0``."""
    if k < 0:
        raise ValueError("num_speculative_tokens must be >= 0")
    if k == 0:
        return model
    if getattr(model, "mtp", None) is None or not hasattr(model, "mtp_forward"):
        raise ValueError(f"{type(model).__name__} has no MTP head (or its checkpoint has no MTP "
                         "weights): speculative decoding needs one")
    return SpecCacheView(model, k)


@dataclass
class _Item:
    req: Request
    n: int                 # scheduled tokens of its own (pending prompt / sampled token)
    drafts: list[int]
    ctx: int               # tokens cached before this step
    row: int               # first packed row in the forward
    accepted: int = 0
    tokens: list[int] = field(default_factory=list)  # to emit: accepted drafts + bonus
    logprobs: list = field(default_factory=list)     # their TokenLogprobs (when the request asked)
    stop: str | None = None


class Speculator:
    """Runs the engine's steps with drafts (module docstring). ``drafter`` defaults to the
    model's MTP head; any object with :class:`~hwinfer.engine.drafter.Drafter`'s method works."""

    def __init__(self, engine: Engine, k: int, drafter: Drafter | None = None) -> None:
        self.engine, self.k = engine, k
        self.drafter: Drafter = drafter or MTPDrafter(engine.model, engine.pool.cache)
        self.drafts: dict[str, tuple[int, list[int]]] = {}  # request id -> (its num_tokens then, drafts)
        self.stats = SpecStats()
        self.stateful = any(s.per == "request" for layer in engine.pool.cache.layers if layer
                            for s in layer.specs.values())

    def step(self) -> list[Request]:
        eng = self.engine
        scheduled = eng.scheduler.schedule()
        if not scheduled:
            if eng.scheduler.waiting and not eng.scheduler.running:
                raise RuntimeError("the cache pool cannot hold the next waiting request")
            return []
        running = {r.id for r in eng.scheduler.running}
        self.drafts = {rid: d for rid, d in self.drafts.items() if rid in running}
        items = self._attach_drafts(scheduled)
        ids = [t for it in items for t in it.req.tokens(it.ctx, it.ctx + it.n) + it.drafts]
        batch = request_batch(eng.pool.cache, [it.req for it in items], ids,
                              [it.n + len(it.drafts) for it in items], [it.ctx for it in items], eng.model.device)
        spec = [it for it in items if it.drafts]
        snapshot = self._snapshot(batch, spec) if self.stateful and spec else None
        hidden, mtp_input = eng.model.forward_batch_mtp(batch)
        self._verify(items, hidden)
        if snapshot is not None:
            self._replay(batch, spec, snapshot)
        jobs = []
        for it in items:
            self._emit(it)
            if it.stop is None:
                want = self._room(it.req) if it.tokens else 0
                jobs.append(DraftJob(it.req, it.ctx, it.req.num_computed, it.row, want))
        self._draft(batch, mtp_input, jobs)
        finished = []
        for it in items:
            # A stop among the accepted drafts cuts the output short of what the cache holds;
            # the request ends here, so only a full commit is offered to the prefix cache.
            if eng.prefix is not None and it.req.num_computed <= it.req.num_tokens:
                eng.prefix.register(it.req)
            if it.stop is not None:
                eng.scheduler.finish(it.req, it.stop)
                finished.append(it.req)
        eng.steps += 1
        return finished

    # --- the pieces of a step --------------------------------------------------------------------
    def _attach_drafts(self, scheduled: list[tuple[Request, int]]) -> list[_Item]:
        """Scheduled requests with the drafts they carry: only when this step finishes their
        pending tokens and their tokens did not change since drafting, within what is left of
        the token budget, and only as many as their blocks can grow to hold."""
        pool = self.engine.pool
        budget = self.engine.scheduler.token_budget - sum(n for _, n in scheduled)
        items, row = [], 0
        for req, n in scheduled:
            drafts: list[int] = []
            held = self.drafts.get(req.id)
            if held and held[0] == req.num_tokens and req.num_computed + n == req.num_tokens and budget > 0:
                drafts = held[1][:budget]
                end = req.num_computed + n + len(drafts)
                if not pool.grow(req, end):
                    drafts = drafts[:max(len(req.blocks) * pool.block_size - req.num_computed - n, 0)]
                budget -= len(drafts)
            items.append(_Item(req, n, drafts, req.num_computed, row))
            row += n + len(drafts)
        return items

    def _verify(self, items: list[_Item], hidden: torch.Tensor) -> None:
        """Sample the target at each request's last pending position and after each draft;
        commit the pending tokens and the accepted drafts; note what to emit."""
        eng = self.engine
        rows, row_reqs, steps, sampling = [], [], [], []
        for it in items:
            if it.ctx + it.n < it.req.num_tokens:
                it.req.num_computed += it.n  # a prefill chunk: nothing to sample yet
                continue
            sampling.append(it)
            for j in range(len(it.drafts) + 1):
                rows.append(it.row + it.n - 1 + j)
                row_reqs.append(it.req)
                steps.append(len(it.req.output_ids) + j)
        if not sampling:
            return
        index = host_to_device(rows, hidden.device)
        logits = eng.model.logits(hidden.index_select(0, index))
        targets = eng._sample(logits, row_reqs, steps)
        logprobs = eng._logprobs(logits, row_reqs, [int(t) for t in targets])
        at = 0
        for it in sampling:
            m = len(it.drafts)
            mine = [int(t) for t in targets[at:at + m + 1]]
            at += m + 1
            a = 0
            while a < m and mine[a] == it.drafts[a]:
                a += 1
            it.req.num_computed = it.ctx + it.n + a
            it.accepted, it.tokens = a, mine[:a + 1]
            it.logprobs = logprobs[at - m - 1:at - m + a]

    def _emit(self, it: _Item) -> None:
        """Append the item's tokens to its output up to a stop; count the verify."""
        eng, req, emitted = self.engine, it.req, 0
        for j, tok in enumerate(it.tokens):
            req.output_ids.append(tok)
            if j < len(it.logprobs) and it.logprobs[j] is not None:
                req.logprobs.append(it.logprobs[j])
            emitted += 1
            it.stop = eng._stop_reason(req, tok)
            if it.stop is not None:
                break
        if it.drafts:
            self.stats.verify_steps += 1
            self.stats.drafted += len(it.drafts)
            self.stats.accepted += it.accepted
            self.stats.emitted += emitted

    def _snapshot(self, batch, spec: list[_Item]) -> dict[int, dict[str, torch.Tensor]]:
        """Copy the per-request state of the drafting requests and ask the recurrent layers to
        record their inputs for those requests' rows."""
        device = batch.input_ids.device
        batch.capture = StateCapture(torch.cat([torch.arange(it.row, it.row + it.n + len(it.drafts), device=device)
                                                for it in spec]))
        slots = host_to_device([it.req.slot for it in spec], device)
        snap = {}
        for layer in self.engine.pool.cache.layers:
            names = [n for n, s in layer.specs.items() if s.per == "request"] if layer else []
            if names:
                snap[id(layer)] = {n: layer[n][slots].clone() for n in names}
        return snap

    def _replay(self, batch, spec: list[_Item], snapshot: dict[int, dict[str, torch.Tensor]]) -> None:
        """Rebuild the per-request state of requests that rejected a draft: the pre-forward copy
        advanced over their pending tokens and accepted drafts."""
        device = batch.input_ids.device
        picked, rows, lens, offset = [], [], [], 0
        for k, it in enumerate(spec):
            if it.accepted < len(it.drafts):
                picked.append(k)
                rows.append(torch.arange(offset, offset + it.n + it.accepted, device=device))
                lens.append(it.n + it.accepted)
            offset += it.n + len(it.drafts)
        records = batch.capture.records
        if {id(cache) for _, cache, _ in records} != set(snapshot):
            raise RuntimeError("a layer with per-request state recorded no inputs: it cannot be rolled back")
        if not picked:
            return
        keep, sel = torch.cat(rows), host_to_device(picked, device)
        cu = host_to_device(list(itertools.accumulate(lens, initial=0)), device, torch.int32)
        slots = host_to_device([spec[k].req.slot for k in picked], device)
        for layer, cache, inputs in records:
            state = {n: t.index_select(0, sel) for n, t in snapshot[id(cache)].items()}
            layer.replay(cache, slots, state, {n: t.index_select(0, keep) for n, t in inputs.items()}, cu)

    def _room(self, req: Request) -> int:
        """Drafts ``req`` can use next step: at most k, never past max_tokens (m drafts yield up
        to m + 1 tokens), and only as many as its blocks can hold (draft positions are written)."""
        want = min(self.k, req.params.max_tokens - len(req.output_ids) - 1)
        if want <= 0:
            return 0
        pool = self.engine.pool
        if not pool.grow(req, req.num_computed + want + 1):
            want = min(want, len(req.blocks) * pool.block_size - req.num_computed - 1)
        return max(want, 0)

    def _draft(self, batch, mtp_input: torch.Tensor, jobs: list[DraftJob]) -> None:
        if not jobs:
            return
        proposals = self.drafter.propose(batch, mtp_input, jobs, self.engine._sample)
        for job, drafts in zip(jobs, proposals):
            if drafts:
                self.drafts[job.req.id] = (job.req.num_tokens, list(drafts[:job.want]))
            else:
                self.drafts.pop(job.req.id, None)
