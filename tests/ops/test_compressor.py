"""KV compressor contracts: the step form against the whole-sequence form, hand-computed windows,
the CSA overlap rule, speculative rollback, transformers' DeepSeek-V4 compressors, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops.compressor import compress_rope as rope_tables, kv_compress, kv_compress_step

EPS = 1e-6


def _make(seed: int, t: int, d: int, m: int, overlap: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    c = 2 if overlap else 1
    return {"kv": torch.randn(t, c * d, generator=g), "score": 2 * torch.randn(t, c * d, generator=g),
            "ape": 0.5 * torch.randn(m, c * d, generator=g), "norm_weight": 1 + 0.2 * torch.randn(d, generator=g)}


def _whole(x: dict, m: int, overlap: bool, rope_dim: int | None, t: int | None = None) -> torch.Tensor:
    t = x["kv"].shape[0] if t is None else t
    rope = rope_tables(torch.arange(t // m) * m, rope_dim) if rope_dim else None
    return kv_compress(x["kv"][:t], x["score"][:t], x["ape"], x["norm_weight"], ratio=m, overlap=overlap, eps=EPS,
                       rope=rope, rope_dim=rope_dim or 64)


def _step(x: dict, p: int, states, m: int, overlap: bool, rope_dim: int | None, slot: int = 0):
    """Feed token p of sequence x as request `slot` of a batch given by `states` (B requests)."""
    skv, ssc = states
    b = skv.shape[0]
    kv = torch.zeros(b, skv.shape[2])
    score = torch.zeros(b, skv.shape[2])
    kv[slot], score[slot] = x["kv"][p], x["score"][p]
    positions = torch.full((b,), p, dtype=torch.int64)
    rope = rope_tables(torch.full((b,), (p // m) * m), rope_dim) if rope_dim else None
    e, emitted, skv, ssc = kv_compress_step(kv, score, positions, skv, ssc, x["ape"], x["norm_weight"], ratio=m,
                                            overlap=overlap, eps=EPS, rope=rope, rope_dim=rope_dim or 64)
    return (e[slot] if emitted[slot] else None), (skv, ssc)


def _nan_states(b: int, rows: int, width: int):
    # The initial ring content must never be read: NaN makes any stray read visible.
    return torch.full((b, rows, width), float("nan")), torch.full((b, rows, width), float("nan"))


CONFIGS = [  # m, overlap, D, rope_dim, ring rows
    (4, True, 16, 8, 8), (4, True, 16, 8, 20), (4, True, 8, None, 8),
    (8, False, 16, 8, 8), (8, False, 16, None, 24), (128, False, 8, 4, 128),
]


@pytest.mark.parametrize("m,overlap,d,rope_dim,rows", CONFIGS)
def test_step_by_step_matches_whole(m, overlap, d, rope_dim, rows):
    t = 3 * m + m // 2 + 1
    x = _make(1, t, d, m, overlap)
    states = _nan_states(1, rows, x["kv"].shape[1])
    got = []
    for p in range(t):
        e, states = _step(x, p, states, m, overlap, rope_dim)
        if e is not None:
            assert (p + 1) % m == 0
            got.append(e)
    want = _whole(x, m, overlap, rope_dim)
    assert len(got) == want.shape[0] == t // m
    torch.testing.assert_close(torch.stack(got), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("m,overlap,d,rope_dim,rows", CONFIGS[:2] + CONFIGS[3:5])
@pytest.mark.parametrize("split", [5, 8])
def test_whole_prefill_then_steps(m, overlap, d, rope_dim, rows, split):
    """Chunk 1 through kv_compress, its tail written into the ring by the documented layout
    (row p % R holds kv[p] and score[p] + ape[p % m]), chunk 2 token by token."""
    t = 4 * m + 3
    split = min(split, t - 1)
    x = _make(2, t, d, m, overlap)
    width = x["kv"].shape[1]
    skv, ssc = _nan_states(1, rows, width)
    for p in range(max(0, split - rows), split):
        skv[0, p % rows] = x["kv"][p]
        ssc[0, p % rows] = x["score"][p] + x["ape"][p % m]
    got = [_whole(x, m, overlap, rope_dim, t=split)]
    states = (skv, ssc)
    for p in range(split, t):
        e, states = _step(x, p, states, m, overlap, rope_dim)
        if e is not None:
            got.append(e[None])
    torch.testing.assert_close(torch.cat(got), _whole(x, m, overlap, rope_dim), atol=1e-6, rtol=1e-6)


def test_batched_requests_and_reshuffle():
    """Two sequences stepped together; midway the engine swaps their batch slots (states follow)."""
    m, d, rope_dim, rows = 4, 16, 8, 12
    xs = [_make(3, 19, d, m, True), _make(4, 19, d, m, True)]
    skv, ssc = _nan_states(2, rows, 2 * d)
    slots, got = [0, 1], [[], []]
    for p in range(19):
        if p == 9:
            slots = [1, 0]
            skv, ssc = skv.flip(0), ssc.flip(0)
        kv = torch.stack([xs[slots.index(s)]["kv"][p] for s in range(2)])
        score = torch.stack([xs[slots.index(s)]["score"][p] for s in range(2)])
        rope = rope_tables(torch.full((2,), (p // m) * m), rope_dim)
        e, emitted, skv, ssc = kv_compress_step(kv, score, torch.full((2,), p), skv, ssc, xs[0]["ape"],
                                                xs[0]["norm_weight"], ratio=m, overlap=True, eps=EPS,
                                                rope=rope, rope_dim=rope_dim)
        for i in range(2):
            if emitted[slots[i]]:
                got[i].append(e[slots[i]])
    for i in range(2):
        x = dict(xs[i], ape=xs[0]["ape"], norm_weight=xs[0]["norm_weight"])
        torch.testing.assert_close(torch.stack(got[i]), _whole(x, m, True, rope_dim), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rows,ok", [(12, True), (8, False)])
def test_speculative_rollback_needs_no_undo(rows, ok):
    """Accepted up to p=5, three draft tokens (6, 7, 8) written and rejected, then the true tokens:
    with R = c*m + m the result is exact; with R = c*m the draft at 8 clobbers window 0's Ca rows."""
    m, d = 4, 16
    x = _make(5, 16, d, m, True)
    states = _nan_states(1, rows, 2 * d)
    got = []
    for p in range(6):
        e, states = _step(x, p, states, m, True, 8)
        got += [e] if e is not None else []
    draft = _make(6, 16, d, m, True)
    draft.update(ape=x["ape"], norm_weight=x["norm_weight"])
    spec_states = states
    for p in (6, 7, 8):
        _, spec_states = _step(draft, p, spec_states, m, True, 8)
    states = spec_states
    for p in range(6, 16):
        e, states = _step(x, p, states, m, True, 8)
        got += [e] if e is not None else []
    same = torch.allclose(torch.stack(got), _whole(x, m, True, 8), atol=1e-6, rtol=1e-6)
    assert same == ok


def test_hand_computed_hca_window():
    # m=2, D=2, one window. Logits = score + ape: channel 0 (0, ln 3) -> weights (1/4, 3/4);
    # channel 1 (0.5, 0.5) -> (1/2, 1/2).
    kv = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    score = torch.tensor([[0.0, 0.5], [math.log(3.0), 0.0]])
    ape = torch.tensor([[0.0, 0.0], [0.0, 0.5]])
    w = torch.tensor([1.0, 2.0])
    e0, e1 = 0.25 * 1 + 0.75 * 3, 0.5 * (-2) + 0.5 * 4            # 2.5, 1.0
    inv = 1 / math.sqrt((e0 ** 2 + e1 ** 2) / 2 + EPS)
    y0, y1 = e0 * inv * 1.0, e1 * inv * 2.0
    out = kv_compress(kv, score, ape, w, ratio=2, overlap=False, eps=EPS)
    torch.testing.assert_close(out, torch.tensor([[y0, y1]]), atol=1e-6, rtol=1e-6)
    cos, sin = torch.tensor([[0.6]]), torch.tensor([[0.8]])
    out = kv_compress(kv, score, ape, w, ratio=2, overlap=False, eps=EPS, rope=(cos, sin), rope_dim=2)
    want = torch.tensor([[y0 * 0.6 - y1 * 0.8, y1 * 0.6 + y0 * 0.8]])
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)


def test_hand_computed_csa_windows():
    # m=2, D=2, 4 tokens -> 2 entries; channels [Ca0, Ca1, Cb0, Cb1].
    kv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 2.0, -3.0], [0.0, 1.0, -2.0, 1.0], [2.0, -1.0, 1.0, 0.0]])
    score = torch.tensor([[0.1, -0.2, 0.3, 0.0], [0.0, 0.4, -0.1, 0.2], [0.5, 0.0, 0.0, -0.3], [-0.2, 0.1, 0.2, 0.6]])
    ape = torch.tensor([[0.0, 0.1, -0.1, 0.2], [0.3, 0.0, 0.0, -0.2]])
    logit = [[float(score[t, j] + ape[t % 2, j]) for j in range(4)] for t in range(4)]

    def pool(slots):  # slots: (token, channel) pairs of one output channel
        ex = [math.exp(logit[t][j]) for t, j in slots]
        return sum(e * float(kv[t, j]) for e, (t, j) in zip(ex, slots)) / sum(ex)

    # Entry 0: Cb halves of tokens 0, 1 only. Entry 1: Ca of tokens 0, 1 then Cb of tokens 2, 3.
    entries = [[pool([(0, 2 + c), (1, 2 + c)]) for c in range(2)],
               [pool([(0, c), (1, c), (2, 2 + c), (3, 2 + c)]) for c in range(2)]]
    w = [0.5, 1.5]
    want = [[v / math.sqrt(sum(u * u for u in e) / 2 + EPS) * w[c] for c, v in enumerate(e)] for e in entries]
    out = kv_compress(kv, score, ape, torch.tensor(w), ratio=2, overlap=True, eps=EPS)
    torch.testing.assert_close(out, torch.tensor(want), atol=1e-6, rtol=1e-6)


def test_overlap_rule():
    m, d = 4, 8
    x = _make(7, 5 * m, d, m, True)
    base = _whole(x, m, True, None)
    # Entry 0 pools only window 0's Cb halves: it equals an HCA pooling of them.
    cb = {"kv": x["kv"][:m, d:], "score": x["score"][:m, d:], "ape": x["ape"][:, d:], "norm_weight": x["norm_weight"]}
    torch.testing.assert_close(base[0], _whole(cb, m, False, None)[0], atol=1e-6, rtol=1e-6)
    # Changing window 0's Ca halves changes entry 1 only; changing window 2 changes entries 2, 3.
    y = {k: v.clone() for k, v in x.items()}
    y["kv"][:m, :d] += 1.0
    changed = (_whole(y, m, True, None) - base).abs().amax(dim=1) > 1e-5
    assert changed.tolist() == [False, True, False, False, False]
    y = {k: v.clone() for k, v in x.items()}
    y["score"][2 * m:3 * m] += torch.randn(m, 2 * d)
    changed = (_whole(y, m, True, None) - base).abs().amax(dim=1) > 1e-5
    assert changed.tolist() == [False, False, True, True, False]


def test_step_stores_ape_and_zeroes_silent_rows():
    m, d = 4, 8
    x = _make(8, 4, d, m, True)
    skv, ssc = torch.zeros(2, 8, 2 * d), torch.zeros(2, 8, 2 * d)
    rope = (torch.full((2, 2), float("nan")), torch.full((2, 2), float("nan")))  # ignored: nothing emits
    e, emitted, nkv, nsc = kv_compress_step(x["kv"][:2], x["score"][:2], torch.tensor([1, 6]), skv, ssc, x["ape"],
                                            x["norm_weight"], ratio=m, overlap=True, eps=EPS, rope=rope, rope_dim=4)
    assert emitted.tolist() == [False, False] and torch.equal(e, torch.zeros(2, d))
    assert torch.equal(nsc[0, 1], x["score"][0] + x["ape"][1]) and torch.equal(nsc[1, 6], x["score"][1] + x["ape"][2])
    assert torch.equal(nkv[1, 6], x["kv"][1]) and torch.equal(skv, torch.zeros(2, 8, 2 * d))  # input untouched


def test_edges():
    x = _make(9, 3, 8, 4, True)
    assert _whole(x, 4, True, 8).shape == (0, 8)
    assert _whole(x, 4, True, 8, t=0).shape == (0, 8)
    out = kv_compress_step(torch.zeros(0, 16), torch.zeros(0, 16), torch.zeros(0, dtype=torch.int64),
                           torch.zeros(0, 8, 16), torch.zeros(0, 8, 16), x["ape"], x["norm_weight"], ratio=4,
                           overlap=True, eps=EPS)
    assert [tuple(o.shape) for o in out] == [(0, 8), (0,), (0, 8, 16), (0, 8, 16)]
    x1 = _make(10, 1, 8, 1, False)  # ratio 1: every token is its own entry
    assert _whole(x1, 1, False, None).shape == (1, 8)


def test_bf16_output_dtype():
    x = {k: (v.bfloat16() if k in ("kv", "score") else v) for k, v in _make(11, 8, 16, 4, True).items()}
    assert _whole(x, 4, True, 8).dtype == torch.bfloat16


@pytest.mark.parametrize("m,overlap", [(8, False), (4, True)])
def test_matches_transformers_deepseek_v4(m, overlap):
    modeling = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from transformers import DeepseekV4Config

    cfg = DeepseekV4Config(hidden_size=32, head_dim=32, qk_rope_head_dim=16, num_attention_heads=2,
                           num_key_value_heads=1, q_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=2,
                           num_hidden_layers=2, vocab_size=64,
                           compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})
    cls = modeling.DeepseekV4CSACompressor if overlap else modeling.DeepseekV4HCACompressor
    g = torch.Generator().manual_seed(12)
    mod = cls(cfg).float()
    with torch.no_grad():
        for name, p in mod.named_parameters():  # position_bias is torch.empty at init
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if "norm" in name else 0.0))
        t = 37
        x = torch.randn(1, t, 32, generator=g)
        theirs, _ = mod(x, torch.randn(1, t, 16, generator=g), torch.arange(t)[None], None, 0)
        n = t // m
        cos, sin = mod.rotary_emb(x, position_ids=(torch.arange(n) * m)[None], layer_type="compress")
        ours = kv_compress(mod.kv_proj(x)[0], mod.gate_proj(x)[0], mod.position_bias, mod.kv_norm.weight, ratio=m,
                           overlap=overlap, eps=cfg.rms_norm_eps, rope=(cos[0], sin[0]), rope_dim=16)
    torch.testing.assert_close(ours, theirs[0, 0], atol=1e-5, rtol=1e-5)


def _bad_step(**over):
    x = _make(13, 2, 8, 4, True)
    args = dict(kv=x["kv"], score=x["score"], positions=torch.tensor([0, 5]), state_kv=torch.zeros(2, 8, 16),
                state_score=torch.zeros(2, 8, 16), ape=x["ape"], norm_weight=x["norm_weight"])
    args.update(over)
    return kv_compress_step(**args, ratio=4, overlap=True, eps=EPS)


def test_bad_input():
    x = _make(14, 8, 8, 4, True)
    kw = dict(ratio=4, overlap=True, eps=EPS)
    with pytest.raises(ValueError, match="score shape"):
        kv_compress(x["kv"], x["score"][:7], x["ape"], x["norm_weight"], **kw)
    with pytest.raises(ValueError, match="norm_weight"):
        kv_compress(x["kv"], x["score"], x["ape"], torch.ones(16), **kw)
    with pytest.raises(ValueError, match="ape shape"):
        kv_compress(x["kv"], x["score"], x["ape"][:2], x["norm_weight"], **kw)
    with pytest.raises(ValueError, match="even kv width"):
        kv_compress(x["kv"][:, :15], x["score"][:, :15], x["ape"][:, :15], x["norm_weight"], **kw)
    with pytest.raises(ValueError, match="rope cos/sin"):
        kv_compress(x["kv"], x["score"], x["ape"], x["norm_weight"], rope=rope_tables(torch.arange(3), 4),
                    rope_dim=4, **kw)
    with pytest.raises(ValueError, match="rope_dim"):
        kv_compress(x["kv"], x["score"], x["ape"], x["norm_weight"], rope=rope_tables(torch.arange(2), 4),
                    rope_dim=10, **kw)
    with pytest.raises(ValueError, match="ratio"):
        kv_compress(x["kv"], x["score"], x["ape"], x["norm_weight"], ratio=0, overlap=True, eps=EPS)
    with pytest.raises(ValueError, match="too small"):
        _bad_step(state_kv=torch.zeros(2, 4, 16), state_score=torch.zeros(2, 4, 16))
    with pytest.raises(ValueError, match="misaligned"):
        _bad_step(state_kv=torch.zeros(2, 10, 16), state_score=torch.zeros(2, 10, 16))
    with pytest.raises(ValueError, match="fp32"):
        _bad_step(state_kv=torch.zeros(2, 8, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="positions"):
        _bad_step(positions=torch.tensor([0.0, 5.0]))
    with pytest.raises(ValueError, match=">= 0"):
        _bad_step(positions=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="state_kv shape"):
        _bad_step(state_kv=torch.zeros(3, 8, 16))
