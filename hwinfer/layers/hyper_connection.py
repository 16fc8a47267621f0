"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4; MODELS.md §2.4).

The residual is N parallel streams ``X`` [T, N, H]. Around every sub-block (attention, MoE),
:class:`HyperConnection` collapses the streams into the block input with ``mhc_pre`` (which also
yields the ``post`` weights and the Sinkhorn-normalised ``comb`` mixing matrix), runs the block,
and writes its output back with ``mhc_post``: ``X'_k = post_k * y + sum_j comb[j, k] * X_j``.
:class:`HyperHead` collapses the streams once more before the final norm (``mhc_head``).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from hwinfer.backend.select import OpTable


def _fp32(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=torch.float32), requires_grad=False)


class HyperConnection(nn.Module):
    """mHC around one sub-block. Parameters (fp32): ``fn`` [(2+N)N, N*H], ``base`` [(2+N)N],
    ``scale`` [3] (pre, post, comb multipliers); checkpoint ``hc_attn_*`` / ``hc_ffn_*``."""

    def __init__(self, ops: OpTable, hidden: int, streams: int, *, norm_eps: float, hc_eps: float,
                 sinkhorn_iters: int) -> None:
        super().__init__()
        width = (2 + streams) * streams
        self.fn, self.base, self.scale = _fp32(width, streams * hidden), _fp32(width), _fp32(3)
        self.norm_eps, self.hc_eps, self.iters = norm_eps, hc_eps, sinkhorn_iters
        self.ops = ops

    def forward(self, streams: torch.Tensor, block: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """streams [T, N, H]; ``block`` maps the collapsed input [T, H] to its output [T, H].
        Returns the updated streams [T, N, H]."""
        x, post, comb = self.ops.mhc_pre(streams, self.fn, self.base, self.scale, norm_eps=self.norm_eps,
                                         hc_eps=self.hc_eps, sinkhorn_iters=self.iters)
        return self.ops.mhc_post(block(x), streams, post, comb)


class HyperHead(nn.Module):
    """Final stream collapse: [T, N, H] -> [T, H]. Parameters (fp32): ``fn`` [N, N*H], ``base``
    [N], ``scale`` [1]; checkpoint ``hc_head_fn`` / ``hc_head_base`` / ``hc_head_scale``."""

    def __init__(self, ops: OpTable, hidden: int, streams: int, *, norm_eps: float, hc_eps: float) -> None:
        super().__init__()
        self.fn, self.base, self.scale = _fp32(streams, streams * hidden), _fp32(streams), _fp32(1)
        self.norm_eps, self.hc_eps = norm_eps, hc_eps
        self.ops = ops

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        return self.ops.mhc_head(streams, self.fn, self.base, self.scale, norm_eps=self.norm_eps,
                                 hc_eps=self.hc_eps)
