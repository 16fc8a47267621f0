"""What every model class shares: the full forward ``model(input_ids)``, cached generation, the
checkpoint layout contract.

A model file subclasses :class:`CausalLM` and supplies:

* ``__init__(config: dict, ops: OpTable, dtype)``: builds layers from the config (published and
  transformers field names accepted);
* ``forward_batch(batch: ForwardBatch) -> hidden [T, H]`` (final norm applied);
* ``cache_specs() -> list[list[CacheTensor]]``: one list per layer (empty: no cache);
* ``layouts() -> list[Layout]``: the checkpoint layouts it loads (published first, then
  transformers' ``save_pretrained`` layout);
* ``lm_head`` (a Linear) for the logits.

Optionally ``supports_fp8_kv()`` True when its ``cache_specs()`` honour ``kv_format == "fp8"``
(packed rows, see :meth:`CausalLM.set_kv_format`).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.model_cache import ModelCache, SimpleAllocator
from hwinfer.cache.spec import CacheTensor, check_kv_format
from hwinfer.loader.config import GenerationDefaults
from hwinfer.loader.weights import Layout
from hwinfer.runtime.batch import ForwardBatch


@dataclass
class GenerationOutput:
    """One request's result: the new token ids, their text, and why decoding stopped."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (eos or a stop string) or "length"


class CausalLM(nn.Module, metaclass=abc.ABCMeta):
    """Base class; see the module docstring for what a model file supplies."""

    config: dict[str, Any]
    ops: OpTable
    tokenizer: Any = None
    generation_defaults: GenerationDefaults = GenerationDefaults()
    # How cache_specs() asks the pool to store KV rows; see set_kv_format.
    kv_format: str = "auto"

    # --- supplied by the model file ---------------------------------------------------------
    @abc.abstractmethod
    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        """Packed tokens of ``batch`` -> final hidden states [T, H] (after the last norm)."""

    @abc.abstractmethod
    def cache_specs(self) -> list[list[CacheTensor]]:
        """Per layer, the cache tensors it keeps (empty list: none)."""

    @abc.abstractmethod
    def layouts(self) -> list[Layout]:
        """Checkpoint layouts this model loads: published first, then transformers'."""

    def supports_fp8_kv(self) -> bool:
        """Whether ``cache_specs()`` can declare packed FP8 KV rows (``kv_format="fp8"``)."""
        return False

    def set_kv_format(self, kv_format: str) -> None:
        """Choose how caches allocated from now on store KV rows (the engine's pool,
        ``new_cache``, ``generate``; caches already allocated keep their format, and layers tell
        the formats apart by the stored tensor's dtype, so they stay usable).

        * ``"auto"`` (default) and ``"bf16"``: every tensor in its declared dtype, i.e. KV rows
          in the model's compute dtype (bf16 on accelerators, fp32 on the CPU by default) and
          state in fp32 (the memory ledger's ``"auto"`` counts the same rows; its ``"deployed"``
          is each architecture's packed format): allocation never picks a lossy format by itself.
        * ``"fp8"``: the packed FP8 rows of the layers that support them, the other tensors in
          their declared dtype. Only DeepSeek-V4 supports it today (its sliding-window ring and
          compressed entries as 584-byte ``fp8_ds_mla`` rows; the indexer keys and compressor
          state keep their dtype); any other model raises a ValueError naming it rather than
          silently keeping bf16.

        Unknown names raise a ValueError naming ``kv_format``.
        """
        check_kv_format(kv_format)
        if kv_format == "fp8" and not self.supports_fp8_kv():
            name = (getattr(self, "config", None) or {}).get("model_type") or type(self).__name__
            raise ValueError(f"kv_format='fp8': {name} ({type(self).__name__}) has no cache hwinfer can store "
                             "in FP8 (today only DeepSeek-V4 attention with 512-wide heads and 64 RoPE "
                             "channels: fp8_ds_mla rows); use kv_format='auto' or 'bf16'")
        self.kv_format = kv_format

    def cache_block_size(self) -> int:
        """Tokens per cache block: a multiple of every compression ratio the model uses."""
        ratios = [s.ratio for layer in self.cache_specs() for s in layer if s.per == "token"]
        return max(16, math.lcm(*ratios)) if ratios else 16

    def build_head(self, hidden: int, vocab: int, dtype: torch.dtype, tied: bool) -> None:
        """``lm_head`` [vocab, hidden]; ``tied``: it is the input embedding (``embed_tokens``)."""
        from hwinfer.layers.basic import Linear

        self.tied = tied
        self.lm_head = Linear(hidden, vocab, dtype=dtype)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight

    def post_load(self) -> None:
        """Called once the weights are in: re-tie the head to the embedding (loading replaced
        the parameter objects); models add their own precomputation."""
        if getattr(self, "tied", False):
            self.lm_head.weight = self.embed_tokens.weight

    # --- shared ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> fp32 logits [T, V], rounded to the model dtype first (as the
        checkpoints' own code computes them); the product stores them in fp32 directly."""
        return self.lm_head(hidden, out_dtype=torch.float32)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full forward, no cache: input_ids [B, T] (or [T]) -> fp32 logits [B, T, V] (or [T, V])."""
        squeeze = input_ids.dim() == 1
        ids = input_ids[None] if squeeze else input_ids
        b, t = ids.shape
        batch = ForwardBatch.full(ids.reshape(-1).to(self.device), [t] * b)
        logits = self.logits(self.forward_batch(batch)).view(b, t, -1)
        return logits[0] if squeeze else logits

    def new_cache(self, batch: int, max_len: int) -> tuple[ModelCache, SimpleAllocator]:
        bs = self.cache_block_size()
        alloc = SimpleAllocator(batch, max_len, bs)
        cache = ModelCache.allocate(self.cache_specs(), num_slots=batch, num_blocks=alloc.num_blocks,
                                    block_size=bs, device=self.device)
        return cache, alloc

    @torch.no_grad()
    def generate(self, prompt: str | list[int] | list[str] | list[list[int]], *,
                 max_new_tokens: int = 32, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
                 stop: list[str] | str | None = None, add_special_tokens: bool = True
                 ) -> GenerationOutput | list[GenerationOutput]:
        """Decode with caches: one prefill of the prompts, then one token per step.

        ``prompt``: a string, token ids, or a list of either (a batch). Sampling defaults come
        from generation_config.json; ``temperature=0`` is greedy. ``seed`` makes sampling
        reproducible (request i uses seed + i). Returns one GenerationOutput, or a list for a batch.
        """
        from hwinfer.runtime.generate import run_generation

        return run_generation(self, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                              add_special_tokens=add_special_tokens)
