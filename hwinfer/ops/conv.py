"""Short causal depthwise convolution: the width-4 conv that Gated DeltaNet and KDA apply to
q, k, v (one conv over the concatenated channels) before the delta rule."""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randn, slot_rows


def check_conv_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      state: torch.Tensor | None, activation: str | None,
                      cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, list[int] | None]:
    """Validate ``causal_conv1d``'s arguments; return the weight as [C, K] and the sequence
    bounds (``cu_seqlens`` as a list, or None)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or not x.is_floating_point():
        raise ValueError(f"causal_conv1d: x must be a float tensor [B, T, C], got "
                         f"{getattr(x, 'dtype', type(x))} {list(getattr(x, 'shape', []))}")
    B, T, C = x.shape
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight[:, 0]  # the checkpoint's nn.Conv1d layout [C, 1, K]
    if weight.dim() != 2 or weight.shape[0] != C or weight.shape[1] < 1:
        raise ValueError(f"causal_conv1d: weight must be [C, K] or [C, 1, K] with C={C}, got "
                         f"{list(weight.shape)}")
    K = weight.shape[1]
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"causal_conv1d: bias must be [{C}], got {list(bias.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"causal_conv1d: activation must be 'silu' or None, got {activation!r}")
    bounds = None
    n = B
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"causal_conv1d: with cu_seqlens the batch dimension must be 1, "
                             f"got B={B}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
            raise ValueError(f"causal_conv1d: cu_seqlens must be a 1-D integer tensor [N+1], got "
                             f"{cu_seqlens.dtype} {list(cu_seqlens.shape)}")
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != T or any(b > e for b, e in zip(bounds, bounds[1:])):
            raise ValueError(f"causal_conv1d: cu_seqlens must start at 0, be non-decreasing and "
                             f"end at T={T}; got {bounds}")
        n = len(bounds) - 1
    if state is not None and tuple(state.shape) != (n, C, K - 1):
        raise ValueError(f"causal_conv1d: state must be {[n, C, K - 1]} ([N, C, K-1]), got "
                         f"{list(state.shape)}")
    return weight, bounds


def on_conv_state_slots(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        state: torch.Tensor | None, state_slots: torch.Tensor, **kw
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``state_slots`` form of ``causal_conv1d`` through its plain form ``fn``: gather the
    pool rows, run, write the new states back in place. Returns (y, the pool)."""
    if state is None or state.dim() != 3:
        raise ValueError(f"causal_conv1d: state_slots needs state = the state pool [S, C, K-1], got "
                         f"{None if state is None else list(state.shape)}")
    rows = slot_rows("causal_conv1d", state_slots, state)
    y, new_state = fn(x, weight, bias, state.index_select(0, rows), **kw)
    state.index_copy_(0, rows, new_state.to(state.dtype))
    return y, state


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  state: torch.Tensor | None = None, *, activation: str | None = "silu",
                  cu_seqlens: torch.Tensor | None = None,
                  state_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d with carried state, for prefill (T > 1) and decode (T = 1) alike.

    Per sequence and channel c, with ``xx`` = the previous K-1 inputs (``state``, or zeros for a
    fresh sequence) followed by this call's inputs, so that ``xx[K-1+t] = x[t]``:
    ``y[t, c] = act(bias[c] + sum_{j<K} weight[c, j] * xx[t + j, c])``. So ``weight[c, K-1]``
    multiplies the current token and ``weight[c, 0]`` the oldest one (the cross-correlation of
    ``F.conv1d`` with K-1 left padding / cached inputs). ``act`` = SiLU or identity. fp32 math.
    ``new_state`` = the last K-1 entries of ``xx``: the last K-1 inputs, reaching back into the
    old state when fewer than K-1 tokens came in (an empty sequence passes its state through).

    Args:
        x: [B, T, C] any float dtype (channels last; C = the concatenated q|k|v channels).
        weight: [C, K], or [C, 1, K] as stored in checkpoints (``conv1d.weight``), any float dtype.
        bias: [C] or None (the target models have none).
        state: [N, C, K-1] (oldest input first) or None for zeros; N = B, or the number of
            sequences with cu_seqlens.
        activation: "silu" (all target models, ``hidden_act``) or None.
        cu_seqlens: [N+1] int32 cumulative lengths starting at 0, B must be 1; each packed
            sequence convolves only its own tokens and its own ``state[i]``.
        state_slots: [N] integer or None. When given, ``state`` is a state *pool* [S, C, K-1]
            (the engine's cache, any float dtype): sequence i starts from row
            ``state_slots[i]``, its new state is written back to that row **in place** (in the
            pool's dtype), and the returned new_state is the pool itself. The engine's decode
            and prefill use it, so the conv state is neither gathered nor scattered around the
            op. Rows not named are
            untouched; a repeated slot (padding rows of a fixed-size batch) gets one result.

    Returns ``(y [B, T, C] in x.dtype, new_state [N, C, K-1] in x.dtype)``. The state holds raw
    inputs, so x.dtype stores it exactly (as vLLM's and transformers' conv caches do); a state
    passed in fp32 is accepted and its surviving entries are cast to x.dtype.

    Models: Qwen3.5 / Qwen3-Next GDN (``linear_conv_kernel_dim`` = 4, C = 2*Hk*Dk + Hv*Dv over
    the q|k|v projection output, MODELS.md §3.3); Kimi-Linear / Kimi-K3 / GLM-5.3-Flash KDA
    (``short_conv_kernel_size`` / ``linear_conv_kernel_dim`` = 4; published checkpoints keep
    ``q_conv1d``, ``k_conv1d``, ``v_conv1d`` [H*D, 1, 4], which transformers concatenates in q, k, v
    order, MODELS.md §4.2, §6). Decode keeps K-1 = 3 inputs (transformers caches K; the oldest
    of those is never read).
    """
    if state_slots is not None:
        return on_conv_state_slots(causal_conv1d, x, weight, bias, state, state_slots,
                                   activation=activation, cu_seqlens=cu_seqlens)
    w, bounds = check_conv_inputs(x, weight, bias, state, activation, cu_seqlens)
    B, T, C = x.shape
    K = w.shape[1]
    w32 = w.float()
    spans = [(b, 0, T) for b in range(B)] if bounds is None else [
        (0, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    y = torch.zeros(B, T, C, dtype=torch.float32, device=x.device)
    new_state = torch.zeros(len(spans), C, K - 1, dtype=x.dtype, device=x.device)
    for i, (b, start, end) in enumerate(spans):
        prev = (torch.zeros(K - 1, C, dtype=torch.float32, device=x.device) if state is None
                else state[i].float().t())
        xx = torch.cat([prev, x[b, start:end].float()], dim=0)  # [K-1+L, C]
        length = end - start
        out = torch.zeros(length, C, dtype=torch.float32, device=x.device)
        for j in range(K):
            out += w32[:, j] * xx[j:j + length]
        if bias is not None:
            out += bias.float()
        y[b, start:end] = out
        new_state[i] = xx[xx.shape[0] - (K - 1):].t().to(x.dtype)
    if activation == "silu":
        y = torch.nn.functional.silu(y)
    return y.to(x.dtype), new_state


def _conv_case(B: int, T: int, C: int, K: int, *, state: bool, bias: bool = False,
               activation: str | None = "silu", seqlens: tuple[int, ...] | None = None,
               weight_3d: bool = False, pool_extra: int = 0):
    def make(gen, dtype, device):
        n = B if seqlens is None else len(seqlens)
        w = randn(gen, C, K, dtype=dtype, device=device, scale=K ** -0.5)
        inputs = {
            "x": randn(gen, B, T, C, dtype=dtype, device=device),
            "weight": w.unsqueeze(1) if weight_3d else w,
            "bias": randn(gen, C, dtype=dtype, device=device, scale=0.1) if bias else None,
            "state": randn(gen, n + pool_extra, C, K - 1, dtype=dtype, device=device) if state else None,
            "activation": activation,
        }
        if pool_extra:
            # A pool with spare rows; the sequences use a scattered, reordered subset of them.
            perm = torch.randperm(n + pool_extra, generator=gen)[:n]
            inputs["state_slots"] = perm.to(device=device, dtype=torch.int32)
        if seqlens is not None:
            bounds = [0]
            for length in seqlens:
                bounds.append(bounds[-1] + length)
            inputs["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32, device=device)
        return inputs
    return make


# Qwen3.5-0.8B-like scaled down: Hk=2, Hv=4, Dk=Dv=64 -> C = 2*2*64 + 4*64 = 512, K = 4.
CAUSAL_CONV1D = define_op(
    causal_conv1d,
    cases=[
        Case("prefill_B2_T37", _conv_case(2, 37, 512, 4, state=False, weight_3d=True)),
        Case("continue_T2_lt_K", _conv_case(2, 2, 512, 4, state=True)),
        Case("varlen_1_50_29", _conv_case(1, 80, 512, 4, state=True, seqlens=(1, 50, 29))),
        Case("decode_B4", _conv_case(4, 1, 512, 4, state=True)),
        Case("bias_no_act_K3", _conv_case(2, 9, 96, 3, state=True, bias=True, activation=None)),
        # The in-place state pool (engine decode): varlen decode over scattered pool rows.
        Case("decode_pool_slots", _conv_case(1, 5, 512, 4, state=True, seqlens=(1,) * 5, pool_extra=3)),
        Case("multi_token_pool_slots", _conv_case(1, 7, 96, 4, state=True, seqlens=(3, 0, 4), pool_extra=2)),
        # The pool in prefill: sequences over several of a kernel's token chunks, one shorter
        # than K-1 (its new state keeps part of the old one).
        Case("prefill_pool_slots", _conv_case(1, 117, 96, 4, state=True, seqlens=(2, 70, 45),
                                              pool_extra=2)),
    ],
    # Elementwise, K products summed in fp32: near-exact in fp32; bf16 differs by output rounding.
    tolerance={torch.float32: Tol(atol=1e-6, rtol=1e-6), torch.bfloat16: Tol(atol=1e-2, rtol=1e-2)},
    mutates=("state",),
)
