"""MoE family: routers and experts against transformers' modules, hand-computed cases, the
quantized / latent forms against their dense definitions, edge cases and bad inputs."""
from __future__ import annotations

import math

import pytest
import torch

from hwinfer.ops.moe import compare_routing, distinct_logits, route_hash, route_topk
from hwinfer.ops.moe_experts import (
    expert_weights, moe_experts, moe_experts_fp4, moe_experts_fp8, routing_inputs,
)
from hwinfer.ops.moe_latent import latent_moe
from hwinfer.ops.contract import Tol
from hwinfer.ops.norm import rms_norm
from hwinfer.ops.quant import dequant_fp4, dequant_fp8_block
from hwinfer.ops.quant_pack import quantize_fp4, quantize_fp8_block

CPU = torch.device("cpu")
TIGHT = Tol(1e-5, 1e-5)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _same_routing(ours, hf_weights, hf_ids):
    assert compare_routing(ours, (hf_weights.float(), hf_ids.to(torch.int32)), {}, TIGHT) is None


# ------------------------------------------------------------------------------ routers vs HF


def _hf(module: str):
    return pytest.importorskip(f"transformers.models.{module}.modeling_{module}")


def test_deepseek_v4_topk_and_hash_routers():
    m = _hf("deepseek_v4")
    from transformers import DeepseekV4Config
    cfg = DeepseekV4Config(hidden_size=64, num_local_experts=32, num_experts_per_tok=6,
                           moe_intermediate_size=32, vocab_size=50, num_hidden_layers=2)
    g = _gen(1)
    x = torch.randn(20, 64, generator=g)
    router = m.DeepseekV4TopKRouter(cfg)
    router.weight.data = torch.randn(32, 64, generator=g) * 0.3
    router.e_score_correction_bias.data = torch.randn(32, generator=g) * 0.1
    logits, w, ids = router(x)
    ours = route_topk(logits, top_k=6, scoring="sqrtsoftplus", bias=router.e_score_correction_bias,
                      renormalize=True, scaling=1.5)
    _same_routing(ours, w, ids)

    hashed = m.DeepseekV4HashRouter(cfg)
    hashed.weight.data = router.weight.data.clone()
    hashed.tid2eid.data = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(50)])
    tokens = torch.randint(0, 50, (20,), generator=g)
    logits, w, ids = hashed(x, tokens)
    ours = route_hash(logits, tokens, hashed.tid2eid.to(torch.int32), scoring="sqrtsoftplus",
                      renormalize=True, scaling=1.5)
    assert torch.equal(ours[1], hashed.tid2eid[tokens].to(torch.int32))  # table order kept
    assert torch.allclose(ours[0], w, rtol=1e-6, atol=0)


def test_qwen35_softmax_router():
    m = _hf("qwen3_5_moe")
    from transformers import Qwen3_5MoeTextConfig
    cfg = Qwen3_5MoeTextConfig(hidden_size=64, num_experts=32, num_experts_per_tok=8,
                               moe_intermediate_size=16)
    router = m.Qwen3_5MoeTopKRouter(cfg)
    router.weight.data = torch.randn(32, 64, generator=_gen(2)) * 0.3
    logits, w, ids = router(torch.randn(16, 64, generator=_gen(3)))
    _same_routing(route_topk(logits, top_k=8, scoring="softmax"), w, ids)


@pytest.mark.parametrize("module,cls", [("kimi_linear", "KimiLinearTopkRouter"),
                                        ("glm_moe_dsa", "GlmMoeDsaTopkRouter"),
                                        ("hy_v4", "HYV4TopkRouter")])
@pytest.mark.parametrize("groups", [(1, 1), (4, 2)])
def test_sigmoid_noaux_group_routers(module, cls, groups):
    m = _hf(module)
    cfg_cls = {"kimi_linear": "KimiLinearConfig", "glm_moe_dsa": "GlmMoeDsaConfig",
               "hy_v4": "HYV4Config"}[module]
    import transformers
    cfg = getattr(transformers, cfg_cls)(hidden_size=64)
    cfg.num_local_experts, cfg.num_experts_per_tok = 32, 6
    cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor = *groups, True, 2.446
    router = getattr(m, cls)(cfg)
    g = _gen(4)
    router.weight.data = torch.randn(32, 64, generator=g) * 0.3
    router.e_score_correction_bias.data = torch.randn(32, generator=g) * 0.1
    logits, w, ids = router(torch.randn(24, 64, generator=g))
    ours = route_topk(logits, top_k=6, scoring="sigmoid", bias=router.e_score_correction_bias,
                      renormalize=True, scaling=2.446, n_group=groups[0], topk_group=groups[1])
    _same_routing(ours, w, ids)


def test_minimax_m3_router():
    m = _hf("minimax_m3_vl")
    from transformers import MiniMaxM3VLTextConfig
    cfg = MiniMaxM3VLTextConfig(hidden_size=64, num_local_experts=16, num_experts_per_tok=4,
                                intermediate_size=32)
    router = m.MiniMaxM3VLTopKRouter(cfg)
    g = _gen(5)
    router.weight.data = torch.randn(16, 64, generator=g) * 0.3
    router.e_score_correction_bias.data = torch.randn(16, generator=g) * 0.1
    logits, w, ids = router(torch.randn(12, 64, generator=g))
    # transformers applies routed_scaling_factor to the expert output, not the weights.
    ours = route_topk(logits, top_k=4, scoring="sigmoid", bias=router.e_score_correction_bias)
    _same_routing(ours, w, ids)


def test_gemma4_router_with_per_expert_scale():
    m = _hf("gemma4")
    from transformers import Gemma4TextConfig
    cfg = Gemma4TextConfig(hidden_size=64, num_experts=16, top_k_experts=4, moe_intermediate_size=32,
                           enable_moe_block=True)
    router = m.Gemma4TextRouter(cfg)
    g = _gen(6)
    router.proj.weight.data = torch.randn(16, 64, generator=g) * 0.3
    router.scale.data = torch.rand(64, generator=g) + 0.5
    router.per_expert_scale.data = torch.rand(16, generator=g) + 0.5
    x = torch.randn(10, 64, generator=g) * 3
    _, w, ids = router(x)
    # The layer's part: unweighted RMSNorm, * scale * H^-1/2, projection.
    logits = (rms_norm(x, eps=cfg.rms_norm_eps) * router.scale * 64 ** -0.5) @ router.proj.weight.T
    ours = route_topk(logits, top_k=4, scoring="softmax", expert_scale=router.per_expert_scale)
    _same_routing(ours, w, ids)


# ------------------------------------------------------------------------- routers, by hand


def test_route_topk_by_hand():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, ids = route_topk(logits, top_k=2, scoring="softmax")
    e = [math.exp(v) for v in (0.0, 2.0, 1.0, -1.0)]
    assert ids.tolist() == [[1, 2]] and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.allclose(w, torch.tensor([[e[1] / (e[1] + e[2]), e[2] / (e[1] + e[2])]]))
    # Bias changes the selection only; unrenormalized weights are raw scores times scaling.
    bias = torch.tensor([0.0, 0.0, 0.0, 2.0])
    w, ids = route_topk(logits, top_k=2, scoring="sigmoid", bias=bias, renormalize=False, scaling=2.0)
    sig = [1 / (1 + math.exp(-v)) for v in (-1.0, 2.0)]  # by descending selection key
    assert ids.tolist() == [[3, 1]] and torch.allclose(w, 2.0 * torch.tensor([sig]))
    w, _ = route_topk(torch.tensor([[3.0, -30.0]]), top_k=1, scoring="sqrtsoftplus", renormalize=False)
    assert math.isclose(w.item(), math.sqrt(math.log1p(math.exp(3.0))), rel_tol=1e-6)


def test_group_limited_selection_by_hand():
    # Groups of 2: {0,1} {2,3} {4,5} {6,7}. Expert 0 is the single best, but its group's top-2
    # sum loses to groups {2,3} and {4,5}; with topk_group=2 experts come only from those.
    logits = torch.tensor([[5.0, -5.0, 2.0, 1.9, 1.8, 1.7, -3.0, -3.0]])
    _, ids = route_topk(logits, top_k=3, scoring="sigmoid", n_group=4, topk_group=2)
    assert sorted(ids[0].tolist()) == [2, 3, 4]
    _, ids = route_topk(logits, top_k=3, scoring="sigmoid")
    assert sorted(ids[0].tolist()) == [0, 2, 3]


def test_route_hash_uses_table_rows():
    table = torch.tensor([[3, 1], [0, 2], [2, 3]], dtype=torch.int32)
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, -1.0]])
    w, ids = route_hash(logits, torch.tensor([2, 0]), table, scoring="sigmoid", scaling=3.0)
    assert ids.tolist() == [[2, 3], [3, 1]]
    s = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    want = [[s(2) / (s(2) + s(3)), s(3) / (s(2) + s(3))], [s(-1) / (s(-1) + s(1)), s(1) / (s(-1) + s(1))]]
    assert torch.allclose(w, 3.0 * torch.tensor(want))


def test_distinct_logits_exact_in_bf16():
    x = distinct_logits(_gen(7), 32, 256, torch.float32, CPU)
    assert torch.equal(x, x.bfloat16().float())
    assert all(len(set(row.tolist())) == 256 for row in x)


def test_routing_edge_cases_and_errors():
    w, ids = route_topk(torch.zeros(0, 8), top_k=2)
    assert w.shape == (0, 2) and ids.dtype == torch.int32
    with pytest.raises(ValueError, match="scoring"):
        route_topk(torch.zeros(2, 8), top_k=2, scoring="relu")
    with pytest.raises(ValueError, match="top_k"):
        route_topk(torch.zeros(2, 8), top_k=9)
    with pytest.raises(ValueError, match="n_group"):
        route_topk(torch.zeros(2, 8), top_k=2, n_group=3)
    with pytest.raises(ValueError, match="cannot supply"):
        route_topk(torch.zeros(2, 8), top_k=5, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="bias shape"):
        route_topk(torch.zeros(2, 8), top_k=2, bias=torch.zeros(7))
    with pytest.raises(ValueError, match="token ids"):
        route_hash(torch.zeros(2, 4), torch.tensor([0, 3]), torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="tid2eid entries"):
        route_hash(torch.zeros(1, 4), torch.tensor([0]), torch.full((3, 2), 4, dtype=torch.int32))


# ------------------------------------------------------------------------------ experts vs HF


def _hf_experts(module: str, cls: str, cfg):
    m = _hf(module)
    cfg._experts_implementation = "eager"
    return getattr(m, cls)(cfg)


def _experts_case(ex, t=12, k=4, seed=8, gate_scale=1.0, up_scale=1.0):
    g = _gen(seed)
    e, two_i, h = ex.gate_up_proj.shape
    w13, w2 = expert_weights(g, e, two_i // 2, h, gate_scale, up_scale)
    ex.gate_up_proj.data, ex.down_proj.data = w13, w2
    weights, ids = routing_inputs(g, t, e, k, CPU)
    return torch.randn(t, h, generator=g), weights, ids, w13, w2


@pytest.mark.parametrize("name", ["deepseek_v4", "qwen3_5_moe", "minimax_m3_vl", "gemma4"])
def test_experts_match_transformers(name):
    import transformers
    if name == "deepseek_v4":
        cfg = transformers.DeepseekV4Config(hidden_size=64, num_local_experts=8, moe_intermediate_size=32)
        ex, act = _hf_experts(name, "DeepseekV4Experts", cfg), {"activation": "swiglu", "limit": 10.0}
    elif name == "qwen3_5_moe":
        cfg = transformers.Qwen3_5MoeTextConfig(hidden_size=64, num_experts=8, moe_intermediate_size=32)
        ex, act = _hf_experts(name, "Qwen3_5MoeExperts", cfg), {"activation": "swiglu"}
    elif name == "minimax_m3_vl":
        cfg = transformers.MiniMaxM3VLTextConfig(hidden_size=64, num_local_experts=8, intermediate_size=32)
        ex = _hf_experts(name, "MiniMaxM3VLExperts", cfg)
        act = {"activation": "swiglu_oai", "limit": 7.0, "swiglu_alpha": 1.702}
    else:
        cfg = transformers.Gemma4TextConfig(hidden_size=64, num_experts=8, top_k_experts=2,
                                            moe_intermediate_size=32, enable_moe_block=True)
        ex, act = _hf_experts(name, "Gemma4TextExperts", cfg), {"activation": "gelu_tanh"}
    # Large gate/up values so the clamps (10 for DeepSeek-V4, 7 for MiniMax-M3) are exercised.
    x, weights, ids, w13, w2 = _experts_case(ex, gate_scale=6.0, up_scale=6.0)
    gu = torch.einsum("th,eih->tei", x, w13)
    assert (gu > 10).any() and (gu < -10).any()
    with torch.no_grad():
        theirs = ex(x, ids.long(), weights)
    ours = moe_experts(x, weights, ids, w13, w2, **act)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-4)


def test_situ_glu_by_hand():
    # One expert, identity-like projections: out = situ(gate) * 25 tanh(up / 25) mapped by w2.
    g, u = [-3.0, 0.5, 9.0], [40.0, -2.0, 1.0]
    x = torch.tensor([g + u])  # H = 6: gate reads x[:3], up reads x[3:]
    w13 = torch.eye(6)[None]  # [1, 2I=6, H=6]
    w2 = torch.zeros(1, 6, 3)
    w2[0, :3] = torch.eye(3)
    out = moe_experts(x, torch.tensor([[0.5]]), torch.tensor([[0]]), w13, w2, activation="situ",
                      situ_beta=4.0, situ_linear_beta=25.0)
    want = [0.5 * 4 * math.tanh(a / 4) / (1 + math.exp(-a)) * 25 * math.tanh(b / 25) for a, b in zip(g, u)]
    assert torch.allclose(out[0, :3], torch.tensor(want), rtol=1e-6) and not out[0, 3:].any()
    # Without linear beta the up half passes through; with limit 2 both halves clamp first.
    out = moe_experts(x, torch.tensor([[1.0]]), torch.tensor([[0]]), w13, w2, activation="situ",
                      situ_beta=4.0, limit=2.0)
    gc, uc = [min(a, 2.0) for a in g], [max(-2.0, min(b, 2.0)) for b in u]
    want = [4 * math.tanh(a / 4) / (1 + math.exp(-a)) * b for a, b in zip(gc, uc)]
    assert torch.allclose(out[0, :3], torch.tensor(want), rtol=1e-6)


# ------------------------------------------------------------- quantized and latent forms


def test_fp8_and_fp4_experts_equal_dense_on_dequantized_weights():
    g = _gen(9)
    e, i, h = 4, 96, 160  # I and H not multiples of 128: partial tiles, gate/up grids separate
    w13, w2 = expert_weights(g, e, i, h, 3.0, 3.0)
    weights, ids = routing_inputs(g, 7, e, 2, CPU, pad=True)
    x = torch.randn(7, h, generator=g).bfloat16()
    (qg, sg), (qu, su) = quantize_fp8_block(w13[:, :i]), quantize_fp8_block(w13[:, i:])
    q2, s2 = quantize_fp8_block(w2)
    dense13 = torch.cat([dequant_fp8_block(qg, sg), dequant_fp8_block(qu, su)], dim=1)
    got = moe_experts_fp8(x, weights, ids, torch.cat([qg, qu], 1), torch.cat([sg, su], 1), q2, s2, limit=10.0)
    assert torch.equal(got, moe_experts(x, weights, ids, dense13, dequant_fp8_block(q2, s2), limit=10.0))
    w13, w2 = expert_weights(g, e, 64, 128, 3.0, 3.0)
    (p13, t13), (p2, t2) = quantize_fp4(w13), quantize_fp4(w2)
    act = {"activation": "situ", "situ_beta": 4.0}
    got = moe_experts_fp4(x[:, :128], weights, ids, p13.view(torch.int8), t13, p2, t2, **act)
    want = moe_experts(x[:, :128], weights, ids, dequant_fp4(p13, t13), dequant_fp4(p2, t2), **act)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fp4", [False, True])
def test_latent_moe_is_the_composition(fp4):
    g = _gen(10)
    h, lat, e, i = 96, 64, 8, 32
    x = torch.randn(9, h, generator=g)
    weights, ids = routing_inputs(g, 9, e, 3, CPU, pad=True)
    down, up = torch.randn(lat, h, generator=g) / h ** 0.5, torch.randn(h, lat, generator=g) / lat ** 0.5
    norm_w = torch.rand(lat, generator=g) + 0.5
    w13, w2 = expert_weights(g, e, i, lat, 3.0, 20.0)
    act = {"activation": "situ", "situ_beta": 4.0, "situ_linear_beta": 25.0}
    extra = {}
    if fp4:
        (p13, s13), (p2, s2) = quantize_fp4(w13), quantize_fp4(w2)
        w13, w2 = dequant_fp4(p13, s13), dequant_fp4(p2, s2)
        extra = {"w13": p13, "w2": p2, "w13_scale": s13, "w2_scale": s2}
    routed = moe_experts(x @ down.T, weights, ids, w13, w2, **act)
    want = rms_norm(routed, norm_w, eps=1e-5) @ up.T
    args = {"w13": w13, "w2": w2, **extra}
    got = latent_moe(x, weights, ids, down, up_proj=up, norm_weight=norm_w, eps=1e-5, **args, **act)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[-1], torch.zeros(h))  # a token with every slot -1 contributes nothing


def test_experts_edge_cases_and_errors():
    w13, w2 = expert_weights(_gen(11), 4, 16, 32, 1.0, 1.0)
    x = torch.randn(3, 32)
    out = moe_experts(x[:0], torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int32), w13, w2)
    assert out.shape == (0, 32)
    out = moe_experts(x, torch.ones(3, 2), torch.full((3, 2), -1, dtype=torch.int32), w13, w2)
    assert torch.equal(out, torch.zeros(3, 32))
    ids = torch.tensor([[0, 4], [1, 2], [3, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="expert ids"):
        moe_experts(x, torch.ones(3, 2), ids, w13, w2)
    with pytest.raises(ValueError, match="activation"):
        moe_experts(x, torch.ones(3, 2), ids.clamp(max=3), w13, w2, activation="relu")
    with pytest.raises(ValueError, match="do not fit"):
        moe_experts(x[:, :30], torch.ones(3, 2), ids.clamp(max=3), w13, w2)
    with pytest.raises(ValueError, match="weights and ids"):
        moe_experts(x, torch.ones(3, 3), ids.clamp(max=3), w13, w2)
    with pytest.raises(ValueError, match="scales"):
        q, s = quantize_fp8_block(w13)
        moe_experts_fp8(x, torch.ones(3, 2), ids.clamp(max=3), q, s, *quantize_fp8_block(w2))
    with pytest.raises(ValueError, match="both"):
        latent_moe(x, torch.ones(3, 2), ids.clamp(max=3), torch.zeros(32, 32), w13, w2,
                   torch.zeros(32, 32), w13_scale=torch.zeros(1))
