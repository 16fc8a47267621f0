"""The offline API: ``LLM(path, device=...).generate(prompts, SamplingParams(...))``."""
from __future__ import annotations

from pathlib import Path

from hwinfer.engine.engine import Engine
from hwinfer.engine.request import RequestOutput, SamplingParams


class LLM:
    """A loaded model and its engine. ``generate`` runs a batch of prompts (strings or token
    ids) through continuous batching and returns one RequestOutput per prompt, in order."""

    def __init__(self, path: str | Path, device: str = "auto", dtype=None, *, max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 512, cache_bytes: int | None = None,
                 enable_prefix_caching: bool = False, num_speculative_tokens: int = 0,
                 **load_kwargs) -> None:
        from hwinfer.api import load_model

        self.model = load_model(path, device=device, dtype=dtype, **load_kwargs)
        self.engine = Engine(self.model, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, cache_bytes=cache_bytes,
                             enable_prefix_caching=enable_prefix_caching,
                             num_speculative_tokens=num_speculative_tokens)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        batch = prompt_ids(self.model, prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(batch)
        if len(params) != len(batch):
            raise ValueError(f"{len(params)} sampling params for {len(batch)} prompts")
        reqs = [self.engine.add_request(ids, p or SamplingParams()) for ids, p in zip(batch, params)]
        return self.engine.run(reqs)


def prompt_ids(model, prompts, add_special_tokens: bool = True) -> list[list[int]]:
    """Normalise one prompt or a batch (strings or token-id lists) to token-id lists."""
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                    and all(isinstance(t, int) for t in prompts)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("empty prompt: at least one token is needed")
    out = []
    for p in prompts:
        if isinstance(p, str):
            if model.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids")
            out.append(model.tokenizer.encode(p, add_special_tokens=add_special_tokens))
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
            out.append(list(p))
        else:
            raise ValueError("prompt must be a string, a list of token ids, or a list of those")
        if not out[-1]:
            raise ValueError("empty prompt: at least one token is needed")
    return out
