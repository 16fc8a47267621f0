"""Dense attention contracts: hand-computed values, an explicit-loop oracle for the mask /
window / sink / gate semantics, paged == varlen on the same data, transformers' eager attention
as an oracle, edge cases and bad input."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops import get_op
from hwinfer.ops.attention import attention
from hwinfer.ops.attention_paged import paged_attention


def _cu(lens: list[int]) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _loop_attention(q, k, v, q_lens, k_lens, scale, causal=True, window=None, sinks=None, gate=None):
    """Independent oracle: Python loops over sequences, queries, heads and keys, float64."""
    t_total, hq, _ = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    qd, kd, vd = q.double().tolist(), k.double().tolist(), v.double().tolist()
    out = [[[0.0] * dv for _ in range(hq)] for _ in range(t_total)]
    q0 = k0 = 0
    for lq, lk in zip(q_lens, k_lens):
        for t in range(lq):
            pos = lk - lq + t
            keys = [j for j in range(lk) if (not causal or j <= pos)
                    and (window is None or j >= pos - window + 1)]
            for h in range(hq):
                g = h // (hq // hkv)
                logits = [scale * sum(a * b for a, b in zip(qd[q0 + t][h], kd[k0 + j][g])) for j in keys]
                extra = [float(sinks[h])] if sinks is not None else []
                if not logits:
                    continue
                m = max(logits + extra)
                w = [math.exp(x - m) for x in logits]
                den = sum(w) + sum(math.exp(s - m) for s in extra)
                for d in range(dv):
                    val = sum(wi * vd[k0 + j][g][d] for wi, j in zip(w, keys)) / den
                    if gate is not None:
                        val /= 1.0 + math.exp(-float(gate[q0 + t, h, d]))
                    out[q0 + t][h][d] = val
        q0, k0 = q0 + lq, k0 + lk
    return torch.tensor(out, dtype=torch.float64).reshape(t_total, hq, dv)


def test_hand_computed_three_tokens():
    # One head, Dk = 2, Dv = 1, scale 1. Causal logits worked out by hand:
    # t0 sees k0 (q0.k0 = 1); t1 sees k0, k1 with logits 0, 1; t2 sees k0, k1, k2 with 1, 1, 0.
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]).view(3, 1, 2)
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]).view(3, 1, 2)
    v = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    e = math.e
    expected = torch.tensor([1.0, (1 + 2 * e) / (1 + e), (e + 2 * e + 3) / (2 * e + 1)])
    out = attention(q, k, v, _cu([3]), _cu([3]), scale=1.0)
    torch.testing.assert_close(out.view(3), expected, rtol=1e-6, atol=1e-6)
    # Non-causal: every token sees all three keys; t0's logits are 1, 0, 1.
    out = attention(q, k, v, _cu([3]), _cu([3]), scale=1.0, causal=False)
    torch.testing.assert_close(out[0].view(()), torch.tensor((e + 2 + 3 * e) / (2 * e + 1)))
    # A sink s = 0 adds exp(0) to t0's denominator: 1 * e / (e + 1).
    out = attention(q, k, v, _cu([3]), _cu([3]), scale=1.0, sinks=torch.zeros(1))
    torch.testing.assert_close(out[0].view(()), torch.tensor(e / (e + 1)))


def test_window_one_sees_only_itself():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, 4, 8, generator=g) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA 2: heads 0,1 -> kv 0; heads 2,3 -> kv 1
    out = attention(q, k, v, _cu([3, 4]), _cu([3, 4]), scale=0.5, window=1)
    torch.testing.assert_close(out, v.repeat_interleave(2, dim=1))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = attention(q, k, v, _cu([3, 4]), _cu([3, 4]), scale=0.5, window=1, sinks=sinks)
    own = 0.5 * (q * k.repeat_interleave(2, dim=1)).sum(-1)  # [T, Hq] the single visible logit
    keep = torch.sigmoid(own - sinks)  # e^l / (e^l + e^s)
    torch.testing.assert_close(out, v.repeat_interleave(2, dim=1) * keep[..., None])


LOOP_CASES = {
    "gqa_prefix": dict(q_lens=[3, 5, 1], k_lens=[6, 5, 4], hq=4, hkv=2),
    "window3_prefix": dict(q_lens=[6, 2], k_lens=[6, 7], hq=2, hkv=1, window=3),
    "window_longer_than_seq": dict(q_lens=[4], k_lens=[4], hq=2, hkv=2, window=50),
    "sinks_window": dict(q_lens=[5, 3], k_lens=[8, 3], hq=4, hkv=1, window=4, sinks=True),
    "gate_dk_ne_dv": dict(q_lens=[4, 2], k_lens=[4, 6], hq=2, hkv=2, dv=5, gate=True),
    "v_is_k": dict(q_lens=[3, 4], k_lens=[5, 4], hq=4, hkv=1, dv=None, sinks=True),
    "noncausal": dict(q_lens=[2, 5, 0], k_lens=[6, 3, 2], hq=2, hkv=1, causal=False),
}


@pytest.mark.parametrize("name", list(LOOP_CASES))
def test_matches_explicit_loop(name):
    c = dict(LOOP_CASES[name])
    g = torch.Generator().manual_seed(len(name))
    dk = 8
    dv = c.get("dv", dk)
    t, s = sum(c["q_lens"]), sum(c["k_lens"])
    q = torch.randn(t, c["hq"], dk, generator=g)
    k = torch.randn(s, c["hkv"], dk, generator=g)
    v = None if "dv" in c and dv is None else torch.randn(s, c["hkv"], dv, generator=g)
    sinks = torch.randn(c["hq"], generator=g) if c.get("sinks") else None
    gate = torch.randn(t, c["hq"], dv, generator=g) if c.get("gate") else None
    kw = dict(scale=0.4, causal=c.get("causal", True), window=c.get("window"), sinks=sinks)
    out = attention(q, k, v, _cu(c["q_lens"]), _cu(c["k_lens"]), gate=gate, **kw)
    want = _loop_attention(q, k, k if v is None else v, c["q_lens"], c["k_lens"], gate=gate, **kw)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)


def _gathered(inputs):
    """The paged inputs as varlen inputs: every sequence's positions 0..L-1 copied by an explicit
    loop over block_table. Positions whose table entry is unused (before a window) get zeros:
    no query sees them."""
    q, kc, vc = inputs["q"], inputs["k_cache"], inputs["v_cache"]
    table, lens = inputs["block_table"].tolist(), inputs["seq_lens"].tolist()
    bsz, sq = q.shape[:2]
    block = kc.shape[1]
    ks, vs = [], []
    for b, n in enumerate(lens):
        for p in range(n):
            blk = table[b][p // block]
            ok = 0 <= blk < kc.shape[0]
            ks.append(kc[blk, p % block] if ok else torch.zeros_like(kc[0, 0]))
            if vc is not None:
                vs.append(vc[blk, p % block] if ok else torch.zeros_like(vc[0, 0]))
    gate = inputs.get("gate")
    return dict(q=q.reshape(bsz * sq, *q.shape[2:]), k=torch.stack(ks),
                v=torch.stack(vs) if vc is not None else None,
                cu_seqlens_q=_cu([sq] * bsz), cu_seqlens_k=_cu(lens), scale=inputs["scale"],
                window=inputs.get("window"), sinks=inputs.get("sinks"),
                gate=None if gate is None else gate.reshape(bsz * sq, *gate.shape[2:]))


@pytest.mark.parametrize("case", get_op("paged_attention").cases, ids=lambda c: c.name)
def test_paged_equals_varlen_on_gathered_cache(case):
    inputs = case.make(torch.Generator().manual_seed(3), torch.float32, torch.device("cpu"))
    out = paged_attention(**inputs)
    want = attention(**_gathered(inputs)).view(out.shape)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_paged_never_reads_invisible_slots_or_unused_entries():
    inputs = get_op("paged_attention").cases[3].make(torch.Generator().manual_seed(1), torch.float32,
                                                     torch.device("cpu"))
    assert inputs["window"] is not None
    base = paged_attention(**inputs)
    table, lens, w = inputs["block_table"], inputs["seq_lens"].tolist(), inputs["window"]
    bs = inputs["k_cache"].shape[1]
    poisoned_k = torch.full_like(inputs["k_cache"], float("nan"))
    poisoned_v = torch.full_like(inputs["v_cache"], float("nan"))
    new_table = torch.full_like(table, 10**6)
    for b, n in enumerate(lens):
        for p in range(max(0, n - 1 - w + 1), n):  # Sq = 1: the window of the one query
            blk = int(table[b, p // bs])
            new_table[b, p // bs] = blk
            poisoned_k[blk, p % bs] = inputs["k_cache"][blk, p % bs]
            poisoned_v[blk, p % bs] = inputs["v_cache"][blk, p % bs]
    out = paged_attention(**{**inputs, "k_cache": poisoned_k, "v_cache": poisoned_v,
                             "block_table": new_table})
    torch.testing.assert_close(out, base, rtol=0, atol=0)


def test_transformers_deepseek_v4_sinks_sliding_window_gqa():
    modeling = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    masking = pytest.importorskip("transformers.masking_utils")
    g = torch.Generator().manual_seed(5)
    lq, lk, hq, hkv, d, w = 5, 12, 4, 1, 16, 4
    q, k, v = torch.randn(lq, hq, d, generator=g), torch.randn(lk, hkv, d, generator=g), None
    sinks = torch.randn(hq, generator=g)
    # transformers' own mask: absolute query positions 7..11 (7 cached tokens), keys 0..11.
    allowed = masking.sliding_window_causal_mask_function(w)(
        0, 0, torch.arange(lk - lq, lk)[:, None], torch.arange(lk)[None, :])
    mask = torch.zeros(lq, lk).masked_fill(~allowed, float("-inf"))[None, None]
    module = torch.nn.Module()
    module.num_key_value_groups, module.sinks = hq // hkv, sinks
    kt = k.transpose(0, 1)[None]
    want, _ = modeling.eager_attention_forward(module, q.transpose(0, 1)[None], kt, kt, mask,
                                               scaling=d ** -0.5)
    out = attention(q, k, v, _cu([lq]), _cu([lk]), scale=d ** -0.5, window=w, sinks=sinks)
    torch.testing.assert_close(out, want[0], rtol=1e-5, atol=1e-6)


def test_transformers_gemma4_eager_sliding_and_kimi_dk_ne_dv():
    gemma = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    masking = pytest.importorskip("transformers.masking_utils")
    g = torch.Generator().manual_seed(6)
    for lq, lk, hq, hkv, dk, dv, w in ((9, 9, 4, 2, 16, 16, 3), (4, 10, 2, 2, 24, 16, None)):
        q = torch.randn(lq, hq, dk, generator=g) * 0.3
        k, v = torch.randn(lk, hkv, dk, generator=g), torch.randn(lk, hkv, dv, generator=g)
        rows, cols = torch.arange(lk - lq, lk)[:, None], torch.arange(lk)[None, :]
        fn = masking.sliding_window_causal_mask_function(w) if w else masking.causal_mask_function
        mask = torch.zeros(lq, lk).masked_fill(~fn(0, 0, rows, cols), float("-inf"))[None, None]
        module = torch.nn.Module()
        module.num_key_value_groups, module.head_dim = hq // hkv, dk
        want, _ = gemma.eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                v.transpose(0, 1)[None], mask, scaling=1.0)
        out = attention(q, k, v, _cu([lq]), _cu([lk]), scale=1.0, window=w)
        torch.testing.assert_close(out, want[0], rtol=1e-5, atol=1e-6)


def test_edges_empty_single_token_no_keys_and_dtype():
    q, k = torch.zeros(0, 4, 8), torch.zeros(0, 2, 8)
    assert attention(q, k, None, _cu([]), _cu([]), scale=1.0).shape == (0, 4, 8)
    assert attention(q, k, None, _cu([0, 0]), _cu([0, 0]), scale=1.0).shape == (0, 4, 8)
    g = torch.Generator().manual_seed(2)
    q1, k1, v1 = torch.randn(1, 2, 8, generator=g), torch.randn(1, 1, 8, generator=g), torch.randn(1, 1, 3, generator=g)
    torch.testing.assert_close(attention(q1, k1, v1, _cu([1]), _cu([1]), scale=1.0), v1.expand(1, 2, 3))
    # Non-causal sequence without keys: no visible key -> 0 (not NaN), even with sinks.
    out = attention(q1, k1[:0], v1[:0], _cu([1]), _cu([0]), scale=1.0, causal=False, sinks=torch.ones(2))
    assert torch.equal(out, torch.zeros(1, 2, 3))
    qb = torch.randn(6, 4, 8, generator=g).bfloat16()
    kb = torch.randn(6, 2, 8, generator=g).bfloat16()
    assert attention(qb, kb, kb, _cu([6]), _cu([6]), scale=0.3).dtype == torch.bfloat16
    # A very negative sink is no sink.
    torch.testing.assert_close(attention(qb.float(), kb.float(), None, _cu([6]), _cu([6]), scale=0.3,
                                         sinks=torch.full((4,), -1e4)),
                               attention(qb.float(), kb.float(), None, _cu([6]), _cu([6]), scale=0.3))


def _bad_attention(**over):
    args = dict(q=torch.zeros(5, 4, 8), k=torch.zeros(6, 2, 8), v=torch.zeros(6, 2, 4),
                cu_seqlens_q=_cu([2, 3]), cu_seqlens_k=_cu([3, 3]), scale=1.0)
    args.update(over)
    return attention(**args)


@pytest.mark.parametrize("over,match", [
    (dict(k=torch.zeros(6, 3, 8), v=torch.zeros(6, 3, 4)), "multiple of key/value heads"),
    (dict(cu_seqlens_k=_cu([6])), "cu_seqlens_q has 2 sequences"),
    (dict(cu_seqlens_q=_cu([2, 2])), "cu_seqlens_q must rise from 0 to 5"),
    (dict(cu_seqlens_q=_cu([4, 1])), "q_len 4 > k_len 3"),
    (dict(q=torch.zeros(5, 32)), "q must have rank 3"),
    (dict(v=torch.zeros(6, 2, 4, 1)), "v must have rank 3"),
    (dict(k=torch.zeros(6, 2, 7)), "head dim"),
    (dict(window=0), "window must be a positive int"),
    (dict(window=2, causal=False), "only defined for causal"),
    (dict(sinks=torch.zeros(2)), "sinks must have shape"),
    (dict(gate=torch.zeros(5, 4, 8)), "gate must have the output's shape"),
])
def test_attention_bad_input(over, match):
    with pytest.raises(ValueError, match=match):
        _bad_attention(**over)


def _bad_paged(**over):
    args = dict(q=torch.zeros(2, 1, 4, 8), k_cache=torch.zeros(4, 16, 2, 8), v_cache=None,
                block_table=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
                seq_lens=torch.tensor([20, 9], dtype=torch.int32), scale=1.0)
    args.update(over)
    return paged_attention(**args)


@pytest.mark.parametrize("over,match", [
    (dict(q=torch.zeros(2, 4, 8)), "q must have rank 4"),
    (dict(k_cache=torch.zeros(4, 16, 3, 8)), "multiple of key/value heads"),
    (dict(v_cache=torch.zeros(4, 8, 2, 8)), "differ in"),
    (dict(seq_lens=torch.tensor([20, 0], dtype=torch.int32)), "seq_lens\\[1\\] = 0"),
    (dict(seq_lens=torch.tensor([40, 9], dtype=torch.int32)), "seq_lens\\[0\\] = 40"),
    (dict(seq_lens=torch.tensor([20, 17], dtype=torch.int32)), "outside \\[0, 4\\)"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), "batch 2"),
    (dict(block_table=torch.zeros(2, 2)), "integer"),
    (dict(gate=torch.zeros(2, 1, 4, 4)), "gate must have the output's shape"),
])
def test_paged_bad_input(over, match):
    _bad_paged()  # the baseline is valid
    with pytest.raises(ValueError, match=match):
        _bad_paged(**over)
