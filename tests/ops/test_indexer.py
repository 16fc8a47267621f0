"""Lightning indexer contract: hand case, visibility, brute-force optimality, the set compare,
transformers' DeepSeek-V4 and GLM-5 (DSA) indexers as oracles, bad input."""
from __future__ import annotations

import pytest
import torch

from hwinfer.ops.contract import EXACT
from hwinfer.ops.compressor import kv_compress
from hwinfer.ops.indexer import compare_index_sets, lightning_indexer


def _i32(*v):
    return torch.tensor(v, dtype=torch.int32)


def _hand():
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    k = torch.tensor([[1.0, 2.0], [3.0, -1.0], [-2.0, 0.5]])
    w = torch.tensor([[1.0, 0.5]])
    return q, k, w


def test_hand_computed():
    # head 0: q.k = (1, 3, -2) -> ReLU (1, 3, 0); head 1: (2, -1, 0.5) -> (2, 0, 0.5);
    # I = 1*(1, 3, 0) + 0.5*(2, 0, 0.5) = (2, 3, 0.25): order 1, 0, 2 (descending score).
    q, k, w = _hand()
    full = lightning_indexer(q, k, w, _i32(0), _i32(3), topk=2, scale=0.5)
    assert full.dtype == torch.int32 and full.tolist() == [[1, 0]]
    assert lightning_indexer(q, k, w, _i32(0), _i32(3), topk=5, scale=1.0).tolist() == [[1, 0, 2, -1, -1]]
    # Rows 1..2 only: absolute indices come back.
    assert lightning_indexer(q, k, w, _i32(1), _i32(3), topk=3, scale=1.0).tolist() == [[1, 2, -1]]
    # Weight on head 1 large: key 0 (2 + ...) beats key 1: I = (1+2*4, 3, 0+0.5*4) = (9, 3, 2).
    w2 = torch.tensor([[1.0, 4.0]])
    assert lightning_indexer(q, k, w2, _i32(0), _i32(3), topk=3, scale=1.0).tolist() == [[0, 1, 2]]


def _random(seed: int, seqs=(37, 50, 9), heads=16, dim=32, ratio=4):
    g = torch.Generator().manual_seed(seed)
    starts, ends, off = [], [], 0
    for n in seqs:
        p = torch.arange(n)
        starts.append(torch.full((n,), off))
        ends.append(off + (p + 1) // ratio)
        off += n // ratio
    t = sum(seqs)
    return dict(q=torch.randn(t, heads, dim, generator=g) + 0.3, k=torch.randn(off, dim, generator=g) + 0.3,
                weights=torch.rand(t, heads, generator=g) * heads ** -0.5,
                k_start=torch.cat(starts).int(), k_end=torch.cat(ends).int(), scale=dim ** -0.5)


@pytest.mark.parametrize("topk", [1, 3, 8, 64])
def test_visibility_and_optimality(topk):
    x = _random(1)
    out = lightning_indexer(**x, topk=topk)
    assert out.shape == (x["q"].shape[0], topk)
    for t in range(out.shape[0]):
        s0, s1 = int(x["k_start"][t]), int(x["k_end"][t])
        row = out[t].tolist()
        n = min(topk, s1 - s0)
        assert all(i == -1 for i in row[n:]), f"row {t}: padding must be -1 at the tail, got {row}"
        sel = row[:n]
        assert all(s0 <= i < s1 for i in sel) and len(set(sel)) == n, f"row {t}: {sel} not in [{s0}, {s1})"
        # Brute force, head by head: every selected key scores >= every visible unselected one,
        # and the row is in descending score order.
        vals = torch.zeros(s1 - s0, dtype=torch.float64)
        for h in range(x["q"].shape[1]):
            dots = x["k"][s0:s1].double() @ x["q"][t, h].double()
            vals += float(x["weights"][t, h]) * dots.clamp(min=0) * x["scale"]
        score = dict(zip(range(s0, s1), vals.tolist()))
        rest = [score[s] for s in score if s not in sel]
        assert all(score[i] >= max(rest, default=float("-inf")) for i in sel)
        assert [score[i] for i in sel] == sorted((score[i] for i in sel), reverse=True)


def test_edges():
    x = _random(2)
    empty = lightning_indexer(x["q"][:0], x["k"], x["weights"][:0], x["k_start"][:0], x["k_end"][:0],
                              topk=4, scale=1.0)
    assert empty.shape == (0, 4)
    # Every range empty (the first 3 tokens of a CSA sequence see no entry): all -1.
    none = lightning_indexer(x["q"][:3], x["k"], x["weights"][:3], x["k_start"][:3], x["k_end"][:3],
                             topk=4, scale=1.0)
    assert none.tolist() == [[-1] * 4] * 3
    # No keys at all.
    q, _, w = _hand()
    assert lightning_indexer(q, torch.zeros(0, 2), w, _i32(0), _i32(0), topk=2, scale=1.0).tolist() == [[-1, -1]]
    # Length-1 range and bf16 inputs.
    bf = lightning_indexer(q.bfloat16(), _hand()[1].bfloat16(), w.bfloat16(), _i32(2), _i32(3), topk=2, scale=1.0)
    assert bf.tolist() == [[2, -1]]


def test_compare_treats_rows_as_sets():
    x = _random(3, seqs=(40,))
    ref = lightning_indexer(**x, topk=4)
    assert compare_index_sets(ref.flip(1), ref, x, EXACT) is None
    wrong = ref.clone()
    wrong[-1, 0] = int(ref[-1, 1])  # a repeated key
    assert "repeated" in compare_index_sets(wrong, ref, x, EXACT)
    worse = ref.clone()
    row = int((x["k_end"] - x["k_start"]).argmax())
    unpicked = sorted(set(range(int(x["k_start"][row]), int(x["k_end"][row]))) - set(ref[row].tolist()))
    worse[row, 0] = unpicked[0]
    assert "below the k-th best" in compare_index_sets(worse, ref, x, EXACT)
    # An exact tie at the boundary (a copy of the k-th best key) may be broken either way.
    k = x["k"].clone()
    last = int(ref[row, -1])
    k[unpicked[0]] = k[last]
    tied = dict(x, k=k)
    ref2 = lightning_indexer(**tied, topk=4)
    picked = last if last in ref2[row].tolist() else unpicked[0]
    other = unpicked[0] if picked == last else last
    swapped = ref2.clone()
    swapped[row] = torch.where(ref2[row] == picked, other, ref2[row])
    assert compare_index_sets(swapped, ref2, tied, EXACT) is None
    outside = ref.clone()
    outside[row, 0] = int(x["k_end"][row])
    assert "outside" in compare_index_sets(outside, ref, x, EXACT)


def _init(mod, g):
    with torch.no_grad():
        for name, p in mod.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm" in name else 0.0))


def test_matches_transformers_deepseek_v4_indexer():
    modeling = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from transformers import DeepseekV4Config

    heads, dim, t = 16, 32, 45
    cfg = DeepseekV4Config(hidden_size=32, head_dim=32, qk_rope_head_dim=16, num_attention_heads=2,
                           num_key_value_heads=1, q_lora_rank=16, index_n_heads=heads, index_head_dim=dim,
                           index_topk=3, num_hidden_layers=2, vocab_size=64,
                           compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})
    g = torch.Generator().manual_seed(4)
    mod = modeling.DeepseekV4Indexer(cfg).float()
    _init(mod, g)
    x, qres, pos = torch.randn(1, t, 32, generator=g), torch.randn(1, t, 16, generator=g), torch.arange(t)[None]
    with torch.no_grad():
        # A constant input feature with a positive weight column keeps every head weight > 0 (no ties).
        x[..., 0] = 3.0
        mod.scorer.weights_proj.weight[:, 0] = 2.0
        theirs = mod(x, qres, pos, None, 0)[0]
        n = t // 4
        cos, sin = mod.rotary_emb(x, position_ids=(torch.arange(n) * 4)[None], layer_type="compress")
        keys = kv_compress(mod.kv_proj(x)[0], mod.gate_proj(x)[0], mod.position_bias, mod.kv_norm.weight, ratio=4,
                           overlap=True, eps=cfg.rms_norm_eps, rope=(cos[0], sin[0]), rope_dim=16)
        cq, sq = mod.rotary_emb(x, position_ids=pos, layer_type="compress")
        q = modeling.apply_rotary_pos_emb(mod.q_b_proj(qres).view(1, t, heads, dim), cq, sq, unsqueeze_dim=2)[0]
        weights = mod.scorer.weights_proj(x)[0] * heads ** -0.5
        ours = lightning_indexer(q, keys, weights, torch.zeros(t, dtype=torch.int32), ((pos[0] + 1) // 4).int(),
                                 topk=cfg.index_topk, scale=dim ** -0.5)
    assert torch.equal(ours.long().sort(1).values, theirs.sort(1).values)


def test_matches_transformers_glm_dsa_indexer():
    modeling = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")
    from transformers import GlmMoeDsaConfig

    heads, dim, rope, t, topk = 16, 32, 8, 20, 5
    cfg = GlmMoeDsaConfig(hidden_size=32, q_lora_rank=16, index_n_heads=heads, index_head_dim=dim,
                          qk_rope_head_dim=rope, index_topk=topk, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, vocab_size=64)
    g = torch.Generator().manual_seed(5)
    mod = modeling.GlmMoeDsaIndexer(cfg, 0).float()
    _init(mod, g)
    x, qres, pos = torch.randn(1, t, 32, generator=g), torch.randn(1, t, 16, generator=g), torch.arange(t)[None]
    cos, sin = modeling.GlmMoeDsaRotaryEmbedding(cfg)(x, pos)
    with torch.no_grad():
        x[..., 0] = 3.0
        mod.weights_proj.weight[:, 0] = 2.0
        theirs = mod(x, qres, (cos, sin), torch.ones(t, t, dtype=torch.bool).tril()[None], pos)[0].long()
        # Keys: LayerNorm(wk x), RoPE on the *first* `rope` dims (transformers' own helper).
        q = mod.wq_b(qres).view(1, t, heads, dim)
        k = mod.k_norm(mod.wk(x)).unsqueeze(2)
        q_rot, k_rot = modeling.apply_rotary_pos_emb_interleave(q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q[..., rope:]], -1)[0]
        k = torch.cat([k_rot, k[..., rope:]], -1)[0, :, 0]
        weights = mod.weights_proj(x)[0] * heads ** -0.5
        ours = lightning_indexer(q, k, weights, torch.zeros(t, dtype=torch.int32), torch.arange(1, t + 1).int(),
                                 topk=topk, scale=dim ** -0.5)
    # transformers fills rows with fewer than topk visible keys with masked (-inf) picks; drop them.
    theirs = torch.where(theirs <= pos[0, :, None], theirs, -1)
    assert torch.equal(ours.long().sort(1).values, theirs.sort(1).values)


def test_bad_input():
    q, k, w = _hand()
    kw = dict(topk=2, scale=1.0)
    with pytest.raises(ValueError, match="q must be"):
        lightning_indexer(q[0], k, w, _i32(0), _i32(3), **kw)
    with pytest.raises(ValueError, match="k must be"):
        lightning_indexer(q, k[:, :1], w, _i32(0), _i32(3), **kw)
    with pytest.raises(ValueError, match="weights shape"):
        lightning_indexer(q, k, w[:, :1], _i32(0), _i32(3), **kw)
    with pytest.raises(ValueError, match="k_end"):
        lightning_indexer(q, k, w, _i32(0), torch.tensor([3.0]), **kw)
    with pytest.raises(ValueError, match="key ranges"):
        lightning_indexer(q, k, w, _i32(0), _i32(4), **kw)
    with pytest.raises(ValueError, match="key ranges"):
        lightning_indexer(q, k, w, _i32(2), _i32(1), **kw)
    with pytest.raises(ValueError, match="topk"):
        lightning_indexer(q, k, w, _i32(0), _i32(3), topk=0, scale=1.0)
