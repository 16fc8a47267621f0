"""The decode loop behind ``model.generate``: prefill once, then one token per step.

Finished requests leave the batch; their cache slots stay untouched until the loop ends. Stop
strings are matched on the decoded text of the new tokens (the text is cut before the match).
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from hwinfer.runtime.batch import ForwardBatch

if TYPE_CHECKING:
    from hwinfer.models.base import CausalLM, GenerationOutput


def _as_batch(model: "CausalLM", prompt, add_special_tokens: bool) -> tuple[list[list[int]], bool]:
    if isinstance(prompt, (list, tuple)) and len(prompt) == 0:
        raise ValueError("empty prompt: at least one token is needed")
    if isinstance(prompt, str):
        prompts, single = [prompt], True
    elif prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)], True
    else:
        prompts, single = list(prompt), False
    out = []
    for p in prompts:
        if isinstance(p, str):
            if model.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids")
            out.append(model.tokenizer.encode(p, add_special_tokens=add_special_tokens))
        elif isinstance(p, (list, tuple)) and all(isinstance(i, int) for i in p):
            out.append(list(p))
        else:
            raise ValueError("prompt must be a string, a list of token ids, or a list of those")
    return out, single


def run_generation(model: "CausalLM", prompt, *, max_new_tokens: int, temperature, top_p, top_k,
                   seed, stop, add_special_tokens: bool):
    prompts, single = _as_batch(model, prompt, add_special_tokens)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: at least one token is needed")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    vocab = model.config.get("vocab_size")
    for p in prompts:
        bad = [i for i in p if i < 0 or (vocab is not None and i >= vocab)]
        if bad:
            raise ValueError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab})")
    d = model.generation_defaults
    temperature = d.temperature if temperature is None else temperature
    top_p = d.top_p if top_p is None else top_p
    top_k = d.top_k if top_k is None else top_k
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    n = len(prompts)
    device = model.device
    base_seed = seed if seed is not None else random.randrange(1 << 62)

    cache, alloc = model.new_cache(n, max(len(p) for p in prompts) + max_new_tokens)
    block_table = alloc.block_table(device)
    slots = torch.arange(n, device=device)
    generated: list[list[int]] = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    active = list(range(n))
    ids = torch.tensor([t for p in prompts for t in p], device=device)
    new_lens, ctx = [len(p) for p in prompts], [0] * n
    step = 0
    while active:
        batch = ForwardBatch.step(ids, new_lens, ctx, cache, slots[active], block_table[active])
        hidden = model.forward_batch(batch)
        last = batch.cu_seqlens[1:].to(torch.int64) - 1
        logits = model.logits(hidden.index_select(0, last))
        m = len(active)
        tokens = model.ops.sample(
            logits, torch.full((m,), float(temperature), device=device),
            torch.full((m,), int(top_k), dtype=torch.int32, device=device),
            torch.full((m,), float(top_p), device=device),
            torch.tensor([base_seed + i for i in active], device=device),
            torch.full((m,), step, dtype=torch.int64, device=device)).tolist()
        still, next_ids, next_ctx = [], [], []
        for req, tok, c, nl in zip(active, tokens, ctx, new_lens):
            generated[req].append(tok)
            reason = _finished(model, generated[req], tok, stops, max_new_tokens)
            if reason:
                finish[req] = reason
            else:
                still.append(req)
                next_ids.append(tok)
                next_ctx.append(c + nl)
        active, ctx, new_lens = still, next_ctx, [1] * len(still)
        ids = torch.tensor(next_ids, device=device)
        step += 1
    outs = [_output(model, generated[i], finish[i] or "length", stops) for i in range(n)]
    return outs[0] if single else outs


def _finished(model, tokens: list[int], last: int, stops: list[str], limit: int) -> str | None:
    if last in model.generation_defaults.eos_token_ids:
        return "stop"
    if stops and model.tokenizer is not None:
        text = model.tokenizer.decode(tokens)
        if any(s in text for s in stops):
            return "stop"
    return "length" if len(tokens) >= limit else None


def _output(model, tokens: list[int], reason: str, stops: list[str]) -> "GenerationOutput":
    from hwinfer.models.base import GenerationOutput

    if tokens and tokens[-1] in model.generation_defaults.eos_token_ids:
        tokens = tokens[:-1]
    text = model.tokenizer.decode(tokens) if model.tokenizer is not None else ""
    for s in stops:
        cut = text.find(s)
        if cut >= 0:
            text = text[:cut]
    return GenerationOutput(tokens, text, reason)
