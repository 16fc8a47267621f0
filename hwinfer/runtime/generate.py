"""``model.generate``: the same engine as the server and ``LLM``, sized for one call.

A fresh engine per call owns a pool just large enough for the prompts and their new tokens, so
nothing leaks between calls; continuous batching, chunked prefill and seeded sampling are the
engine's.
"""
from __future__ import annotations

from hwinfer.engine.engine import Engine
from hwinfer.engine.llm import prompt_ids
from hwinfer.engine.request import SamplingParams


def run_generation(model, prompt, *, max_new_tokens: int, temperature, top_p, top_k, seed, stop,
                   add_special_tokens: bool):
    prompts = prompt_ids(model, prompt, add_special_tokens)
    single = len(prompts) == 1 and (isinstance(prompt, str) or all(isinstance(t, int) for t in prompt))
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    bs = model.cache_block_size()
    blocks = sum(-(-(len(p) + max_new_tokens) // bs) for p in prompts)
    engine = Engine(model, max_num_seqs=len(prompts), num_blocks=blocks,
                    max_num_batched_tokens=max(512, max(len(p) for p in prompts)))
    reqs = [engine.add_request(p, SamplingParams(
        max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        seed=None if seed is None else seed + i, stop=stops)) for i, p in enumerate(prompts)]
    outs = engine.run(reqs)
    results = [model_output(o) for o in outs]
    return results[0] if single else results


def model_output(out):
    from hwinfer.models.base import GenerationOutput

    return GenerationOutput(out.token_ids, out.text, out.finish_reason)
