"""causal_conv1d reference (hwinfer.ops.conv): an explicit loop, transformers' torch paths,
state carrying across calls, packed sequences, edge cases and input checking."""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

from hwinfer.ops.conv import causal_conv1d


def _loop(x, w, bias, state, activation):
    """Per batch row, channel and token: the K-tap sum written out with scalar indexing."""
    B, T, C = x.shape
    K = w.shape[1]
    hist = torch.zeros(B, C, K - 1) if state is None else state.clone()
    y = torch.zeros(B, T, C)
    for b in range(B):
        for c in range(C):
            seq = list(hist[b, c].tolist()) + list(x[b, :, c].tolist())  # oldest first
            for t in range(T):
                acc = 0.0 if bias is None else float(bias[c])
                for j in range(K):
                    acc += float(w[c, j]) * seq[t + j]
                y[b, t, c] = acc
            hist[b, c] = torch.tensor(seq[len(seq) - (K - 1):]) if K > 1 else hist[b, c]
    if activation == "silu":
        y = F.silu(y)
    return y, hist


def _rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("T,state,bias,activation", [
    (7, False, False, "silu"), (5, True, True, None), (2, True, False, "silu"),
    (1, True, False, "silu"),
])
def test_against_explicit_loop(T, state, bias, activation):
    B, C, K = 2, 5, 4
    x, w = _rand(B, T, C, seed=1), _rand(C, K, seed=2)
    b = _rand(C, seed=3) if bias else None
    st = _rand(B, C, K - 1, seed=4) if state else None
    y, s = causal_conv1d(x, w, b, st, activation=activation)
    y_ref, s_ref = _loop(x, w, b, st, activation)
    torch.testing.assert_close(y, y_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s, s_ref, atol=0, rtol=0)  # the state is the raw inputs


def test_hand_computed():
    # K = 3, weights (1, 10, 100): y_t = x_{t-2} + 10 x_{t-1} + 100 x_t;
    # state (5, 6) before x = (1, 2).
    x = torch.tensor([1.0, 2.0]).reshape(1, 2, 1)
    w = torch.tensor([[1.0, 10.0, 100.0]])
    y, s = causal_conv1d(x, w, None, torch.tensor([[[5.0, 6.0]]]), activation=None)
    assert y.flatten().tolist() == [5 + 60 + 100, 6 + 10 + 200]
    assert s.flatten().tolist() == [1.0, 2.0]
    y, s = causal_conv1d(x[:, :1], w, None, torch.tensor([[[5.0, 6.0]]]), activation=None)
    assert y.flatten().tolist() == [165.0] and s.flatten().tolist() == [6.0, 1.0]  # T < K-1
    y, s = causal_conv1d(x, w, None, None, activation=None)  # fresh sequence: zero history
    assert y.flatten().tolist() == [100.0, 210.0] and s.flatten().tolist() == [1.0, 2.0]


def test_checkpoint_weight_layout_and_kernel_one():
    x, w = _rand(1, 6, 4, seed=5), _rand(4, 4, seed=6)
    torch.testing.assert_close(causal_conv1d(x, w.unsqueeze(1))[0], causal_conv1d(x, w)[0],
                               atol=0, rtol=0)
    y, s = causal_conv1d(x, w[:, :1], None, None, activation=None)  # K = 1: no history at all
    torch.testing.assert_close(y, x * w[:, 0], atol=1e-6, rtol=1e-6)
    assert s.shape == (1, 4, 0)


def test_split_calls_equal_one_call():
    x, w = _rand(3, 20, 6, seed=7), _rand(6, 4, seed=8)
    y_full, s_full = causal_conv1d(x, w)
    y1, s = causal_conv1d(x[:, :15], w)
    ys = [y1]
    for t in range(15, 20):  # decode one token at a time
        y_t, s = causal_conv1d(x[:, t:t + 1], w, None, s)
        ys.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y_full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s, s_full, atol=0, rtol=0)


def test_varlen_equals_separate_calls():
    lengths = [1, 9, 0, 2]
    cu = torch.tensor([0, 1, 10, 10, 12], dtype=torch.int32)
    x, w, st = _rand(1, 12, 6, seed=9), _rand(6, 4, seed=10), _rand(4, 6, 3, seed=11)
    y, s = causal_conv1d(x, w, None, st, cu_seqlens=cu)
    for i in range(len(lengths)):
        seg = slice(int(cu[i]), int(cu[i + 1]))
        y_i, s_i = causal_conv1d(x[:, seg], w, None, st[i:i + 1])
        torch.testing.assert_close(y[:, seg], y_i, atol=0, rtol=0)
        torch.testing.assert_close(s[i:i + 1], s_i, atol=0, rtol=0)
    torch.testing.assert_close(s[2], st[2], atol=0, rtol=0)  # empty sequence keeps its state


def test_dtypes():
    x, w, st = _rand(2, 5, 8, seed=12).bfloat16(), _rand(8, 4, seed=13), _rand(2, 8, 3, seed=14)
    y, s = causal_conv1d(x, w, None, st)  # fp32 state in, bf16 state out (x.dtype)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.bfloat16
    y32, _ = causal_conv1d(x.float(), w, None, st)
    torch.testing.assert_close(y.float(), y32, atol=1e-2, rtol=1e-2)


def _transformers_conv():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    return inspect.unwrap(m.causal_conv1d_fn), inspect.unwrap(m.causal_conv1d_update)


def test_against_transformers():
    conv_fn, conv_update = _transformers_conv()
    B, T, C, K = 2, 9, 12, 4
    x, w = _rand(B, T, C, seed=15), _rand(C, K, seed=16)
    # Prefill: transformers takes [B, C, T] and a [C, K] weight.
    y, s = causal_conv1d(x, w)
    y_ref = conv_fn(x.transpose(1, 2), w, None, activation="silu").transpose(1, 2)
    torch.testing.assert_close(y, y_ref, atol=1e-6, rtol=1e-6)
    # Decode: transformers caches K inputs (the oldest is never read); ours keeps K-1.
    cache = torch.cat([torch.full((B, C, 1), 7.0), s], dim=-1)
    x1 = _rand(B, 1, C, seed=17)
    y1, s1 = causal_conv1d(x1, w, None, s)
    y1_ref = conv_update(x1.transpose(1, 2), cache, w, None, activation="silu")  # updates cache
    torch.testing.assert_close(y1, y1_ref.transpose(1, 2), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s1, cache[..., 1:], atol=0, rtol=0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=torch.zeros(4, 3)), "x must be"),
    (dict(weight=torch.zeros(5, 4)), "weight must be"),
    (dict(weight=torch.zeros(6, 2, 4)), "weight must be"),
    (dict(bias=torch.zeros(5)), "bias must be"),
    (dict(state=torch.zeros(2, 6, 4)), "state must be"),
    (dict(activation="gelu"), "activation"),
    (dict(cu_seqlens=torch.tensor([0, 3], dtype=torch.int32)), "batch dimension must be 1"),
])
def test_bad_inputs_raise(kwargs, match):
    args = dict(x=torch.zeros(2, 3, 6), weight=torch.zeros(6, 4))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        causal_conv1d(**args)


def test_bad_cu_seqlens_raise():
    x, w = torch.zeros(1, 3, 6), torch.zeros(6, 4)
    with pytest.raises(ValueError, match="end at T=3"):
        causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
        causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 2, 1, 3]))
