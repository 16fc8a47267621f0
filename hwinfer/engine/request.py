"""Requests and their sampling parameters, as the engine tracks them."""
from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How one request decodes. ``temperature=None`` (etc.) takes the model's
    generation_config.json default; ``temperature=0`` is greedy."""

    max_tokens: int = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None      # record logprobs: None off; n >= 0 top alternatives too

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables it)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")


@dataclass
class TokenLogprob:
    """One sampled token's log-probability under the model's distribution (log_softmax of the
    fp32 logits, before temperature / top-k / top-p), and the ``n`` most likely alternatives as
    ``(token_id, logprob)``, most likely first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """One request: its tokens, how many of them the cache holds, and what it owns in the pool."""

    id: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0            # tokens whose KV / state is in the cache
    blocks: list[int] = field(default_factory=list)
    slot: int | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    seed: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, when asked
    # Tokens sampled on the device by an overlapped decode step whose values the host has not
    # read yet (hwinfer.engine.engine: at most two); they count in num_tokens.
    inflight: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.id}: empty prompt")
        self.seed = self.params.seed if self.params.seed is not None else random.randrange(1 << 62)

    @property
    def all_ids(self) -> list[int]:
        """Prompt then output, as a new list (a copy of every token: per step, use ``tokens``)."""
        return self.prompt_ids + self.output_ids

    def tokens(self, start: int, stop: int) -> list[int]:
        """``all_ids[start:stop]`` without building all_ids (the engine reads a request's next
        tokens every step; at b=32 with 1k-token prompts the copies took ~100 us a step)."""
        p = len(self.prompt_ids)
        if stop > p + len(self.output_ids) and self.inflight:
            raise RuntimeError(f"request {self.id}: tokens [{start}, {stop}) include one sampled on "
                               "the device and not read back yet")
        if stop <= p:
            return self.prompt_ids[start:stop]
        if start >= p:
            return self.output_ids[start - p:stop - p]
        return self.prompt_ids[start:] + self.output_ids[:stop - p]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) + self.inflight

    @property
    def num_pending(self) -> int:
        """Tokens not yet in the cache (the prompt's rest, or the last sampled token)."""
        return self.num_tokens - self.num_computed


@dataclass
class RequestOutput:
    """A finished request: its new tokens, their text, and why decoding stopped."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked
