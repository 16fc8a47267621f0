"""Small building blocks shared by every model: linear, embedding, RMSNorm, dense MLP.

Layers own parameters and call ops through the OpTable given at construction (bound functions,
no lookup per call); none of them names a device or vendor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hwinfer.backend.select import OpTable


class Linear(nn.Module):
    """y = x W^T (+ b). weight [out, in] in the model dtype (quantized checkpoints are
    dequantized at load)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """ids [T] -> [T, H]."""

    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """ops.rms_norm with a stored weight [D] (fp32); ``offset=1.0`` is the zero-centred form."""

    def __init__(self, ops: OpTable, dim: int, eps: float, offset: float = 0.0, weighted: bool = True) -> None:
        super().__init__()
        self.rms_norm = ops.rms_norm
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32), requires_grad=False) if weighted else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(x, self.weight, eps=self.eps, weight_offset=self.offset)


class GatedMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); x [T, H] -> [T, H]."""

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype,
                 activation: str = "silu") -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, dtype=dtype)
        self.up_proj = Linear(hidden, intermediate, dtype=dtype)
        self.down_proj = Linear(intermediate, hidden, dtype=dtype)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate_proj(x)
        act = F.silu(g) if self.activation == "silu" else F.gelu(g, approximate="tanh")
        return self.down_proj(act * self.up_proj(x))
