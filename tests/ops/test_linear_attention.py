"""Linear attention references (hwinfer.ops.linear_attention): the chunked and token-loop forms
against each other, state carrying, hand-worked numbers, fla's and transformers' own torch
paths as oracles, gates, and input checking."""
from __future__ import annotations

import inspect
import math
import types
import warnings

import pytest
import torch

from hwinfer.ops.linear_attention import gdn_gate, gdn_recurrent, kda_gate, kda_recurrent
from hwinfer.ops.linear_attention_chunked import gdn_chunked, kda_chunked

RECURRENT = {"gdn": gdn_recurrent, "kda": kda_recurrent}
CHUNKED = {"gdn": gdn_chunked, "kda": kda_chunked}


def _inputs(kind: str, B: int, T: int, hk: int, hv: int, d: int, *, seed: int = 0,
            state: bool = False, n: int | None = None, dtype=torch.float32) -> dict:
    gen = torch.Generator().manual_seed(seed)
    gshape = (B, T, hv, d) if kind == "kda" else (B, T, hv)
    out = {
        "q": torch.randn(B, T, hk, d, generator=gen).to(dtype),
        "k": torch.randn(B, T, hk, d, generator=gen).to(dtype),
        "v": torch.randn(B, T, hv, d, generator=gen).to(dtype),
        "g": -torch.rand(*gshape, generator=gen) * 2 - 0.01,
        "beta": torch.rand(B, T, hv, generator=gen) * 0.9 + 0.05,
    }
    if state:
        out["initial_state"] = torch.randn(n or B, hv, d, d, generator=gen) * 0.5
    return out


def _heads(kind: str) -> tuple[int, int]:
    return (2, 4) if kind == "gdn" else (2, 2)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


# ---------------------------------------------------------------------------------------------
# Chunked form == token loop (fp32, exact algebra).


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("state", [False, True])
def test_chunked_equals_recurrent(kind, chunk_size, state):
    hk, hv = _heads(kind)
    inp = _inputs(kind, 2, 100, hk, hv, 32, state=state)  # 100 = partial last chunk for both sizes
    o_r, s_r = RECURRENT[kind](**inp)
    o_c, s_c = CHUNKED[kind](**inp, chunk_size=chunk_size)
    _close(o_c, o_r)
    _close(s_c, s_r)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_chunked_survives_strong_decay(kind):
    # Unbounded softplus gates give g of -100 and below: cumulative in-chunk decays of e^-5000.
    hk, hv = _heads(kind)
    inp = _inputs(kind, 1, 40, hk, hv, 16, state=True, seed=2)
    inp["g"] = inp["g"] * 150.0
    o_r, s_r = RECURRENT[kind](**inp)
    o_c, s_c = CHUNKED[kind](**inp, chunk_size=16)
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    _close(o_c, o_r)
    _close(s_c, s_r)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_varlen_equals_separate_calls_and_chunked(kind):
    hk, hv = _heads(kind)
    lengths = [1, 37, 0, 22]  # a length-1 and an empty sequence
    inp = _inputs(kind, 1, sum(lengths), hk, hv, 16, state=True, n=len(lengths), seed=3)
    cu = torch.tensor([0, 1, 38, 38, 60], dtype=torch.int32)
    o, s = RECURRENT[kind](**inp, cu_seqlens=cu)
    o_c, s_c = CHUNKED[kind](**inp, cu_seqlens=cu, chunk_size=16)
    _close(o_c, o)
    _close(s_c, s)
    for i in range(len(lengths)):
        seg = slice(int(cu[i]), int(cu[i + 1]))
        part = {key: (x[:, seg] if key != "initial_state" else x[i:i + 1])
                for key, x in inp.items()}
        o_i, s_i = RECURRENT[kind](**part)
        _close(o[:, seg], o_i, 1e-6)
        _close(s[i:i + 1], s_i, 1e-6)
    _close(s[2], inp["initial_state"][2], 0.0)  # the empty sequence keeps its state


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_prefill_then_decode_equals_full(kind):
    hk, hv = _heads(kind)
    inp = _inputs(kind, 2, 40, hk, hv, 32, state=True, seed=5)
    o_full, s_full = RECURRENT[kind](**inp)
    head = {key: (x[:, :-3] if key != "initial_state" else x) for key, x in inp.items()}
    o_pre, s = CHUNKED[kind](**head)
    outs = [o_pre]
    for t in range(37, 40):
        step = {key: x[:, t:t + 1] for key, x in inp.items() if key != "initial_state"}
        o_t, s = RECURRENT[kind](**step, initial_state=s)
        outs.append(o_t)
    _close(torch.cat(outs, dim=1), o_full)
    _close(s, s_full)


def test_empty_sequence_returns_initial_state():
    inp = _inputs("gdn", 2, 0, 2, 4, 8, state=True)
    for fn in (gdn_recurrent, gdn_chunked):
        o, s = fn(**inp)
        assert o.shape == (2, 0, 4, 8)
        _close(s, inp["initial_state"], 0.0)


def test_bf16_inputs_give_bf16_output_fp32_state():
    inp = _inputs("kda", 1, 20, 2, 2, 16, state=True, dtype=torch.bfloat16)
    o, s = kda_chunked(**inp)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    o32, s32 = kda_recurrent(**dict(inp, q=inp["q"].float(), k=inp["k"].float(),
                                    v=inp["v"].float()))
    _close(o.float(), o32, 1e-2)  # same fp32 math; only the output rounding differs
    _close(s, s32)


# ---------------------------------------------------------------------------------------------
# Hand-worked numbers (no L2 norm, scale 1).


def _t(values, *shape):
    return torch.tensor(values, dtype=torch.float32).reshape(*shape)


@pytest.mark.parametrize("fn", [gdn_recurrent, gdn_chunked])
def test_gdn_hand_computed(fn):
    # Dk = Dv = 1, decay 0.5 per step, beta = (0.5, 0.8), S0 = 0:
    # t=1: S = 0;      delta = 0.5 (2 - 0 * 1)   = 1;   S = 0 + 1 * 1     = 1;   o = 1 * 1 = 1
    # t=2: S = 0.5;    delta = 0.8 (4 - 0.5*0.5) = 3;   S = 0.5 + 0.5 * 3 = 2;   o = 2 * 2 = 4
    # With S0 = 2: t=1: S = 1, delta = 0.5 (2 - 1) = 0.5, S = 1.5, o = 1.5;
    #              t=2: S = 0.75, delta = 0.8 (4 - 0.375) = 2.9, S = 0.75 + 1.45 = 2.2, o = 4.4.
    args = dict(q=_t([1, 2], 1, 2, 1, 1), k=_t([1, 0.5], 1, 2, 1, 1), v=_t([2, 4], 1, 2, 1, 1),
                g=_t([math.log(0.5)] * 2, 1, 2, 1), beta=_t([0.5, 0.8], 1, 2, 1),
                scale=1.0, use_qk_l2norm=False)
    o, s = fn(**args)
    _close(o.flatten(), _t([1, 4], 2))
    _close(s.flatten(), _t([2], 1))
    o, s = fn(**args, initial_state=_t([2], 1, 1, 1, 1))
    _close(o.flatten(), _t([1.5, 4.4], 2))
    _close(s.flatten(), _t([2.2], 1))


@pytest.mark.parametrize("fn,extra", [(kda_recurrent, {}), (kda_chunked, {"chunk_size": 1}),
                                      (kda_chunked, {"chunk_size": 2})])
def test_kda_hand_computed(fn, extra):
    # Dk = 2, Dv = 1, S = [a; b] (one row per key channel), per-channel decays:
    # t=1: decay (0.5, 1): S = [0; 0]; k = (1, 0), v = 2, beta = 1: delta = 2; S = [2; 0];
    #      q = (1, 1): o = 2.
    # t=2: decay (0.5, 0.25): S = [1; 0]; k = (1, 1): S^T k = 1; beta = 0.5, v = 3:
    #      delta = 0.5 (3 - 1) = 1; S = [1 + 1; 0 + 1] = [2; 1]; q = (1, 2): o = 2 + 2 = 4.
    o, s = fn(q=_t([1, 1, 1, 2], 1, 2, 1, 2), k=_t([1, 0, 1, 1], 1, 2, 1, 2),
              v=_t([2, 3], 1, 2, 1, 1),
              g=_t([0.5, 1, 0.5, 0.25], 1, 2, 1, 2).log(), beta=_t([1, 0.5], 1, 2, 1),
              scale=1.0, use_qk_l2norm=False, **extra)
    _close(o.flatten(), _t([2, 4], 2))
    _close(s.flatten(), _t([2, 1], 2))


def test_gva_head_mapping_is_repeat_interleave():
    # Hk = 2, Hv = 4: value heads 0, 1 read key head 0 and heads 2, 3 key head 1.
    inp = _inputs("gdn", 1, 12, 2, 4, 8, seed=7)
    o, s = gdn_recurrent(**inp)
    expanded = dict(inp, q=inp["q"][:, :, [0, 0, 1, 1]], k=inp["k"][:, :, [0, 0, 1, 1]])
    o_x, s_x = gdn_recurrent(**expanded)
    _close(o, o_x, 0.0)
    _close(s, s_x, 0.0)


def test_l2norm_eps_inside_sqrt():
    # A zero key stays zero; a tiny one is divided by sqrt(|k|^2 + 1e-6), not clamped to |k|.
    inp = _inputs("gdn", 1, 1, 1, 1, 4)
    inp["k"] = torch.full((1, 1, 1, 4), 1e-4)
    inp["q"] = torch.ones(1, 1, 1, 4)
    inp["v"] = torch.ones(1, 1, 1, 4)
    _, s = gdn_recurrent(**inp)
    k_n = 1e-4 / math.sqrt(4 * 1e-8 + 1e-6)
    beta = float(inp["beta"].flatten()[0])
    _close(s[0, 0], torch.full((4, 4), k_n * beta * 1.0))  # S = k (beta v)^T from S0 = 0


# ---------------------------------------------------------------------------------------------
# Oracles: fla-core's naive functions and transformers' torch paths.


def _quiet_import(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


def _l2n(x):
    return x.float() * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + 1e-6)


def _matches(kind: str, inp: dict, *expected) -> None:
    """Both references of ``kind`` give every (o, state) pair in ``expected`` to 1e-5."""
    for fn in (RECURRENT[kind], CHUNKED[kind]):
        o, s = fn(**inp)
        for o_x, s_x in expected:
            _close(o, o_x)
            _close(s, s_x)


def test_gdn_against_fla_naive():
    naive = _quiet_import("fla.ops.gated_delta_rule.naive")
    inp = _inputs("gdn", 2, 45, 3, 3, 16, state=True, seed=11)  # fla's naive GDN has Hk == Hv
    q, k = _l2n(inp["q"]), _l2n(inp["k"])  # fla's naive functions do not normalise
    h0 = dict(initial_state=inp["initial_state"], output_final_state=True)
    # Argument order: naive recurrent takes (q, k, v, beta, g), naive chunk (q, k, v, g, beta).
    _matches("gdn", inp,
             naive.naive_recurrent_gated_delta_rule(q, k, inp["v"], inp["beta"], inp["g"], **h0),
             naive.naive_chunk_gated_delta_rule(q, k, inp["v"], inp["g"], inp["beta"],
                                                chunk_size=16, **h0))


def test_kda_against_fla_naive():
    naive = _quiet_import("fla.ops.kda.naive")
    inp = _inputs("kda", 2, 48, 2, 2, 16, state=True, seed=12)  # naive chunk needs T % 16 == 0
    args = (_l2n(inp["q"]), _l2n(inp["k"]), inp["v"], inp["g"], inp["beta"])
    h0 = dict(initial_state=inp["initial_state"], output_final_state=True)
    _matches("kda", inp, naive.naive_recurrent_kda(*args, **h0),
             naive.naive_chunk_kda(*args, chunk_size=16, **h0))


@pytest.mark.parametrize("kind,module,chunk_fn,rec_fn", [
    ("gdn", "qwen3_5", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
    ("kda", "kimi_linear", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
])
def test_against_transformers(kind, module, chunk_fn, rec_fn):
    m = _quiet_import(f"transformers.models.{module}.modeling_{module}")
    # unwrap: with fla installed the decorated names dispatch to fla's Triton kernels.
    chunk, rec = inspect.unwrap(getattr(m, chunk_fn)), inspect.unwrap(getattr(m, rec_fn))
    hk, hv = _heads(kind)  # GDN: GVA with 2 key heads, 4 value heads
    inp = _inputs(kind, 2, 70, hk, hv, 32, state=True, seed=13)
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"])
    kw = dict(initial_state=inp["initial_state"], output_final_state=True,
              use_qk_l2norm_in_kernel=True)
    _matches(kind, inp, chunk(*args, chunk_size=64, **kw), rec(*args, **kw))


# ---------------------------------------------------------------------------------------------
# Gates.


def test_gdn_gate_hand_computed_and_threshold():
    a = torch.tensor([[0.0, 30.0], [-3.0, 1.0]])
    g = gdn_gate(a, A_log=torch.tensor([math.log(2.0), 0.0]), dt_bias=torch.tensor([0.0, 0.5]))
    expect = torch.tensor([[-2 * math.log(2.0), -30.5], [-2 * math.log1p(math.exp(-3.0)),
                                                         -math.log1p(math.exp(1.5))]])
    assert g.dtype == torch.float32
    _close(g, expect, 1e-6)


def test_kda_gate_hand_computed():
    f = torch.zeros(1, 1, 2, 2)
    f[..., 1, 1] = 25.0  # above softplus's threshold: softplus(x) = x
    A_log = torch.tensor([0.0, math.log(3.0)])
    dt_bias = torch.tensor([0.0, 1.0, -1.0, 0.0])
    g = kda_gate(f, A_log, dt_bias)
    sp = [math.log(2.0), math.log1p(math.e), math.log1p(math.exp(-1.0)), 25.0]
    _close(g.flatten(), torch.tensor([-sp[0], -sp[1], -3 * sp[2], -3 * sp[3]]), 1e-6)
    g_lb = kda_gate(f, A_log, dt_bias, lower_bound=-5.0)
    sig = [0.5, 1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(3.0)), 1 / (1 + math.exp(-75.0))]
    _close(g_lb.flatten(), -5 * torch.tensor(sig), 1e-6)
    _close(kda_gate(f, A_log.reshape(1, 1, 2, 1), dt_bias), g, 0.0)  # Kimi's [1, 1, H, 1] A_log


def test_gates_against_fla_naive():
    gdn = _quiet_import("fla.ops.gated_delta_rule.gate")
    kda = _quiet_import("fla.ops.kda.gate")
    gen = torch.Generator().manual_seed(21)
    a, A, dt = (torch.randn(*shape, generator=gen) for shape in ((2, 5, 6), (6,), (6,)))
    _close(gdn_gate(8 * a, A, dt), gdn.naive_gdn_gate(8 * a, A, dt), 1e-6)
    f, A, dt = (torch.randn(*shape, generator=gen) for shape in ((2, 5, 3, 8), (3,), (24,)))
    _close(kda_gate(8 * f, A, dt), kda.naive_kda_gate(8 * f, A, dt), 1e-6)
    _close(kda_gate(8 * f, A, dt, lower_bound=-5.0),
           kda.naive_kda_lowerbound_gate(8 * f, A, dt, lower_bound=-5.0), 1e-6)


@pytest.mark.parametrize("module,lower_bound", [("kimi_linear", None), ("glm5_next", -5.0)])
def test_kda_gate_against_transformers_forget_gate(module, lower_bound):
    m = _quiet_import(f"transformers.models.{module}.modeling_{module}")
    cls = m.KimiLinearForgetGate if module == "kimi_linear" else m.Glm5NextTextForgetGate
    cfg = types.SimpleNamespace(linear_head_dim=8, linear_num_heads=3, hidden_size=16,
                                linear_lower_bound=lower_bound)
    gate = cls(cfg)
    gen = torch.Generator().manual_seed(22)
    with torch.no_grad():
        for p in gate.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 2)
        x = torch.randn(2, 5, 16, generator=gen) * 4
        expect = gate(x)
        f = gate.f_b_proj(gate.f_a_proj(x)).view(2, 5, 3, 8)
    # transformers evaluates softplus as log(1 + e^x) (not log1p): ~6e-8 absolute error, times
    # exp(A_log) (here up to ~50), so the absolute tolerance is 1e-5.
    got = kda_gate(f, gate.A_log, gate.dt_bias, lower_bound=lower_bound)
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Bad inputs.


@pytest.mark.parametrize("change,match", [
    (lambda i: i.update(q=i["q"][0]), "must be \\[B, T, H, D\\]"),
    (lambda i: i.update(k=i["k"][:, :, :1]), "same shape"),
    (lambda i: i.update(v=torch.zeros(1, 6, 3, 8)), "multiple of q/k heads"),
    (lambda i: i.update(g=torch.zeros(1, 6, 4, 8)), "g must be"),
    (lambda i: i.update(beta=torch.zeros(1, 6)), "beta must be"),
    (lambda i: i.update(initial_state=torch.zeros(1, 4, 8, 4)), "initial_state must be"),
    (lambda i: i.update(cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32)), "end at T=6"),
    (lambda i: i.update(cu_seqlens=torch.tensor([0.0, 6.0])), "integer"),
    (lambda i: i.update(q=torch.zeros(2, 6, 2, 8), k=torch.zeros(2, 6, 2, 8),
                        v=torch.zeros(2, 6, 4, 8), g=torch.zeros(2, 6, 4), beta=torch.zeros(2, 6, 4),
                        cu_seqlens=torch.tensor([0, 6], dtype=torch.int32)),
     "batch dimension must be 1"),
])
def test_bad_inputs_raise(change, match):
    inp = _inputs("gdn", 1, 6, 2, 4, 8)
    change(inp)
    for fn in (gdn_recurrent, gdn_chunked):
        with pytest.raises(ValueError, match=match):
            fn(**inp)


def test_bad_options_raise():
    inp = _inputs("kda", 1, 6, 2, 2, 8)
    with pytest.raises(ValueError, match="chunk_size"):
        kda_chunked(**inp, chunk_size=0)
    with pytest.raises(ValueError, match="g must be"):
        kda_recurrent(**dict(inp, g=inp["g"][..., 0]))
    with pytest.raises(ValueError, match="A_log"):
        kda_gate(torch.zeros(2, 3, 4), torch.zeros(2), torch.zeros(12))
    with pytest.raises(ValueError, match="dt_bias"):
        kda_gate(torch.zeros(2, 3, 4), torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="lower_bound"):
        kda_gate(torch.zeros(2, 3, 4), torch.zeros(3), torch.zeros(12), lower_bound=5.0)
    with pytest.raises(ValueError, match="A_log and dt_bias"):
        gdn_gate(torch.zeros(2, 3), torch.zeros(4), torch.zeros(3))
