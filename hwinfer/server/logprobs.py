"""Per-token logprobs for the OpenAI formats.

The engine records, per output token, its log-probability under the model's distribution and
the top alternatives as token ids (:class:`~hwinfer.engine.request.TokenLogprob`). The engine
thread turns those into :class:`TokenInfo` (text, bytes, character offset) as it streams, and the
routes lay them out as chat ``logprobs.content`` entries or the legacy completions object.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hwinfer.engine.request import TokenLogprob

FLOOR = -9999.0  # JSON has no -inf; a token the model rules out gets this instead


@dataclass
class TokenInfo:
    """One generated token, described for a client."""

    token: str
    bytes: list[int]
    logprob: float
    offset: int                                   # character offset in the choice's text
    top: list[tuple[str, list[int], float]] = field(default_factory=list)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def describe(tokenizer, output_ids: list[int], records: list[TokenLogprob], start: int) -> list[TokenInfo]:
    """TokenInfo for ``records`` (the logprobs of ``output_ids[start:]``, in order)."""

    def text_of(tid: int) -> tuple[str, list[int]]:
        return tokenizer.decode([tid], skip_special_tokens=False), list(tokenizer.token_bytes(tid))

    out = []
    for j, rec in enumerate(records):
        offset = len(tokenizer.decode(output_ids[:start + j])) if start + j else 0
        token, raw = text_of(rec.token_id)
        top = [(*text_of(tid), _finite(lp)) for tid, lp in rec.top]
        out.append(TokenInfo(token, raw, _finite(rec.logprob), offset, top))
    return out


def chat_logprobs(infos: list[TokenInfo]) -> dict[str, Any]:
    """``choices[i].logprobs`` of a chat completion (or of one streamed chunk)."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                         "top_logprobs": [{"token": s, "logprob": lp, "bytes": b} for s, b, lp in t.top]}
                        for t in infos], "refusal": None}


def completion_logprobs(infos: list[TokenInfo]) -> dict[str, Any]:
    """``choices[i].logprobs`` of a (legacy) completion: parallel lists per token. Alternatives
    whose text coincides keep the likelier one (the format keys them by text)."""
    tops = []
    for t in infos:
        entry: dict[str, float] = {}
        for s, _, lp in t.top:
            entry.setdefault(s, lp)
        tops.append(entry)
    return {"tokens": [t.token for t in infos], "token_logprobs": [t.logprob for t in infos],
            "top_logprobs": tops, "text_offset": [t.offset for t in infos]}
