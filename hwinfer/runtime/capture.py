"""StateCapture: what recurrent layers need to replay their per-request state over a prefix of
the tokens of a forward (speculative decoding's rollback; ENGINES.md §3.4, "ReplaySSM").

A verify forward advances a request's linear-attention and conv state over all its new tokens,
drafts included. Instead of keeping one state copy per draft position, each recurrent layer
records the per-token inputs of its state update (for the chosen packed rows only); after
acceptance the engine restores the state taken before the forward and the layer replays the
update over the accepted tokens alone: a few recurrence steps, no second forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StateCapture:
    """``rows`` [R] int64: packed token rows of the forward whose inputs are kept, in order."""

    rows: torch.Tensor
    records: list[tuple[Any, dict, dict[str, torch.Tensor]]] = field(default_factory=list)

    def record(self, layer: Any, cache: dict, **inputs: torch.Tensor) -> None:
        """Keep ``inputs`` (each token-major [T, ...]) at ``rows`` for ``layer``, whose cache dict
        is ``cache``. The layer implements ``replay(cache, slots, state, inputs, cu_seqlens)``."""
        self.records.append((layer, cache, {k: v.index_select(0, self.rows) for k, v in inputs.items()}))
