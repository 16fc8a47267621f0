"""Draft proposers for speculative decoding: the checkpoint's MTP head, or any object with the
same ``propose`` method (tests plug in an oracle).

After every engine forward the speculator hands the drafter one :class:`DraftJob` per request
still running: the positions the forward committed and how many drafts the request wants for
its next step. The MTP drafter needs both, because the MTP layer has its own cache:

* **Cache fill.** MTP position ``p`` is computed from the main model's hidden state at ``p`` and
  the token at ``p + 1``; its KV (Qwen3.5: paged per token; DeepSeek-V4: a sliding-window ring)
  is kept like any layer's, in the same pool, block table and slot. Every committed position
  ``start .. end-1`` of every forward (prefill chunks included) is run through the MTP layer,
  so its cache always covers ``0 .. num_computed-1``.
* **Chained drafts.** The last committed position (``end - 1``, token ``end`` = the token just
  sampled) gives draft 1; draft ``s + 1`` runs the MTP layer at position ``end + s - 1`` on
  draft ``s`` and the MTP's own output hidden. These positions are written ahead of the main
  model and rewritten once the real tokens are known (paged rows are position-indexed; rings
  have spare rows).

Drafts are picked with the engine's sampler with the request's seed and the output index each
draft would occupy, i.e. the same noise the target will use: for greedy requests that is the
MTP's argmax; for sampled ones the drafts are coupled to the target's draw, which raises the
chance that they match without changing what the target samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from hwinfer.cache.model_cache import ModelCache
from hwinfer.engine.request import Request
from hwinfer.runtime.batch import ForwardBatch, host_to_device

# (logits [R, V], the request of each row, the output index of each row) -> token ids
SampleFn = Callable[[torch.Tensor, list[Request], list[int]], list[int]]


@dataclass
class DraftJob:
    """One request after a forward: it committed positions ``start .. end-1``, which are rows
    ``row .. row + end - start - 1`` of that forward's packed tokens; it wants ``want`` drafts
    (0: none, e.g. a prefill chunk that sampled nothing)."""

    req: Request
    start: int
    end: int
    row: int
    want: int


class Drafter(Protocol):
    def propose(self, batch: ForwardBatch, mtp_input: torch.Tensor, jobs: list[DraftJob],
                sample: SampleFn) -> list[list[int]]:
        """Drafts per job (``len <= job.want``). ``mtp_input`` [T, ...] is what the model's
        ``forward_batch_mtp`` returned beside the hidden states, for ``batch``'s packed tokens."""


def request_batch(cache: ModelCache, reqs: list[Request], ids: list[int], new: list[int],
                  ctx: list[int], device: torch.device) -> ForwardBatch:
    """A cached step over ``reqs``: request i adds ``new[i]`` tokens (from ``ids``, packed) after
    ``ctx[i]`` cached ones, through its own blocks and slot."""
    return ForwardBatch.from_host(ids, new, ctx, cache, [r.slot for r in reqs],
                                  [r.blocks for r in reqs], device)


class MTPDrafter:
    """Drafts with ``model.mtp_forward`` (see the module docstring); ``cache`` is the pool's
    ModelCache, whose layers after the main ones belong to the MTP layer."""

    def __init__(self, model, cache: ModelCache) -> None:
        self.model, self.cache = model, cache

    def propose(self, batch: ForwardBatch, mtp_input: torch.Tensor, jobs: list[DraftJob],
                sample: SampleFn) -> list[list[int]]:
        model, device = self.model, mtp_input.device
        drafts: list[list[int]] = [[] for _ in jobs]
        live = [i for i, j in enumerate(jobs) if j.end > j.start]
        if not live:
            return drafts
        # 1. The committed positions, each with the token that follows it.
        reqs = [jobs[i].req for i in live]
        rows = torch.cat([torch.arange(jobs[i].row, jobs[i].row + jobs[i].end - jobs[i].start, device=device)
                          for i in live])
        ids = [t for i in live for t in jobs[i].req.tokens(jobs[i].start + 1, jobs[i].end + 1)]
        new = [jobs[i].end - jobs[i].start for i in live]
        step = request_batch(self.cache, reqs, ids, new, [jobs[i].start for i in live], device)
        head, state = model.mtp_forward(mtp_input.index_select(0, rows), step)
        # 2. Draft 1 from each wanting request's last committed position, then chain.
        wanting = [k for k, i in enumerate(live) if jobs[i].want > 0]
        if not wanting:
            return drafts
        last = host_to_device([sum(new[:k + 1]) - 1 for k in wanting], device)
        head, state = head.index_select(0, last), state.index_select(0, last)
        active = [live[k] for k in wanting]
        for s in range(max(jobs[i].want for i in active)):
            if s:
                keep = [k for k, i in enumerate(active) if jobs[i].want > s]
                sel = host_to_device(keep, device)
                active = [active[k] for k in keep]
                step = request_batch(self.cache, [jobs[i].req for i in active], [drafts[i][-1] for i in active],
                                     [1] * len(active), [jobs[i].end + s - 1 for i in active], device)
                head, state = model.mtp_forward(state.index_select(0, sel), step)
            picked = sample(model.logits(head), [jobs[i].req for i in active],
                            [len(jobs[i].req.output_ids) + s for i in active])
            for i, tok in zip(active, picked):
                drafts[i].append(int(tok))
        return drafts
