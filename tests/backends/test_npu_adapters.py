"""The torch_npu adapters' own glue (argument translation, slicing, sorting, post-processing),
run on the CPU against a stand-in torch_npu that computes what torch_npu's documentation says
each fused op computes. This checks our side of the contract only: the stand-in is ours, so
nothing here says anything about Ascend hardware, and the npu backend stays "not run on
hardware".

Every case x dtype of each adapted op goes through the conformance harness: the adapter's
per-call check refuses what the fused op cannot serve (skip), the rest must match the reference.
"""
from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from hwinfer.backend import Impl
from hwinfer.ops import attention as attention_ops
from hwinfer.ops.contract import all_ops
from hwinfer.testing.conformance import Item, run_item


def _rotate(x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "half":
        a, b = x.chunk(2, -1)
        return torch.cat([-b, a], -1)
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)


def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    """Documented: x * r1 + rotate(x) * r2 (rotate-half, or pairwise when "interleave")."""
    return x * r1 + _rotate(x, rotary_mode) * r2


def npu_rms_norm(x, gamma, epsilon=1e-6):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return ((xf * rstd).to(x.dtype) * gamma), rstd


def npu_moe_gating_top_k_softmax(x, finished=None, k=1):
    """Documented: softmax over experts, then the top k (values and int32 indices)."""
    y, idx = torch.softmax(x, -1).topk(k, -1)
    rows = torch.arange(x.shape[0] * k, dtype=torch.int32).view(k, -1).t()
    return y, idx.int(), rows


def npu_moe_gating_top_k(x, k, *, bias=None, k_group=1, group_count=1, group_select_mode=0,
                         renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    """Documented: norm (softmax/sigmoid), + bias to select, groups ranked by the sum of their
    top-2 (mode 1) or their max (mode 0), top k among the kept groups, weights from the unbiased
    scores renormalized (+eps) and scaled."""
    norm = torch.softmax(x, -1) if norm_type == 0 else torch.sigmoid(x)
    value = norm + bias if bias is not None else norm
    if group_count > 1:
        grouped = value.unflatten(-1, (group_count, -1))
        score = grouped.topk(2, -1).values.sum(-1) if group_select_mode == 1 else grouped.amax(-1)
        keep = torch.zeros_like(score, dtype=torch.bool).scatter(-1, score.topk(k_group, -1).indices, True)
        value = value.masked_fill(~keep.repeat_interleave(x.shape[-1] // group_count, -1), float("-inf"))
    idx = value.topk(k, -1).indices
    y = norm.gather(-1, idx)
    y = y / (y.sum(-1, keepdim=True) + eps) * routed_scaling_factor
    return y, idx.int(), norm if out_flag else None


def npu_grouped_matmul(x, weight, *, group_list=None, split_item=0, group_type=None,
                       group_list_type=0, **_):
    """Documented (split_item 2/3, group_type 0, cumulative group_list): rows of x[0] in
    consecutive groups, group g times weight[0][g] ([K, N]); one output tensor."""
    ends = group_list.tolist()
    starts = [0] + ends[:-1]
    out = [x[0][s:e].float() @ weight[0][g].float() for g, (s, e) in enumerate(zip(starts, ends))]
    return [torch.cat(out).to(x[0].dtype)]


def npu_fused_infer_attention_score(query, key, value, *, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, block_table=None, block_size=0,
                                    num_heads=1, num_key_value_heads=0, scale=1.0,
                                    input_layout="BSH", sparse_mode=0, atten_mask=None, **_):
    """Documented layouts: TND with cumulative lengths (varlen); BSND queries over a paged
    cache [blocks, block_size, Hkv * D] with per-batch kv lengths. sparse_mode 3 is the
    bottom-right causal mask. Computed here through the reference math."""
    causal = sparse_mode == 3
    if input_layout == "TND":
        cu_q = torch.tensor([0] + list(actual_seq_lengths), dtype=torch.int32)
        cu_k = torch.tensor([0] + list(actual_seq_lengths_kv), dtype=torch.int32)
        return attention_ops.attention(query, key, value, cu_q, cu_k, scale=scale, causal=causal), None
    assert input_layout == "BSND" and block_table is not None
    b, sq, hq, d = query.shape
    outs = []
    for i in range(b):
        n = actual_seq_lengths_kv[i]
        blocks = block_table[i, : -(-n // block_size)].long()
        k = key[blocks].reshape(-1, num_key_value_heads, d)[:n]
        v = value[blocks].reshape(-1, num_key_value_heads, value.shape[-1] // num_key_value_heads)[:n]
        cu_q = torch.tensor([0, sq], dtype=torch.int32)
        cu_k = torch.tensor([0, n], dtype=torch.int32)
        assert causal or sq == 1
        outs.append(attention_ops.attention(query[i], k, v, cu_q, cu_k, scale=scale, causal=True))
    return torch.stack(outs), None


@pytest.fixture
def npu_ops(monkeypatch):
    fake = types.ModuleType("torch_npu")
    for fn in (npu_rotary_mul, npu_rms_norm, npu_moe_gating_top_k_softmax, npu_moe_gating_top_k,
               npu_grouped_matmul, npu_fused_infer_attention_score):
        setattr(fake, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.delitem(sys.modules, "hwinfer_npu.ops", raising=False)
    yield importlib.import_module("hwinfer_npu.ops")
    sys.modules.pop("hwinfer_npu.ops", None)


ADAPTED = ["apply_rope", "attention", "paged_attention", "route_topk", "moe_experts", "rms_norm"]


def _items(op_name: str):
    op = all_ops()[op_name]
    check = None if op_name == "rms_norm" else f"hwinfer_npu.ops:{op_name}_supported"
    impl = Impl(op_name, "torch_npu", f"hwinfer_npu.ops:{op_name}", check=check, backend="npu")
    return [Item(op, impl, case, dtype) for case in op.cases for dtype in op.dtypes]


@pytest.mark.parametrize("op_name", ADAPTED)
def test_adapter_glue_matches_reference_under_documented_semantics(op_name, npu_ops):
    outcomes = {item.id: run_item(item, torch.device("cpu"), base_seed=7) for item in _items(op_name)}
    failed = {k: o.message for k, o in outcomes.items() if o.status == "fail"}
    if op_name == "rms_norm":
        # the fused op multiplies the weight in x.dtype (the documented deviation): fp32 only
        failed = {k: m for k, m in failed.items() if k.endswith("float32")}
    assert not failed, failed
    ran = [k for k, o in outcomes.items() if o.status == "pass"]
    assert ran, f"{op_name}: the per-call check refused every case"


def test_checks_refuse_what_the_fused_ops_cannot_serve(npu_ops):
    q = torch.randn(4, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    assert "sinks" in npu_ops.attention_supported(q, q, q, cu, cu, sinks=torch.zeros(2))
    assert "window" in npu_ops.attention_supported(q, q, q, cu, cu, window=8)
    assert "fp16/bf16" in npu_ops.attention_supported(q.float(), q.float(), q.float(), cu, cu)
    logits = torch.randn(3, 256)
    assert "sqrtsoftplus" in npu_ops.route_topk_supported(logits, top_k=6, scoring="sqrtsoftplus",
                                                           bias=torch.zeros(256))
    assert "renormalizes" in npu_ops.route_topk_supported(logits, top_k=8, scoring="sigmoid",
                                                          bias=torch.zeros(256), renormalize=False,
                                                          n_group=8, topk_group=4)
    assert npu_ops.route_topk_supported(logits, top_k=8, scoring="sigmoid", bias=torch.zeros(256),
                                        n_group=8, topk_group=4) is None
    assert "fp16/bf16" in npu_ops.moe_experts_supported(torch.randn(2, 8), torch.randn(4, 16, 8))
