"""The engine loop: schedule, run one forward over every scheduled token, sample, finish.

One ``step()`` runs one forward pass over a packed batch that mixes decodes (one token each)
and prefill chunks, then samples a token for every request whose pending tokens are all in the
cache now. Sampling noise depends only on the request's seed and the token's index, so a
request's tokens are the same alone, batched, chunked or preempted and recomputed.
"""
from __future__ import annotations

import itertools
from typing import Iterable

import torch

from hwinfer.engine.graphs import DecodeGraphs
from hwinfer.engine.pool import CachePool, keeps_state, plan
from hwinfer.engine.prefill_graphs import PrefillGraphs
from hwinfer.engine.prefix_cache import PrefixCache
from hwinfer.engine.request import Request, RequestOutput, SamplingParams, Status, TokenLogprob
from hwinfer.engine.scheduler import Scheduler
from hwinfer.engine.speculative import Speculator, SpecStats, spec_cache_model
from hwinfer.runtime.batch import ForwardBatch, host_to_device

DEFAULT_CPU_BUDGET = 1 << 30
# The KV pool that `hwinfer serve` / `generate` / `chat` give a CPU engine when not told a size:
# a CPU step's time grows with the pool's size, so it stays modest.
CPU_CACHE_BYTES = 64 << 20


def _graph_option(model, wanted: bool | None, option: str, flag: str, phase: str,
                  speculative: int, why: str = "") -> bool:
    """Resolve ``cuda_graphs`` / ``prefill_graphs``: None = on for CUDA devices when the model
    declares a graph-safe ``phase`` forward (``flag``) and there is no speculation; an explicit
    request the model or speculation cannot honour is refused."""
    declared = getattr(model, flag, False)
    if wanted is None:
        return model.device.type == "cuda" and declared and not speculative
    if wanted and not declared:
        raise ValueError(f"{option}: {type(model).__name__} does not declare a graph-safe {phase} "
                         f"forward ({flag}){why}")
    if wanted and speculative:
        raise ValueError(f"{option} with speculative decoding is not supported yet")
    return wanted


class Engine:
    def __init__(self, model, *, max_num_seqs: int = 16, max_num_batched_tokens: int = 512,
                 cache_bytes: int | None = None, num_blocks: int | None = None,
                 block_size: int | None = None, enable_prefix_caching: bool = False,
                 prefix_chunk_tokens: int | None = None, prefix_checkpoints: int | None = None,
                 num_speculative_tokens: int = 0, cuda_graphs: bool | None = None,
                 graph_max_len: int | None = None, overlap: bool = True,
                 prefill_graphs: bool | None = None) -> None:
        """``cuda_graphs``: replay decode steps from CUDA graphs (:mod:`hwinfer.engine.graphs`);
        None = on for CUDA devices when the model declares a sync-free decode (``graph_decode``)
        and there is no speculation. True elsewhere runs the same fixed-size path eagerly.
        ``graph_max_len``: longest request a graph serves (default: the model's
        max_position_embeddings, at most 32,768); longer ones decode eagerly. ``overlap``: run
        consecutive graph decode steps overlapped with the host's work between them (the next
        step's input token taken from the device; finished requests are reported one step
        later). ``prefill_graphs``: replay a step that prefills one new request from CUDA graphs
        in token buckets (:mod:`hwinfer.engine.prefill_graphs`); None = on for CUDA devices when
        the model declares a graph-safe prefill (``graph_prefill``) and there is no
        speculation."""
        self.model = model
        bs = block_size or model.cache_block_size()
        # Speculative decoding: the pool also holds the MTP layer's cache and spare ring rows.
        cache_model = spec_cache_model(model, num_speculative_tokens)
        if num_blocks is None:
            num_blocks, _ = plan(cache_model, budget_bytes=cache_bytes or _default_budget(model),
                                 max_num_seqs=max_num_seqs, block_size=bs)
        checkpoints = 0
        if enable_prefix_caching:
            checkpoints = prefix_checkpoints if prefix_checkpoints is not None else 2 * max_num_seqs
        cuda_graphs = _graph_option(model, cuda_graphs, "cuda_graphs", "graph_decode", "decode",
                                    num_speculative_tokens, ": its decode reads host-side batch values")
        prefill_graphs = _graph_option(model, prefill_graphs, "prefill_graphs", "graph_prefill",
                                       "prefill", num_speculative_tokens)
        self.pool = CachePool(cache_model, num_blocks=num_blocks, num_slots=max_num_seqs, block_size=bs,
                              checkpoint_slots=checkpoints if keeps_state(model) else 0,
                              padding=bool(cuda_graphs or prefill_graphs))
        self.graphs = DecodeGraphs(model, self.pool, max_batch=max_num_seqs,
                                   max_len=graph_max_len) if cuda_graphs else None
        self.prefill_graphs = PrefillGraphs(model, self.pool, max_tokens=max_num_batched_tokens
                                            ) if prefill_graphs else None
        self.prefix = None
        if enable_prefix_caching:
            # Stateful models checkpoint their state per chunk: keep chunks coarse by default.
            chunk = prefix_chunk_tokens or (bs * -(-256 // bs) if self.pool.has_state else bs)
            self.prefix = PrefixCache(self.pool, chunk)
        self.scheduler = Scheduler(self.pool, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens, prefix=self.prefix)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.steps = 0
        self.spec = Speculator(self, num_speculative_tokens) if num_speculative_tokens else None
        # Overlapped decode (graph steps only; not with prefix caching, whose chunk hashes read
        # every token): see _launch_overlapped. ``overlap=False`` keeps one step at a time.
        self.overlap = overlap and self.graphs is not None and self.prefix is None
        self._inflight = None  # (requests, request id -> row, host tokens, event) of that step
        self.overlapped_steps = 0

    # --- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Request:
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        vocab = self.model.config.get("vocab_size")
        bad = [t for t in prompt_ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise ValueError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab})")
        params = params or SamplingParams()
        need = self.pool.blocks_for(len(prompt_ids) + params.max_tokens)
        if need > self.pool.num_blocks:
            raise ValueError(f"request needs {need} cache blocks, the pool has {self.pool.num_blocks}")
        req = Request(rid, list(prompt_ids), params)
        self.requests[rid] = req
        self.scheduler.add(req)
        return req

    def abort(self, request_id: str) -> None:
        """Stop a request now; everything it holds returns to the pool."""
        req = self.requests.get(request_id)
        if req is not None and req.status is not Status.FINISHED:
            self.scheduler.finish(req, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def spec_stats(self) -> SpecStats | None:
        """Draft / acceptance counters (None without speculative decoding)."""
        return self.spec.stats if self.spec is not None else None

    # --- the loop --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Request]:
        """One forward; returns the requests that finished in it (or, with an overlapped decode
        step in flight, in the step before it)."""
        if self.spec is not None:
            return self.spec.step()
        finished: list[Request] = []
        if self._inflight is not None and not self._overlappable():
            finished += self._resolve()  # the next step needs every token on the host
        scheduled = self.scheduler.schedule()
        if not scheduled:
            if self._inflight is not None:
                finished += self._resolve()
            if self.scheduler.waiting and not self.scheduler.running:
                raise RuntimeError("the cache pool cannot hold the next waiting request")
            return finished
        reqs = [r for r, _ in scheduled]
        logits = None
        if self.graphs is not None and self.graphs.fits(scheduled):
            if self.overlap and all(r.params.logprobs is None for r in reqs):
                launched = self._launch_overlapped(reqs)
                if launched is not None:
                    return finished + launched
            if self._inflight is None:  # (graphs just got disabled: run the step eagerly)
                logits = self.graphs.run(reqs)  # every request of a decode step samples
        if self._inflight is not None:
            finished += self._resolve()
            scheduled = [(r, n) for r, n in scheduled if r.status is Status.RUNNING]
            reqs = [r for r, _ in scheduled]
            if not scheduled:
                return finished
        if logits is None and self.prefill_graphs is not None and self.prefill_graphs.fits(scheduled):
            logits = self.prefill_graphs.run(*scheduled[0])   # None: just disabled, run eagerly
        if logits is None:
            logits = self._forward(scheduled)
        for r, n in scheduled:
            r.num_computed += n
            if self.prefix is not None:
                self.prefix.register(r)
        sampling = [i for i, r in enumerate(reqs) if r.num_pending == 0]
        finished = []
        if sampling:
            tokens = self._sample(logits, [reqs[i] for i in sampling])
            logprobs = self._logprobs(logits, [reqs[i] for i in sampling], tokens)
            for i, tok, lp in zip(sampling, tokens, logprobs):
                req = reqs[i]
                req.output_ids.append(tok)
                if lp is not None:
                    req.logprobs.append(lp)
                reason = self._stop_reason(req, tok)
                if reason:
                    self.scheduler.finish(req, reason)
                    finished.append(req)
        self.steps += 1
        return finished

    # --- overlapped decode: the host prepares step N+1 while the GPU runs step N ---------------
    def _overlappable(self) -> bool:
        """Whether the next step is certain to be a graph decode step of exactly the running
        requests (no admission, no prefill chunk, no preemption, no eager fallback), which is
        what lets it take the in-flight step's tokens from the device."""
        sched, pool, graphs = self.scheduler, self.pool, self.graphs
        running = sched.running
        if (not self.overlap or sched.waiting or not running or graphs is None or graphs.disabled
                or len(running) > min(graphs.sizes[-1], sched.token_budget)):
            return False
        need = 0
        for r in running:
            if (r.status is not Status.RUNNING or r.num_pending != 1 or r.num_computed == 0
                    or r.params.logprobs is not None):
                return False
            blocks = pool.blocks_for(r.num_tokens)
            if blocks > graphs.width:
                return False
            need += max(blocks - len(r.blocks), 0)
        return need <= len(pool.free_blocks)

    def _launch_overlapped(self, reqs: list[Request]) -> list[Request] | None:
        """Replay the step, sample on the device and start the copy of the tokens to the host,
        then read the previous step's tokens (which the GPU has finished while this one was
        being prepared): the GPU never waits for the host between steps. Returns the requests
        that finished in the previous step, or None when graphs just got disabled."""
        prev = self._inflight
        logits = self.graphs.run(reqs, prev[1] if prev is not None else None)
        if logits is None:
            return None
        if self.graphs.greedy and self._all_greedy(reqs):
            host, event = self.graphs.publish_argmax(len(reqs))
        else:
            host, event = self.graphs.publish(self._sample_device(logits, reqs))
        for r in reqs:
            r.num_computed += 1
            r.inflight += 1
        self._inflight = (reqs, {r.id: i for i, r in enumerate(reqs)}, host, event)
        self.steps += 1
        self.overlapped_steps += 1
        return self._resolve(prev) if prev is not None else []

    def _resolve(self, pending=None) -> list[Request]:
        """Read an overlapped step's tokens (default: the one in flight, which then no longer
        is) and finish its requests as a plain step would; a request that finished since (an
        end token in the step before, an abort) drops its token."""
        if pending is None:
            pending, self._inflight = self._inflight, None
        reqs, _, host, event = pending
        if event is not None:
            event.synchronize()
        finished = []
        for req, tok in zip(reqs, host.tolist()):
            req.inflight -= 1
            if req.status is Status.FINISHED:
                continue
            req.output_ids.append(tok)
            reason = self._stop_reason(req, tok)
            if reason:
                self.scheduler.finish(req, reason)
                finished.append(req)
        return finished

    def _forward(self, scheduled: list[tuple[Request, int]]) -> torch.Tensor:
        """Eager forward of a packed step -> logits [number of requests that sample, V]."""
        model, device = self.model, self.model.device
        reqs = [r for r, _ in scheduled]
        new = [n for _, n in scheduled]
        # Inputs copied without waiting for the device (ForwardBatch.from_host, pinned): a
        # blocking copy would wait for the work still queued before the step.
        ids = [t for r, n in scheduled for t in r.tokens(r.num_computed, r.num_computed + n)]
        batch = ForwardBatch.from_host(ids, new, [r.num_computed for r in reqs], self.pool.cache,
                                       [r.slot for r in reqs], [r.blocks for r in reqs], device)
        hidden = model.forward_batch(batch)
        # Rows whose request has no pending token after this step: the last token of each.
        ends = list(itertools.accumulate(new))
        last = [ends[i] - 1 for i, (r, n) in enumerate(scheduled) if r.num_pending == n]
        return model.logits(hidden.index_select(0, host_to_device(last, device)))

    def _sample(self, logits: torch.Tensor, reqs: list[Request], steps: list[int] | None = None) -> list[int]:
        """One token per row of ``logits`` for ``reqs`` (one per row); ``steps``: each row's
        output index (its sampling noise), by default the request's next one."""
        return self._sample_device(logits, reqs, steps).tolist()

    def _sample_device(self, logits: torch.Tensor, reqs: list[Request],
                       steps: list[int] | None = None) -> torch.Tensor:
        """As :meth:`_sample`, the tokens left on the device: int64 [rows]."""
        d, device = self.model.generation_defaults, logits.device
        steps = [len(r.output_ids) + r.inflight for r in reqs] if steps is None else steps

        if self._all_greedy(reqs):
            # The sampler's own rule (argmax, ties to the lowest id) without its parameter uploads.
            return self.model.ops.greedy_tokens(
                logits, torch.empty(logits.shape[0], dtype=torch.int64, device=device))

        def pick(value, default):
            return default if value is None else value
        temp = [float(pick(r.params.temperature, d.temperature)) for r in reqs]
        top_k = [int(pick(r.params.top_k, d.top_k)) for r in reqs]
        top_p = [float(pick(r.params.top_p, d.top_p)) for r in reqs]
        # Two uploads instead of five: float rows (temperature, top_p), integer rows (top_k, seed, step).
        # (pinned: a copy from pageable memory may wait for the stream)
        floats = host_to_device([temp, top_p], device, torch.float32)
        ints = host_to_device([top_k, [r.seed for r in reqs], steps], device, torch.int64)
        return self.model.ops.sample(logits, floats[0], ints[0], floats[1], ints[1], ints[2]).long()

    def _all_greedy(self, reqs: list[Request]) -> bool:
        """Whether every request samples greedily (temperature <= 0, its own or the model's)."""
        default = self.model.generation_defaults.temperature
        return all(float(default if r.params.temperature is None else r.params.temperature) <= 0
                   for r in reqs)

    @staticmethod
    def _logprobs(logits: torch.Tensor, reqs: list[Request], tokens: list[int]) -> list[TokenLogprob | None]:
        """Per row: the sampled token's logprob and the request's top-n alternatives, from the
        log_softmax of the fp32 logits (the model's distribution, before temperature / top-k /
        top-p); None for rows whose request did not ask. Sampling itself is untouched."""
        rows = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(reqs)
        if not rows:
            return out
        index = torch.tensor(rows, device=logits.device)
        lp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        chosen = lp.gather(1, torch.tensor([[tokens[i]] for i in rows], device=logits.device))[:, 0].tolist()
        n = max(reqs[i].params.logprobs for i in rows)
        top_v, top_i = (lp.topk(n, dim=-1) if n else (lp[:, :0], lp[:, :0].long()))
        top_v, top_i = top_v.tolist(), top_i.tolist()
        for k, i in enumerate(rows):
            want = reqs[i].params.logprobs
            out[i] = TokenLogprob(tokens[i], chosen[k], list(zip(top_i[k][:want], top_v[k][:want])))
        return out

    def _stop_reason(self, req: Request, token: int) -> str | None:
        if not req.params.ignore_eos and token in self.model.generation_defaults.eos_token_ids:
            return "stop"
        tok = self.model.tokenizer
        if req.params.stop and tok is not None:
            if any(s in tok.decode(req.output_ids) for s in req.params.stop):
                return "stop"
        return "length" if len(req.output_ids) >= req.params.max_tokens else None

    # --- convenience ---------------------------------------------------------------------------
    def output(self, req: Request) -> RequestOutput:
        tokens = list(req.output_ids)
        if req.finish_reason == "stop" and tokens and tokens[-1] in self.model.generation_defaults.eos_token_ids:
            tokens = tokens[:-1]
        text = self.model.tokenizer.decode(tokens) if self.model.tokenizer is not None else ""
        for s in req.params.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        logprobs = list(req.logprobs[:len(tokens)]) if req.params.logprobs is not None else None
        return RequestOutput(req.id, req.prompt_ids, tokens, text, req.finish_reason or "abort", logprobs)

    def run(self, requests: Iterable[Request]) -> list[RequestOutput]:
        """Step until every given request has finished; outputs in the given order."""
        reqs = list(requests)
        while any(r.status is not Status.FINISHED for r in reqs):
            self.step()
        for r in reqs:
            self.requests.pop(r.id, None)
        return [self.output(r) for r in reqs]


def _default_budget(model) -> int:
    if model.device.type == "cpu":
        return DEFAULT_CPU_BUDGET
    free, _ = torch.cuda.mem_get_info(model.device) if model.device.type == "cuda" else (DEFAULT_CPU_BUDGET, 0)
    return int(free * 0.8)
