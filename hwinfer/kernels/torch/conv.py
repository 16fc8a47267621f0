"""Vectorised torch implementation of ``causal_conv1d`` (contract: :mod:`hwinfer.ops.conv`).

All sequences at once, channels last: each sequence's cached K-1 inputs are laid out in front
of its tokens in one fp32 buffer, the K taps are accumulated in place into one output buffer
(``addcmul_``), and outputs and new states are read back from it. On CPU this beats a
depthwise ``F.conv1d`` (groups = C), whose [B, C, T] layout costs two transposed copies: for
these memory-bound shapes every large temporary counts, first-touch page faults included.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.conv import check_conv_inputs, on_conv_state_slots

_FEW = 8  # up to this many packed sequences, per-sequence slice copies beat row indexing


def _taps(xx: torch.Tensor, w32: torch.Tensor, b32: torch.Tensor | None,
          length: int) -> torch.Tensor:
    """``y[..., t, :] = bias + sum_j w[:, j] * xx[..., t + j, :]`` for t < length (fp32)."""
    K = w32.shape[1]
    y = xx[..., K - 1:K - 1 + length, :] * w32[:, K - 1]
    for j in range(K - 1):
        y.addcmul_(xx[..., j:j + length, :], w32[:, j])
    if b32 is not None:
        y += b32
    return y


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  state: torch.Tensor | None = None, *, activation: str | None = "silu",
                  cu_seqlens: torch.Tensor | None = None,
                  state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``causal_conv1d`` (same contract): in-place tap accumulation over state-prefixed inputs."""
    if state_slots is not None:
        return on_conv_state_slots(causal_conv1d, x, weight, bias, state, state_slots,
                                   activation=activation, cu_seqlens=cu_seqlens)
    w, bounds = check_conv_inputs(x, weight, bias, state, activation, cu_seqlens)
    B, T, C = x.shape
    K = w.shape[1]
    w32 = w.float()
    b32 = None if bias is None else bias.float()
    dev = x.device
    if bounds is None:
        xx = torch.empty(B, K - 1 + T, C, dtype=torch.float32, device=dev)
        if state is None:
            xx[:, :K - 1] = 0
        else:
            xx[:, :K - 1] = state.transpose(1, 2)
        xx[:, K - 1:] = x
        y = _taps(xx, w32, b32, T)
        new_state = xx[:, T:].transpose(1, 2)                           # last K-1 inputs
    else:
        # Sequence i occupies rows [r_i, r_i + K-1 + L_i) of one buffer, r_i = bos_i + i (K-1):
        # its K-1 cached inputs, then its tokens; token bos_i + j's output is row r_i + j.
        n = len(bounds) - 1
        starts = [bounds[i] + i * (K - 1) for i in range(n)]
        xx = torch.empty(T + n * (K - 1), C, dtype=torch.float32, device=dev)
        if n <= _FEW:  # few (long) sequences: slice copies, converting x once
            for i, r in enumerate(starts):
                xx[r:r + K - 1] = 0 if state is None else state[i].t()
                xx[r + K - 1:r + K - 1 + bounds[i + 1] - bounds[i]] = x[0, bounds[i]:bounds[i + 1]]
        else:  # many short sequences: one row scatter instead of a loop
            lengths = torch.tensor([e - b for b, e in zip(bounds, bounds[1:])], device=dev)
            seq = torch.repeat_interleave(torch.arange(n, device=dev), lengths, output_size=T)
            xx[torch.arange(T, device=dev) + (seq + 1) * (K - 1)] = x[0].float()
            slots = torch.tensor(starts, device=dev)[:, None] + torch.arange(K - 1, device=dev)
            xx[slots.reshape(-1)] = (0 if state is None
                                     else state.transpose(1, 2).reshape(-1, C).float())
        y_all = _taps(xx, w32, b32, T + (n - 1) * (K - 1))
        if activation == "silu":
            F.silu(y_all, inplace=True)
        ends = torch.tensor([r + b - a for r, a, b in zip(starts, bounds, bounds[1:])], device=dev)
        new_state = xx[(ends[:, None] + torch.arange(K - 1, device=dev)).reshape(-1)]
        new_state = new_state.view(n, K - 1, C).transpose(1, 2).to(x.dtype).contiguous()
        if n <= _FEW:
            y = torch.empty_like(x)
            for i, r in enumerate(starts):
                y[0, bounds[i]:bounds[i + 1]] = y_all[r:r + bounds[i + 1] - bounds[i]]
        else:
            y = y_all[torch.arange(T, device=dev) + seq * (K - 1)].to(x.dtype).unsqueeze(0)
        return y, new_state
    if activation == "silu":
        y = F.silu(y, inplace=True)
    return y.to(x.dtype), new_state.to(x.dtype).contiguous()
