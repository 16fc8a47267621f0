"""Gated activations: the middle of a GLU MLP (SwiGLU / GeGLU)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.contract import Case, Tol, define_op, randn

ACTIVATIONS = ("silu", "gelu_tanh")


def gated_act(gate: torch.Tensor, up: torch.Tensor, *, activation: str = "silu",
              limit: float | None = None) -> torch.Tensor:
    """``act(gate) * up``, the product in the middle of a gated MLP, computed in fp32 and cast to
    ``gate.dtype`` once (a fused impl may do one rounding where torch's two-step eager form
    rounds twice; within the tolerance).

    ``act``: "silu" (SwiGLU: Qwen3.5, Kimi, DeepSeek shared experts, ``hidden_act="silu"``) or
    "gelu_tanh" (GeGLU: Gemma 4, ``hidden_activation="gelu_pytorch_tanh"``). ``limit`` (DeepSeek-V4's
    clamped SwiGLU, ``swiglu_limit``): gate clamped to at most ``limit`` and up to [-limit, limit]
    before the product (clamping is exact in any dtype).

    Shapes: gate, up [..., I] of one float dtype; they may be strided views (the two halves of
    one merged gate|up projection). Returns [..., I] contiguous in gate.dtype.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"gated_act: activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}")
    if up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(f"gated_act: up {up.dtype} {list(up.shape)} must match gate {gate.dtype} "
                         f"{list(gate.shape)}")
    if limit is not None and not limit > 0:
        raise ValueError(f"gated_act: limit must be positive, not {limit!r}")
    g, u = gate.float(), up.float()
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    a = F.silu(g) if activation == "silu" else F.gelu(g, approximate="tanh")
    return (a * u).to(gate.dtype)


def _case(rows: int, inter: int, activation: str, merged: bool, limit: float | None = None):
    def make(gen, dtype, device):
        if merged:  # the halves of one [T, 2I] projection output, as GatedMLP passes them
            both = randn(gen, rows, 2 * inter, dtype=dtype, device=device, scale=2.0)
            gate, up = both[:, :inter], both[:, inter:]
        else:
            gate = randn(gen, rows, inter, dtype=dtype, device=device, scale=2.0)
            up = randn(gen, rows, inter, dtype=dtype, device=device)
        return {"gate": gate, "up": up, "activation": activation, "limit": limit}
    return make


GATED_ACT = define_op(
    gated_act,
    family="activation",
    cases=[
        Case("swiglu_merged_3584", _case(4, 3584, "silu", True)),
        Case("swiglu_odd_1000", _case(3, 1000, "silu", False)),
        Case("geglu_merged_512", _case(5, 512, "gelu_tanh", True)),
        # gate ~ 2 randn, up ~ randn: a limit of 1.5 clamps both (DeepSeek-V4 uses 10)
        Case("swiglu_clamped_700", _case(3, 700, "silu", False, limit=1.5)),
    ],
    tolerance={torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)},
)
