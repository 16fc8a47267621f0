"""Cache layouts as data: what each layer keeps per token, per window row and per request.

Every cache-owning layer declares a list of :class:`CacheTensor`. ``per``:

* ``"token"``: one row per token (``ratio`` > 1: one row per ``ratio`` tokens, e.g. DeepSeek-V4's
  compressed KV), paged: rows live in blocks of ``block_size`` tokens, found through the
  request's block table.
* ``"ring"``: ``rows`` rows per request, row = position % rows (a sliding window, a compressor's
  partial windows); old rows are overwritten, so speculative rollback needs no undo as long as
  ``rows`` leaves room for the draft tokens.
* ``"request"``: one fixed-size tensor per request (linear-attention and conv state).

The memory ledger (bytes per token, fixed bytes per request) is computed from this data alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheTensor:
    name: str
    per: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    ratio: int = 1
    rows: int = 0

    def __post_init__(self) -> None:
        if self.per not in ("token", "ring", "request"):
            raise ValueError(f"cache tensor {self.name}: per must be token, ring or request")
        if self.per == "ring" and self.rows <= 0:
            raise ValueError(f"cache tensor {self.name}: a ring needs rows > 0")

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def bytes_per_token(self) -> float:
        return self.row_bytes / self.ratio if self.per == "token" else 0.0

    def fixed_bytes(self) -> int:
        if self.per == "ring":
            return self.rows * self.row_bytes
        if self.per == "request":
            return self.row_bytes
        return 0
