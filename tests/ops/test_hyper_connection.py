"""Hyper-connection references: hand-computed cases, Sinkhorn properties, cross-checks between
the mHC / iHC / head forms, transformers' DeepSeek-V4 and HY4 modules as oracles, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops.hyper_connection import ihc_post, ihc_pre, mhc_head, mhc_post, mhc_pre


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _params(gen: torch.Generator, rows: int, cols: int, n_scale: int):
    fn = torch.randn(rows, cols, generator=gen) / math.sqrt(cols)
    base = torch.randn(rows, generator=gen) * 0.5
    scale = torch.randn(n_scale, generator=gen) * 0.3 + 1.0
    return fn, base, scale


# ----------------------------------------------------------------------------------------------
# Hand-computed N=2, H=2 case: every step written out with Python floats.

X_TINY = [[1.0, 2.0], [3.0, -1.0]]  # stream 0, stream 1
FN_TINY = [[0.1 * ((3 * r + c) % 7 - 3) for c in range(4)] for r in range(8)]
BASE_TINY = [0.2, -0.1, 0.3, 0.0, 0.5, -0.5, 0.1, 0.4]
SCALE_TINY = [0.9, 1.1, 1.3]


def _tiny_by_hand(iters: int, norm_eps: float = 1e-6, hc_eps: float = 1e-6):
    flat = [v for stream in X_TINY for v in stream]
    inv_rms = 1.0 / math.sqrt(sum(v * v for v in flat) / len(flat) + norm_eps)
    z = [sum(w * v * inv_rms for w, v in zip(row, flat)) for row in FN_TINY]
    pre = [_sigmoid(z[i] * SCALE_TINY[0] + BASE_TINY[i]) + hc_eps for i in range(2)]
    post = [2.0 * _sigmoid(z[2 + i] * SCALE_TINY[1] + BASE_TINY[2 + i]) for i in range(2)]
    comb = []
    for i in range(2):
        logits = [z[4 + 2 * i + j] * SCALE_TINY[2] + BASE_TINY[4 + 2 * i + j] for j in range(2)]
        e = [math.exp(v) for v in logits]
        comb.append([v / sum(e) + hc_eps for v in e])

    def normalise_columns():
        for j in range(2):
            col = comb[0][j] + comb[1][j] + hc_eps
            for i in range(2):
                comb[i][j] /= col

    def normalise_rows():
        for i in range(2):
            row = comb[i][0] + comb[i][1] + hc_eps
            comb[i] = [v / row for v in comb[i]]

    normalise_columns()
    for _ in range(iters - 1):
        normalise_rows()
        normalise_columns()
    layer_input = [pre[0] * X_TINY[0][h] + pre[1] * X_TINY[1][h] for h in range(2)]
    return layer_input, post, comb


@pytest.mark.parametrize("iters", [1, 3, 20])
def test_mhc_pre_hand_computed(iters):
    x = torch.tensor([X_TINY])
    li, post, comb = mhc_pre(x, torch.tensor(FN_TINY), torch.tensor(BASE_TINY),
                             torch.tensor(SCALE_TINY), norm_eps=1e-6, hc_eps=1e-6,
                             sinkhorn_iters=iters)
    want_li, want_post, want_comb = _tiny_by_hand(iters)
    assert li.shape == (1, 2) and post.shape == (1, 2) and comb.shape == (1, 2, 2)
    assert post.dtype == comb.dtype == torch.float32
    torch.testing.assert_close(li[0], torch.tensor(want_li), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(post[0], torch.tensor(want_post), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(comb[0], torch.tensor(want_comb), atol=1e-6, rtol=1e-6)


def test_mhc_post_hand_computed_uses_comb_transposed():
    residual = torch.tensor([X_TINY])
    y = torch.tensor([[0.5, -2.0]])
    post = torch.tensor([[1.5, 0.25]])
    comb = torch.tensor([[[0.9, 0.1], [0.3, 0.7]]])  # asymmetric: the transpose matters
    out = mhc_post(y, residual, post, comb)
    want = [[post[0, k].item() * y[0, h].item()
             + sum(comb[0, j, k].item() * X_TINY[j][h] for j in range(2)) for h in range(2)]
            for k in range(2)]
    torch.testing.assert_close(out[0], torch.tensor(want), atol=1e-6, rtol=1e-6)


def test_ihc_hand_computed():
    x = torch.tensor([X_TINY])
    fn, base, scale = torch.tensor(FN_TINY[:4]), torch.tensor(BASE_TINY[:4]), torch.tensor([0.7, 1.2])
    li, post = ihc_pre(x, fn, base, scale, norm_eps=1e-5, hc_eps=1e-6, hc_magnitude=2.0)
    flat = [v for s in X_TINY for v in s]
    inv_rms = 1.0 / math.sqrt(sum(v * v for v in flat) / 4 + 1e-5)
    z = [sum(w * v for w, v in zip(row, flat)) * inv_rms for row in FN_TINY[:4]]
    pre = [_sigmoid(z[i] * 0.7 + BASE_TINY[i]) + 1e-6 for i in range(2)]
    want_post = [2.0 * _sigmoid(z[2 + i] * 1.2 + BASE_TINY[2 + i]) + 1e-6 for i in range(2)]
    want_li = [pre[0] * X_TINY[0][h] + pre[1] * X_TINY[1][h] for h in range(2)]
    torch.testing.assert_close(li[0], torch.tensor(want_li), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(post[0], torch.tensor(want_post), atol=1e-6, rtol=1e-6)
    y = torch.tensor([[0.5, -2.0]])
    out = ihc_post(y, x, post)
    want = [[want_post[k] * y[0, h].item() + X_TINY[k][h] for h in range(2)] for k in range(2)]
    torch.testing.assert_close(out[0], torch.tensor(want), atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# Properties and cross-checks between the forms.


def _comb(sharpness: float, iters: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    n, h = 4, 64
    fn, base, scale = _params(gen, (2 + n) * n, n * h, 3)
    x = torch.randn(256, n, h, generator=gen)
    _, post, comb = mhc_pre(x, fn * sharpness, base * sharpness, scale, norm_eps=1e-6,
                            hc_eps=1e-6, sinkhorn_iters=iters)
    assert (comb > 0).all() and ((post > 0) & (post < 2)).all()
    return comb


def test_sinkhorn_is_doubly_stochastic():
    comb = _comb(0.5, 20)
    torch.testing.assert_close(comb.sum(dim=-2), torch.ones(256, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(comb.sum(dim=-1), torch.ones(256, 4), atol=1e-3, rtol=0)


def test_sinkhorn_on_peaked_matrices():
    """The last step normalises columns, so they are always exact; rows of nearly
    decomposable matrices converge slowly (20 iterations can leave a few 1e-2 off)."""
    row_err = {}
    for iters in (3, 20, 100):
        comb = _comb(2.0, iters)
        torch.testing.assert_close(comb.sum(dim=-2), torch.ones(256, 4), atol=1e-5, rtol=0)
        row_err[iters] = (comb.sum(dim=-1) - 1).abs().amax(dim=-1)
    assert row_err[20].median() < 1e-3
    assert row_err[100].max() <= row_err[20].max() <= row_err[3].max()


def test_pre_weights_agree_across_forms():
    """mHC, iHC and the head compute the same ``pre`` from the same projection rows."""
    gen = torch.Generator().manual_seed(2)
    n, h = 4, 48
    fn, base, scale = _params(gen, (2 + n) * n, n * h, 3)
    x = torch.randn(5, n, h, generator=gen)
    li, post, _ = mhc_pre(x, fn, base, scale, norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=4)
    li_i, post_i = ihc_pre(x, fn[: 2 * n], base[: 2 * n], scale[:2], norm_eps=1e-6, hc_eps=1e-6)
    li_h = mhc_head(x, fn[:n], base[:n], scale[:1], norm_eps=1e-6, hc_eps=1e-6)
    torch.testing.assert_close(li_i, li, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(li_h, li, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(post_i, post + 1e-6, atol=1e-6, rtol=1e-6)  # iHC adds hc_eps


def test_identity_comb_and_zero_output_keep_the_streams():
    gen = torch.Generator().manual_seed(3)
    residual = torch.randn(3, 4, 16, generator=gen)
    eye = torch.eye(4).expand(3, 4, 4)
    out = mhc_post(torch.randn(3, 16, generator=gen), residual, torch.zeros(3, 4), eye)
    torch.testing.assert_close(out, residual, atol=0, rtol=0)
    assert torch.equal(ihc_post(torch.zeros(3, 16), residual, torch.rand(3, 4)), residual)


@pytest.mark.parametrize("t", [0, 1])
def test_short_inputs(t):
    gen = torch.Generator().manual_seed(4)
    n, h = 4, 8
    x = torch.randn(t, n, h, generator=gen, dtype=torch.float32).bfloat16()
    li, post, comb = mhc_pre(x, *_params(gen, (2 + n) * n, n * h, 3), norm_eps=1e-6, hc_eps=1e-6,
                             sinkhorn_iters=20)
    assert li.shape == (t, h) and li.dtype == torch.bfloat16 and comb.shape == (t, n, n)
    out = mhc_post(li, x, post, comb)
    assert out.shape == (t, n, h) and out.dtype == torch.bfloat16
    assert mhc_head(x, *_params(gen, n, n * h, 1), norm_eps=1e-6, hc_eps=1e-6).shape == (t, h)
    li_i, post_i = ihc_pre(x, *_params(gen, 2 * n, n * h, 2), norm_eps=1e-5, hc_eps=1e-6)
    assert ihc_post(li_i, x, post_i).shape == (t, n, h)


def test_bad_inputs_raise():
    n, h = 4, 8
    x = torch.randn(2, n, h)
    fn, base, scale = torch.randn(24, 32), torch.randn(24), torch.ones(3)
    kw = {"norm_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20}
    with pytest.raises(ValueError, match=r"x must be \[T, N, H\]"):
        mhc_pre(x.reshape(2, -1), fn, base, scale, **kw)
    with pytest.raises(ValueError, match="fn must be"):
        mhc_pre(x, fn[:, :16], base, scale, **kw)
    with pytest.raises(ValueError, match="base must be"):
        mhc_pre(x, fn, base[:8], scale, **kw)
    with pytest.raises(ValueError, match="scale must be"):
        mhc_pre(x, fn, base, scale[:1], **kw)
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        mhc_pre(x, fn, base, scale, **{**kw, "sinkhorn_iters": 0})
    with pytest.raises(ValueError, match="comb must be"):
        mhc_post(torch.randn(2, h), x, torch.rand(2, n), torch.rand(2, n, n - 1))
    with pytest.raises(ValueError, match="y must be"):
        mhc_post(torch.randn(2, h + 1), x, torch.rand(2, n), torch.rand(2, n, n))
    with pytest.raises(ValueError, match="fn must be"):
        mhc_head(x, fn[:n, :16], base[:n], scale[:1], norm_eps=1e-6, hc_eps=1e-6)
    with pytest.raises(ValueError, match="scale must be"):
        ihc_pre(x, torch.randn(8, 32), torch.randn(8), torch.ones(3), norm_eps=1e-5, hc_eps=1e-6)
    with pytest.raises(ValueError, match="post must be"):
        ihc_post(torch.randn(2, h), x, torch.rand(2, n + 1))


# ----------------------------------------------------------------------------------------------
# transformers 5.23.0 as the oracle: whole decoder layers with stub attention / MLP, so the
# composition (pre -> block -> post, comb transposed) is checked, not just the formulas.


class _Stub(torch.nn.Module):
    """A fixed nonlinear map standing in for attention or the MLP."""

    def __init__(self, h: int, seed: int, returns: int):
        super().__init__()
        self.w = torch.randn(h, h, generator=torch.Generator().manual_seed(seed)) / math.sqrt(h)
        self.returns = returns

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w)

    def forward(self, hidden_states=None, *args, **kwargs):
        out = self.apply(hidden_states)
        return (out,) + (None,) * (self.returns - 1) if self.returns > 1 else out


def _randomise(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("fn"):
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            elif name.endswith("base"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("scale"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + 1.0)


def test_matches_transformers_deepseek_v4():
    pytest.importorskip("transformers")
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    h, n = 32, 4
    cfg = DeepseekV4Config(hidden_size=h, num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                           qk_rope_head_dim=8, q_lora_rank=16, o_lora_rank=16, o_groups=1,
                           n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                           vocab_size=16, index_n_heads=2, index_head_dim=8, hc_mult=n,
                           hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
                           layer_types=["sliding_attention"], mlp_layer_types=["moe"])
    gen = torch.Generator().manual_seed(5)
    layer = m.DeepseekV4DecoderLayer(cfg, 0)
    layer.self_attn, layer.mlp = _Stub(h, 1, 2), _Stub(h, 2, 1)
    head = m.DeepseekV4HyperHead(cfg)
    _randomise(layer, gen)
    _randomise(head, gen)
    hidden = torch.randn(2, 3, n, h, generator=gen)
    with torch.no_grad():
        want = layer(hidden)
        want_head = head(hidden)
        kw = {"norm_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20}
        x = hidden.reshape(6, n, h)
        hc = layer.attn_hc
        li, post, comb = mhc_pre(x, hc.fn, hc.base, hc.scale, **kw)
        # the module itself, bit for bit (fp32)
        t_post, t_comb, t_li = hc(hidden)
        assert torch.equal(li, t_li.reshape(6, h)) and torch.equal(post, t_post.reshape(6, n))
        assert torch.equal(comb, t_comb.reshape(6, n, n))
        x = mhc_post(layer.self_attn.apply(layer.input_layernorm(li)), x, post, comb)
        hc = layer.ffn_hc
        li, post, comb = mhc_pre(x, hc.fn, hc.base, hc.scale, **kw)
        x = mhc_post(layer.mlp.apply(layer.post_attention_layernorm(li)), x, post, comb)
        got_head = mhc_head(hidden.reshape(6, n, h), head.hc_fn, head.hc_base, head.hc_scale,
                            norm_eps=1e-6, hc_eps=1e-6)
    torch.testing.assert_close(x, want.reshape(6, n, h), atol=1e-5, rtol=1e-5)
    assert torch.equal(got_head, want_head.reshape(6, h))
    # bf16 streams: the block input is still bit-identical (fp32 projection and collapse)
    with torch.no_grad():
        t_post, t_comb, t_li = layer.attn_hc(hidden.bfloat16())
        li, post, comb = mhc_pre(hidden.bfloat16().reshape(6, n, h), layer.attn_hc.fn,
                                 layer.attn_hc.base, layer.attn_hc.scale, **kw)
    assert li.dtype == torch.bfloat16 and torch.equal(li, t_li.reshape(6, h))
    assert torch.equal(comb, t_comb.reshape(6, n, n))


def test_matches_transformers_hy_v4():
    pytest.importorskip("transformers")
    from transformers.models.hy_v4 import modeling_hy_v4 as m
    from transformers.models.hy_v4.configuration_hy_v4 import HYV4Config

    h, n = 32, 4
    cfg = HYV4Config(hidden_size=h, num_hidden_layers=1, num_attention_heads=2, q_lora_rank=16,
                     kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                     vocab_size=16, n_routed_experts=2, num_experts_per_tok=1,
                     moe_intermediate_size=16, intermediate_size=16, index_n_heads=2,
                     index_head_dim=8, hc_mult=n, hc_magnitude=1.5, hc_eps=1e-6, rms_norm_eps=1e-5,
                     pad_token_id=None, bos_token_id=None, eos_token_id=None)
    gen = torch.Generator().manual_seed(6)
    layer = m.HYV4DecoderLayer(cfg, 0)
    layer.self_attn, layer.mlp = _Stub(h, 3, 3), _Stub(h, 4, 1)
    head = m.HYV4HyperHead(cfg)
    _randomise(layer, gen)
    _randomise(head, gen)
    hidden = torch.randn(2, 3, n, h, generator=gen)
    kw = {"norm_eps": 1e-5, "hc_eps": 1e-6, "hc_magnitude": 1.5}
    with torch.no_grad():
        want, _ = layer(hidden)
        want_head = head(hidden)
        x = hidden.reshape(6, n, h)
        hc = layer.attn_hc
        assert tuple(hc.fn.shape) == (2 * n, n * h) and tuple(hc.scale.shape) == (2,)
        li, post = ihc_pre(x, hc.fn, hc.base, hc.scale, **kw)
        t_post, t_li = hc(hidden)
        assert torch.equal(li, t_li.reshape(6, h)) and torch.equal(post, t_post.reshape(6, n))
        x = ihc_post(layer.self_attn.apply(layer.input_layernorm(li)), x, post)
        hc = layer.ffn_hc
        li, post = ihc_pre(x, hc.fn, hc.base, hc.scale, **kw)
        x = ihc_post(layer.mlp.apply(layer.post_attention_layernorm(li)), x, post)
        got_head = mhc_head(hidden.reshape(6, n, h), head.hc_fn, head.hc_base, head.hc_scale,
                            norm_eps=1e-5, hc_eps=1e-6)
    torch.testing.assert_close(x, want.reshape(6, n, h), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_head, want_head.reshape(6, h), atol=1e-5, rtol=1e-5)
