"""Reference checks for the block_sparse family (MiniMax-M3): hand-computed cases, dense causal
attention by an independent loop, transformers' MiniMax-M3 indexer and block mask as oracles,
the selection compare function, edge cases and bad inputs."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops.block_sparse import block_sparse_attention, block_sparse_indexer, compare_block_selection


def _cu(*lens: int) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int32).cumsum(0).to(torch.int32)


def _loop_causal_attention(q, k, v, lens, scale):
    """Dense bottom-right causal GQA attention, one query and head at a time, in plain Python."""
    out = torch.zeros(q.shape)
    group = q.shape[1] // k.shape[1]
    q0 = k0 = 0
    for q_len, k_len in lens:
        for i in range(q_len):
            p = k_len - q_len + i
            for h in range(q.shape[1]):
                g = h // group
                logits = [scale * float(q[q0 + i, h] @ k[k0 + j, g]) for j in range(p + 1)]
                top = max(logits)
                w = [math.exp(x - top) for x in logits]
                out[q0 + i, h] = sum(wj * v[k0 + j, g] for j, wj in enumerate(w)) / sum(w)
        q0, k0 = q0 + q_len, k0 + k_len
    return out


def test_all_blocks_selected_is_dense_causal_attention():
    gen = torch.Generator().manual_seed(0)
    lens, bs = [(5, 5), (3, 11), (1, 7)], 4
    t_len, s_len = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn(t_len, 4, 8, generator=gen)
    k, v = torch.randn(s_len, 2, 8, generator=gen), torch.randn(s_len, 2, 8, generator=gen)
    n_sel = 3                                                 # ceil(11 / 4): every block of the longest
    blocks = torch.full((t_len, 2, n_sel), -1, dtype=torch.int32)
    row = 0
    for q_len, k_len in lens:
        nb = -(-k_len // bs)
        blocks[row:row + q_len, :, :nb] = torch.arange(nb).flip(0)   # order must not matter
        row += q_len
    out = block_sparse_attention(q, k, v, blocks, _cu(*[a for a, _ in lens]), _cu(*[b for _, b in lens]),
                                 block_size=bs, scale=0.4)
    torch.testing.assert_close(out, _loop_causal_attention(q, k, v, lens, 0.4), rtol=1e-5, atol=1e-6)


def test_hand_cases_causality_duplicates_and_empty_rows():
    # one sequence of 4 keys (block_size 2), 3 queries at positions 1, 2, 3; one head, D = 1
    q = torch.ones(3, 1, 1)
    k = torch.tensor([0.0, 1.0, 2.0, 3.0]).view(4, 1, 1)
    v = torch.tensor([10.0, 20.0, 30.0, 40.0]).view(4, 1, 1)
    blocks = torch.tensor([[[0, -1]], [[1, 1]], [[-1, -1]]], dtype=torch.int32)
    out = block_sparse_attention(q, k, v, blocks, _cu(3), _cu(4), block_size=2, scale=1.0)
    # pos 1, block 0: keys 0, 1 with weights 1 : e
    assert math.isclose(float(out[0]), (10 + 20 * math.e) / (1 + math.e), rel_tol=1e-6)
    # pos 2, block 1 listed twice: only key 2 (key 3 is in the future), attended once
    assert math.isclose(float(out[1]), 30.0, rel_tol=1e-6)
    # no block: zero
    assert float(out[2]) == 0.0


def test_indexer_hand_case():
    # D = 1, q = 1: score of key j is k[j]; block_size 2, 7 keys, one query per position 3 and 6
    k = torch.tensor([5.0, -1.0, 2.0, 9.0, 3.0, 0.0, 7.0]).view(7, 1)
    q = torch.ones(2, 1, 1)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 11], dtype=torch.int32)
    kk = torch.cat([k[:4], k])                                # seq 0: keys 0..3; seq 1: keys 0..6
    out = block_sparse_indexer(q, kk, cu_q, cu_k, block_size=2, topk_blocks=3, local_blocks=1)
    # seq 0, pos 3 (own block 1): blocks 0 (max 5), 1 (forced) -> {1, 0}, then -1
    assert sorted(out[0, 0, :2].tolist()) == [0, 1] and out[0, 0, 2] == -1
    # seq 1, pos 6 (own block 3): block maxima 5, 9, 3, forced 3 -> {3, 1, 0}
    assert sorted(out[1, 0].tolist()) == [0, 1, 3]
    # two local blocks: {3, 2} forced, then the best other (1, max 9)
    out = block_sparse_indexer(q, kk, cu_q, cu_k, block_size=2, topk_blocks=3, local_blocks=2)
    assert sorted(out[1, 0].tolist()) == [1, 2, 3]


def _m3_indexer(heads=2, dim=32, block=4, topk=3, local=1):
    mod = pytest.importorskip("transformers.models.minimax_m3_vl.modeling_minimax_m3_vl")
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig
    cfg = MiniMaxM3VLTextConfig(hidden_size=64, num_attention_heads=4 * heads, num_key_value_heads=heads,
                                head_dim=dim, index_n_heads=heads, index_head_dim=dim, index_block_size=block,
                                index_topk_blocks=topk, index_local_blocks=local, num_hidden_layers=1,
                                layer_types=["minimax_m3_sparse"])
    torch.manual_seed(5)
    indexer = mod.MiniMaxM3VLIndexer(cfg, 0)
    with torch.no_grad():
        indexer.q_norm.weight.normal_(0, 0.3)
        indexer.k_norm.weight.normal_(0, 0.3)
    return mod, cfg, indexer


@pytest.mark.parametrize("local", [1, 2])
def test_indexer_matches_transformers_minimax_m3(local):
    mod, cfg, indexer = _m3_indexer(local=local)
    b, s, heads, dim = 2, 23, 2, 32
    x = torch.randn(b, s, 64)
    pos = torch.arange(s)[None].expand(b, -1)
    cos, sin = mod.MiniMaxM3VLRotaryEmbedding(cfg)(x, pos)
    with torch.no_grad():
        hf = indexer(x, (cos, sin), None, pos)                         # [B, H, S, topk]
        iq = indexer.q_norm(indexer.q_proj(x).view(b, s, heads, dim)).transpose(1, 2)
        ik = indexer.k_norm(indexer.k_proj(x).view(b, s, 1, dim)).transpose(1, 2)
        iq, ik = mod.apply_rotary_pos_emb(iq, ik, cos, sin)
    q_packed = iq.transpose(1, 2).reshape(b * s, heads, dim)
    k_packed = ik[:, 0].reshape(b * s, dim)
    ours = block_sparse_indexer(q_packed, k_packed, _cu(s, s), _cu(s, s), block_size=4, topk_blocks=3,
                                local_blocks=local)
    expect = hf.permute(0, 2, 1, 3).reshape(b * s, heads, 3).to(torch.int32)
    inputs = dict(q=q_packed, k=k_packed, cu_seqlens_q=_cu(s, s), cu_seqlens_k=_cu(s, s), block_size=4,
                  local_blocks=local)
    assert compare_block_selection(ours, expect, inputs, None) is None
    # bottom-right alignment: the last 6 queries of each sequence against all keys (chunked prefill)
    tail = torch.cat([q_packed[s - 6:s], q_packed[2 * s - 6:]])
    ours = block_sparse_indexer(tail, k_packed, _cu(6, 6), _cu(s, s), block_size=4, topk_blocks=3,
                                local_blocks=local)
    expect_tail = torch.cat([expect[s - 6:s], expect[2 * s - 6:]])
    tail_inputs = inputs | dict(q=tail, cu_seqlens_q=_cu(6, 6))
    assert compare_block_selection(ours, expect_tail, tail_inputs, None) is None


def test_attention_matches_transformers_block_mask():
    mod, cfg, indexer = _m3_indexer()
    gen = torch.Generator().manual_seed(6)
    s, hq, hkv, dim = 19, 8, 2, 32
    q = torch.randn(1, hq, s, dim, generator=gen)
    k, v = torch.randn(1, hkv, s, dim, generator=gen), torch.randn(1, hkv, s, dim, generator=gen)
    pos = torch.arange(s)[None]
    blocks = torch.stack([torch.randperm(5, generator=gen)[:3] for _ in range(hkv * s)]).view(1, hkv, s, 3)
    # Own block always listed (as the indexer guarantees): a row with no visible key is 0 here
    # but uniform over all keys in transformers' finfo.min mask, a case the model never hits.
    own = torch.arange(s) // 4
    blocks = torch.where((blocks == own[None, None, :, None]).any(-1, keepdim=True), blocks,
                         torch.cat([own.view(1, 1, s, 1).expand(1, hkv, s, 1), blocks[..., 1:]], -1))
    blocks[0, 0, 4, 1:] = -1
    mask = indexer.build_block_mask(blocks, None, s, torch.float32, q.device, pos)
    fake = type("Attn", (), {"num_key_value_groups": hq // hkv, "training": False})()
    hf, _ = mod.eager_attention_forward(fake, q, k, v, mask, scaling=dim ** -0.5)
    ours = block_sparse_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                  blocks[0].permute(1, 0, 2).to(torch.int32), _cu(s), _cu(s),
                                  block_size=4, scale=dim ** -0.5)
    torch.testing.assert_close(ours, hf[0], rtol=1e-5, atol=1e-5)


def test_compare_block_selection():
    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(3, 1, 8, generator=gen), torch.randn(12, 8, generator=gen)
    inputs = dict(q=q, k=k, cu_seqlens_q=_cu(3), cu_seqlens_k=_cu(12), block_size=2, local_blocks=1)
    ref = block_sparse_indexer(q, k, _cu(3), _cu(12), block_size=2, topk_blocks=3)
    assert compare_block_selection(ref.flip(-1).sort(-1, descending=True).values, ref, inputs, None) is None
    wrong = ref.clone()
    own = {9: 4, 10: 5, 11: 5}
    for t in range(3):                                   # swap a non-forced pick for an unchosen block
        cand = [b for b in range(own[9 + t] + 1) if b not in ref[t, 0].tolist()]
        victim = next(i for i, b in enumerate(ref[t, 0].tolist()) if b != own[9 + t])
        wrong[t, 0, victim] = cand[0]
    assert compare_block_selection(wrong, ref, inputs, None) is not None
    dup = ref.clone()
    dup[0, 0, 1] = dup[0, 0, 0]
    assert "twice" in compare_block_selection(dup, ref, inputs, None)


def test_edge_shapes():
    q, k = torch.randn(0, 2, 8), torch.randn(5, 8)
    assert block_sparse_indexer(q, k, _cu(0), _cu(5), block_size=2, topk_blocks=4).shape == (0, 2, 4)
    out = block_sparse_indexer(torch.randn(1, 2, 8), torch.randn(1, 8), _cu(1), _cu(1), block_size=4,
                               topk_blocks=3)
    assert out.tolist() == [[[0, -1, -1], [0, -1, -1]]]
    kv = torch.randn(1, 1, 8)
    out = block_sparse_attention(torch.randn(1, 2, 8), kv, kv, torch.zeros(1, 1, 1, dtype=torch.int32),
                                 _cu(1), _cu(1), block_size=4, scale=1.0)
    torch.testing.assert_close(out, kv.expand(1, 2, 8))


def test_bad_inputs_raise():
    q, k, v = torch.randn(4, 4, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    blocks = torch.zeros(4, 2, 2, dtype=torch.int32)
    cases = [
        (dict(q=torch.randn(4, 3, 8)), "multiple"),
        (dict(block_indices=torch.full((4, 2, 2), 2, dtype=torch.int32)), "lie in"),
        (dict(block_indices=torch.zeros(4, 1, 2, dtype=torch.int32)), "block_indices"),
        (dict(cu_seqlens_q=_cu(2, 2)), "different sequence counts"),
        (dict(cu_seqlens_k=_cu(5)), "rise from 0"),
        (dict(cu_seqlens_q=_cu(4), cu_seqlens_k=torch.tensor([0, 6]).float()), "int32"),
        (dict(v=torch.randn(6, 2, 4)), "expected"),
    ]
    for change, msg in cases:
        args = dict(q=q, k=k, v=v, block_indices=blocks, cu_seqlens_q=_cu(4), cu_seqlens_k=_cu(6)) | change
        with pytest.raises(ValueError, match=msg):
            block_sparse_attention(**args, block_size=4, scale=1.0)
    with pytest.raises(ValueError, match="q_len"):
        block_sparse_attention(q, k[:3], v[:3], blocks, _cu(4), _cu(3), block_size=4, scale=1.0)
    with pytest.raises(ValueError, match="local_blocks"):
        block_sparse_indexer(q, k[:, 0], _cu(4), _cu(6), block_size=2, topk_blocks=1, local_blocks=2)
    with pytest.raises(ValueError, match="expected"):
        block_sparse_indexer(q, k, _cu(4), _cu(6), block_size=2, topk_blocks=1)
