"""``linear`` (contract: :func:`hwinfer.ops.dense.linear`) as torch's own F.linear in the input
dtype: the vendor BLAS, accumulating in fp32 on GPUs."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] in x.dtype."""
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return F.linear(x, weight, None if bias is None else bias.to(x.dtype))
