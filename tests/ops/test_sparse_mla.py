"""Reference checks for the sparse_mla family: hand-computed values, independent loops,
transformers' DeepSeek-V4 / GLM-5 / HY4 attention as oracles, edge cases and bad inputs."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill


def _loop_attention(q, keys, values, rows, scale, sink=None):
    """Plain-Python softmax attention of one query vector over the listed rows."""
    logits = [scale * sum(float(a) * float(b) for a, b in zip(q, keys[r])) for r in rows]
    top = max(logits + ([sink] if sink is not None else []), default=0.0)
    w = [math.exp(x - top) for x in logits]
    denom = sum(w) + (math.exp(sink - top) if sink is not None else 0.0)
    if denom == 0:
        return [0.0] * len(values[0])
    return [sum(wi * float(values[r][c]) for wi, r in zip(w, rows)) / denom for c in range(len(values[0]))]


def _rotate(x: torch.Tensor, ang: torch.Tensor) -> torch.Tensor:
    """Interleaved rotation of the last 2*len(ang) channels of vector x by +ang (explicit loop)."""
    y = x.clone()
    base = x.numel() - 2 * ang.numel()
    for i, a in enumerate(ang.tolist()):
        x0, x1 = float(x[base + 2 * i]), float(x[base + 2 * i + 1])
        y[base + 2 * i] = x0 * math.cos(a) - x1 * math.sin(a)
        y[base + 2 * i + 1] = x1 * math.cos(a) + x0 * math.sin(a)
    return y


def test_hand_computed_with_sink_and_duplicate():
    q = torch.tensor([[[1.0, 0.0]]])
    kv = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    e = math.e
    out = sparse_mla_prefill(q, kv, torch.tensor([[0, 2, -1]], dtype=torch.int32), scale=1.0)
    # logits 1 and 2: weights 1/(1+e), e/(1+e)
    expect = [(1 + 2 * e) / (1 + e), 2 * e / (1 + e)]
    torch.testing.assert_close(out[0, 0], torch.tensor(expect), rtol=1e-6, atol=1e-6)
    # sink logit 0 adds exp(0) = 1 to the denominator only
    out = sparse_mla_prefill(q, kv, torch.tensor([[0, 2, -1]], dtype=torch.int32), torch.zeros(1), scale=1.0)
    d = 1 + e * e + e
    torch.testing.assert_close(out[0, 0], torch.tensor([(e + 2 * e * e) / d, 2 * e * e / d]),
                               rtol=1e-6, atol=1e-6)
    # a duplicated row counts twice: weights 2e/(2e+e^2) on row 0, e^2/(2e+e^2) on row 2
    out = sparse_mla_prefill(q, kv, torch.tensor([[0, 0, 2]], dtype=torch.int32), scale=1.0)
    d = 2 * e + e * e
    torch.testing.assert_close(out[0, 0], torch.tensor([(2 * e + 2 * e * e) / d, 2 * e * e / d]),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_all_previous_positions_is_causal_attention(with_sinks):
    gen = torch.Generator().manual_seed(0)
    t_len, heads, dim = 7, 3, 16
    q = torch.randn(t_len, heads, dim, generator=gen)
    kv = torch.randn(t_len, dim, generator=gen)
    sinks = torch.randn(heads, generator=gen) if with_sinks else None
    idx = torch.full((t_len, t_len), -1, dtype=torch.int32)
    for t in range(t_len):
        idx[t, : t + 1] = torch.arange(t + 1)
    out = sparse_mla_prefill(q, kv, idx, sinks, scale=0.3, v_dim=10)
    for t in range(t_len):
        for h in range(heads):
            sink = float(sinks[h]) if with_sinks else None
            ref = _loop_attention(q[t, h].tolist(), kv.tolist(), kv[:, :10].tolist(), list(range(t + 1)),
                                  0.3, sink)
            torch.testing.assert_close(out[t, h], torch.tensor(ref), rtol=1e-5, atol=1e-6)


def test_inverse_rope_undoes_the_key_rotation():
    gen = torch.Generator().manual_seed(1)
    t_len, dim, rope, v_dim = 5, 24, 8, 20
    x = torch.randn(t_len, dim, generator=gen)
    pos = torch.tensor([0, 3, 17, 250, 4095])
    inv_freq = 10000.0 ** (-torch.arange(0, rope, 2).float() / rope)
    ang = pos[:, None].float() * inv_freq
    # V = K carries RoPE on the last `rope` channels of the value slice (v_dim < D here).
    kv = torch.stack([torch.cat([_rotate(x[t, :v_dim], ang[t]), x[t, v_dim:]]) for t in range(t_len)])
    idx = torch.arange(t_len, dtype=torch.int32)[:, None]          # each token sees only its row
    out = sparse_mla_prefill(torch.randn(t_len, 2, dim, generator=gen), kv, idx, scale=0.1,
                             v_dim=v_dim, out_rope=(ang.cos(), ang.sin()))
    torch.testing.assert_close(out, x[:, None, :v_dim].expand(-1, 2, -1), rtol=1e-5, atol=1e-5)


def test_empty_rows_and_shapes():
    q = torch.randn(3, 2, 8)
    kv = torch.randn(4, 8)
    idx = torch.tensor([[-1, -1], [0, -1], [-1, -1]], dtype=torch.int32)
    for sinks in (None, torch.randn(2)):
        out = sparse_mla_prefill(q, kv, idx, sinks, scale=0.5)
        assert torch.equal(out[0], torch.zeros(2, 8)) and torch.equal(out[2], torch.zeros(2, 8))
    assert sparse_mla_prefill(q, kv, idx[:, :0], scale=0.5).abs().sum() == 0
    assert sparse_mla_prefill(q[:0], kv, idx[:0], scale=0.5, v_dim=5).shape == (0, 2, 5)
    assert sparse_mla_prefill(q.bfloat16(), kv.bfloat16(), idx, scale=0.5).dtype == torch.bfloat16


@pytest.mark.parametrize("s", [1, 2])
def test_decode_equals_prefill_on_the_same_rows(s):
    gen = torch.Generator().manual_seed(2)
    b, heads, dim, blocks, bsz = 3, 4, 32, 5, 8
    q = torch.randn(b, s, heads, dim, generator=gen)
    cache = torch.randn(blocks, bsz, dim, generator=gen)
    idx = torch.randint(-1, blocks * bsz, (b, s, 6), generator=gen, dtype=torch.int32)
    idx[0, 0] = -1
    cos, sin = torch.rand(b, s, 4, generator=gen), torch.rand(b, s, 4, generator=gen)
    sinks = torch.randn(heads, generator=gen)
    out = sparse_mla_decode(q, cache, idx, sinks, scale=0.2, out_rope=(cos, sin))
    for bi in range(b):
        for si in range(s):
            rows = idx[bi, si]
            kv = torch.stack([cache[r // bsz, r % bsz] if r >= 0 else torch.zeros(dim)
                              for r in rows.tolist()])
            local = torch.where(rows >= 0, torch.arange(6, dtype=torch.int32), -1)[None]
            ref = sparse_mla_prefill(q[bi, si][None], kv, local, sinks, scale=0.2,
                                     out_rope=(cos[bi, si][None], sin[bi, si][None]))
            torch.testing.assert_close(out[bi, si], ref[0], rtol=1e-5, atol=1e-6)


def test_decode_extra_rows_equal_one_concatenated_cache():
    """A second (cache, indices) pair joins the same softmax: same as one cache holding both."""
    from hwinfer.kernels.torch.sparse_mla import sparse_mla_decode as torch_decode

    gen = torch.Generator().manual_seed(4)
    b, heads, dim = 3, 4, 32
    q = torch.randn(b, 1, heads, dim, generator=gen)
    ring, store = torch.randn(4, 8, dim, generator=gen), torch.randn(5, 4, dim, generator=gen)
    win = torch.randint(-1, 32, (b, 1, 8), generator=gen, dtype=torch.int32)
    ent = torch.randint(-1, 20, (b, 1, 3), generator=gen, dtype=torch.int32)
    ent[2] = -1
    sinks = torch.randn(heads, generator=gen)
    both = torch.cat([ring.reshape(-1, dim), store.reshape(-1, dim)])[None]
    idx = torch.cat([win, torch.where(ent >= 0, ent + 32, -1)], dim=-1)
    ref = sparse_mla_decode(q, both, idx, sinks, scale=0.2)
    for fn in (sparse_mla_decode, torch_decode):
        out = fn(q, ring, win, sinks, scale=0.2, extra_kv_cache=store, extra_indices=ent)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="together"):
        sparse_mla_decode(q, ring, win, sinks, scale=0.2, extra_kv_cache=store)
    with pytest.raises(ValueError, match="indices must lie"):
        sparse_mla_decode(q, ring, win, sinks, scale=0.2, extra_kv_cache=store, extra_indices=ent + 20)


def _index_mask(idx: torch.Tensor, n: int) -> torch.Tensor:
    mask = torch.full((idx.shape[0], n), float("-inf"))
    for t, row in enumerate(idx.tolist()):
        for r in row:
            if r >= 0:
                mask[t, r] = 0.0
    return mask


def test_matches_transformers_deepseek_v4_attention():
    mod = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    gen = torch.Generator().manual_seed(3)
    t_len, heads, dim, n, rope = 6, 4, 32, 10, 8
    q = torch.randn(t_len, heads, dim, generator=gen)
    kv = torch.randn(n, dim, generator=gen)
    idx = torch.stack([torch.randperm(n, generator=gen)[:5] for _ in range(t_len)]).to(torch.int32)
    idx[1, 3:] = -1
    idx[4] = -1
    sinks = torch.randn(heads, generator=gen)
    ang = torch.rand(t_len, rope // 2, generator=gen) * 6
    fake = type("Attn", (), {"num_key_value_groups": heads, "sinks": sinks, "training": False})()
    hf, _ = mod.eager_attention_forward(fake, q.transpose(0, 1)[None], kv[None, None], kv[None, None],
                                        _index_mask(idx, n)[None, None], scaling=dim ** -0.5)
    hf = mod.apply_rotary_pos_emb(hf, ang.cos()[None], -ang.sin()[None], unsqueeze_dim=2)[0]  # [T, H, D]
    ours = sparse_mla_prefill(q, kv, idx, sinks, scale=dim ** -0.5, out_rope=(ang.cos(), ang.sin()))
    torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["glm_moe_dsa", "hy_v4"])
def test_absorbed_form_matches_transformers_expanded_mla(model):
    """GLM-5 / HY4: attention over expanded per-head K, V (transformers) equals this op over the
    latent with q_nope absorbed through W_UK and the output taken through W_UV."""
    mod = pytest.importorskip(f"transformers.models.{model}.modeling_{model}")
    gen = torch.Generator().manual_seed(4)
    t_len, heads, nope, rope, v_head, latent, n = 5, 3, 12, 4, 10, 16, 9
    q_nope = torch.randn(t_len, heads, nope, generator=gen)
    q_pe = torch.randn(t_len, heads, rope, generator=gen)
    lat = torch.randn(n, latent, generator=gen)
    k_pe = torch.randn(n, rope, generator=gen)
    w_kv_b = torch.randn(heads, nope + v_head, latent, generator=gen) * latent ** -0.5
    w_uk, w_uv = w_kv_b[:, :nope], w_kv_b[:, nope:]
    idx = torch.stack([torch.randperm(n, generator=gen)[:4] for _ in range(t_len)]).to(torch.int32)
    idx[2, 2:] = -1
    scale = (nope + rope) ** -0.5
    sinks = torch.randn(heads, generator=gen) if model == "hy_v4" else None
    # transformers: per-head keys [k_nope | k_pe], values, masked to the index set
    k_nope = torch.einsum("hcl,nl->hnc", w_uk, lat)
    keys = torch.cat([k_nope, k_pe[None].expand(heads, -1, -1)], dim=-1)[None]
    values = torch.einsum("hcl,nl->hnc", w_uv, lat)[None]
    query = torch.cat([q_nope, q_pe], dim=-1).transpose(0, 1)[None]
    fake = type("Attn", (), {"num_key_value_groups": 1, "sinks": sinks, "training": False})()
    hf, _ = mod.eager_attention_forward(fake, query, keys, values, _index_mask(idx, n)[None, None],
                                        scaling=scale)
    q_abs = torch.cat([torch.einsum("thc,hcl->thl", q_nope, w_uk), q_pe], dim=-1)
    o_lat = sparse_mla_prefill(q_abs, torch.cat([lat, k_pe], dim=-1), idx, sinks, scale=scale, v_dim=latent)
    ours = torch.einsum("thl,hcl->thc", o_lat, w_uv)
    torch.testing.assert_close(ours, hf[0], rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise():
    q, kv = torch.randn(2, 2, 8), torch.randn(5, 8)
    idx = torch.zeros(2, 3, dtype=torch.int32)
    bad = [
        dict(q=q[0]),
        dict(kv=torch.randn(5, 6)),
        dict(indices=idx.float()),
        dict(indices=torch.zeros(3, 3, dtype=torch.int32)),
        dict(indices=torch.full((2, 3), 5, dtype=torch.int32)),
        dict(indices=torch.full((2, 3), -2, dtype=torch.int32)),
        dict(sinks=torch.zeros(3)),
        dict(v_dim=9),
        dict(out_rope=(torch.zeros(2, 5), torch.zeros(2, 5))),
        dict(out_rope=(torch.zeros(3, 2), torch.zeros(3, 2))),
        dict(kv=torch.randn(5, 8).double()),
    ]
    for change in bad:
        args = dict(q=q, kv=kv, indices=idx, sinks=None, v_dim=None, out_rope=None) | change
        with pytest.raises(ValueError):
            sparse_mla_prefill(args.pop("q"), args.pop("kv"), args.pop("indices"), scale=0.1, **args)
    with pytest.raises(ValueError, match="kv_cache"):
        sparse_mla_decode(q[None], kv, idx[None], scale=0.1)
    with pytest.raises(ValueError, match="indices"):
        sparse_mla_decode(q[None], kv[None], idx, scale=0.1)
    with pytest.raises(ValueError, match="out_rope"):
        sparse_mla_decode(q[None], kv[None], idx[None], scale=0.1,
                          out_rope=(torch.zeros(2, 2), torch.zeros(2, 2)))
