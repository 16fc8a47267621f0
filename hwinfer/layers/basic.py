"""Small building blocks shared by every model: linear, embedding, RMSNorm, dense MLP.

Layers own parameters and call ops through the OpTable given at construction (bound functions,
no lookup per call); none of them names a device or vendor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.ops.activation import gated_act
from hwinfer.ops.dense import add_rms_norm_linear, rms_norm_gated_linear


class Linear(nn.Module):
    """y = x W^T (+ b). weight [out, in] in the model dtype (quantized checkpoints are
    dequantized at load). Runs the model's ``linear`` op once :func:`bind_dense_ops` has bound
    it (the loaders do); F.linear before that."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None
        self.matmul = F.linear
        # ``rms_norm_gated_linear`` (the reference until bind_dense_ops binds the device's op);
        # like ``matmul``, the one entry a tensor-parallel wrap reduces around.
        self.gated_norm_matmul = rms_norm_gated_linear

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [..., in] -> [..., out] rounded to x.dtype, returned in ``out_dtype`` (default
        x.dtype; the ``linear`` op stores it there directly, e.g. the lm_head's fp32 logits)."""
        if out_dtype is None or out_dtype == x.dtype:
            return self.matmul(x, self.weight, self.bias)
        if self.matmul is F.linear:   # before bind_dense_ops
            return F.linear(x, self.weight, self.bias).to(out_dtype)
        return self.matmul(x, self.weight, self.bias, out_dtype=out_dtype)

    def gated_norm(self, x: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor | None, *,
                   eps: float, activation: str) -> torch.Tensor:
        """self(rms_norm_gated(x, gate, norm_weight).reshape(T, -1)) with the norm inside the
        product (one GEMV in decode); x, gate [T, H, D] -> [T, out]."""
        y = self.gated_norm_matmul(x, gate, norm_weight, self.weight, eps=eps, activation=activation)
        return y if self.bias is None else y + self.bias


def bind_dense_ops(model: nn.Module, ops) -> None:
    """Make every Linear of ``model`` run the OpTable's ``linear`` (and ``rms_norm_gated_linear``)
    op and every GatedMLP its ``gated_act`` and ``add_rms_norm_linear`` (layers built without an
    OpTable run plain torch / the references until then)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.matmul = ops.linear
            module.gated_norm_matmul = ops.rms_norm_gated_linear
        elif isinstance(module, GatedMLP):
            module.gated_act = ops.gated_act
            module.add_rms_norm_linear = ops.add_rms_norm_linear


def _reduces(linear: Linear) -> bool:
    """Whether ``linear``'s matmul sums its output across ranks (a row-parallel shard): a fused
    op called with its weight directly would skip that sum."""
    return getattr(linear.matmul, "row_parallel", False)


class MergedProjection:
    """Linear layers that read the same input, run as one GEMM (one weight read, one launch).

    On first use (after loading) their weights are stacked once and each layer's parameter
    becomes a view into the stack, so nothing is stored twice and checkpoint names are
    unchanged; a plain object, not a module, so it adds no parameter names. Calling returns each
    layer's output, as views of one result: x [..., in] -> tuple of [..., out_i]."""

    def __init__(self, *linears: Linear) -> None:
        self.linears = linears
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._ptrs: list[int] = []

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stacked (weight [sum of outs, in], bias or None), re-stacked if a layer's weight
        was replaced since (loading, .to(), re-tying)."""
        if [l.weight.data_ptr() for l in self.linears] != self._ptrs:
            self._stack()
        return self.weight, self.bias

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weight, bias = self.stacked()
        return self.parts(self.linears[0].matmul(x, weight, bias))

    def fusable(self) -> bool:
        """Whether an op that takes the stacked weight directly computes this projection (no bias
        to add, no sum across ranks to make)."""
        return self.stacked()[1] is None and not _reduces(self.linears[0])

    def parts(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The stacked projection's output [..., sum of outs] as each layer's part (views)."""
        return y.split([l.weight.shape[0] for l in self.linears], dim=-1)

    def add_norm(self, op, x: torch.Tensor, residual: torch.Tensor,
                 norm: "RMSNorm") -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """(this projection of norm(x + residual), as its parts; x + residual) through ``op``, the
        bound ``add_rms_norm_linear`` (one GEMV in decode); with a bias, the ops one by one."""
        if not self.fusable():
            h, residual = norm.add(x, residual)
            return self(h), residual
        y, residual = op(x, residual, norm.weight, self.weight, eps=norm.eps, weight_offset=norm.offset)
        return self.parts(y), residual

    @staticmethod
    def joined(parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Adjacent outputs of one call as one view [..., sum of their widths] (no copy)."""
        first = parts[0]
        return first.as_strided((*first.shape[:-1], sum(p.shape[-1] for p in parts)), first.stride(),
                                first.storage_offset())

    def _offsets(self) -> list[int]:
        sizes = [l.weight.shape[0] for l in self.linears]
        return [sum(sizes[:i]) for i in range(len(sizes))]

    def _stack(self) -> None:
        self.weight = torch.cat([l.weight.data for l in self.linears])
        if any(l.bias is not None for l in self.linears):
            self.bias = torch.cat([l.bias.data if l.bias is not None else
                                   self.weight.new_zeros(l.weight.shape[0]) for l in self.linears])
        for l, o in zip(self.linears, self._offsets()):
            l.weight.data = self.weight[o:o + l.weight.shape[0]]
            if self.bias is not None and l.bias is not None:
                l.bias.data = self.bias[o:o + l.weight.shape[0]]
        self._ptrs = [l.weight.data_ptr() for l in self.linears]


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
        self.rms_norm, self.add_rms_norm = ops.rms_norm, ops.add_rms_norm
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32), requires_grad=False) if weighted else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(x, self.weight, eps=self.eps, weight_offset=self.offset)

    def add(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one op; residual None: (norm(x), x)."""
        if residual is None:
            return self(x), x
        return self.add_rms_norm(x, residual, self.weight, eps=self.eps, weight_offset=self.offset)


class GatedMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); x [T, H] -> [T, H]."""

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype,
                 activation: str = "silu") -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, dtype=dtype)
        self.up_proj = Linear(hidden, intermediate, dtype=dtype)
        self.down_proj = Linear(intermediate, hidden, dtype=dtype)
        self.activation = activation
        self.gate_up = MergedProjection(self.gate_proj, self.up_proj)
        # the references until bind_dense_ops binds the device's ops
        self.gated_act, self.add_rms_norm_linear = gated_act, add_rms_norm_linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x)
        return self.down_proj(self.gated_act(g, u, activation=self.activation))

    def add_norm_forward(self, x: torch.Tensor, residual: torch.Tensor,
                         norm: "RMSNorm") -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual) with the add, the norm, the gate|up
        projection and the activation as one op (one GEMV in decode); x, residual [T, H]."""
        weight, bias = self.gate_up.stacked()
        if bias is not None or _reduces(self.gate_proj):  # no fused form: the ops one by one
            h, residual = norm.add(x, residual)
            return self(h), residual
        a, residual = self.add_rms_norm_linear(x, residual, norm.weight, weight, eps=norm.eps,
                                               weight_offset=norm.offset, activation=self.activation)
        return self.down_proj(a), residual
