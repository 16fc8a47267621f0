"""Thin adapters from hwinfer op contracts to torch_npu fused ops (documented torch_npu APIs).

Not run on hardware: written against torch_npu's documented signatures, never executed on an
Ascend device, so nothing here counts as validated. ``torch_npu`` is imported at module level
on purpose: this module is imported only when an impl is bound on an npu device, and a broken
torch_npu (no CANN) then turns into a refusal with its reason instead of a failure mid-model.

Each adapter keeps its contract's signature and says where it deviates; the matching ``*_supported``
per-call check refuses what the fused op cannot serve, and the call falls through to the
portable torch kernel (or the reference).
"""
from __future__ import annotations

import torch
import torch_npu

from hwinfer.ops.moe_experts import glu

_HALF = (torch.float16, torch.bfloat16)
# Documented limits of the fused attention op (torch_npu npu_fused_infer_attention_score):
# head dim a multiple of 16 up to 512; paged block sizes a multiple of 16 up to 512.
_MAX_HEAD_DIM, _ALIGN = 512, 16
# The causal mask the op expects with sparse_mode=3 (right-down causal): a fixed 2048x2048 upper
# triangle (True = masked), built once per device.
_CAUSAL_MASKS: dict[torch.device, torch.Tensor] = {}


def _causal_mask(device: torch.device) -> torch.Tensor:
    if device not in _CAUSAL_MASKS:
        _CAUSAL_MASKS[device] = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=device), 1)
    return _CAUSAL_MASKS[device]


# ---------------------------------------------------------------------------------------------
# rms_norm: npu_rms_norm(x, gamma, epsilon) -> (y, rstd)

def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
             weight_offset: float = 0.0) -> torch.Tensor:
    """Deviation: the weight multiplies in x.dtype inside the fused op (contract: fp32)."""
    d = x.shape[-1]
    gamma = torch.ones(d, dtype=x.dtype, device=x.device) if weight is None else weight.to(x.dtype)
    if weight_offset:
        gamma = gamma + weight_offset
    y, _ = torch_npu.npu_rms_norm(x, gamma, epsilon=eps)
    return y


# ---------------------------------------------------------------------------------------------
# apply_rope: npu_rotary_mul(x, r1, r2, rotary_mode) = x * r1 + rotate(x) * r2

def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, start: int = 0,
               interleaved: bool = False, inverse: bool = False) -> torch.Tensor:
    """Rotary slice through the fused op in fp32 (as the contract computes), the rest copied.

    Deviation: none in the math; the slice is upcast to fp32 first, which costs bandwidth
    (npu_apply_rotary_pos_emb would rotate q and k in place together, which our one-tensor,
    out-of-place contract does not fit).
    """
    rot = 2 * cos.shape[-1]
    xs = x.unsqueeze(-2) if x.dim() == 2 else x  # [T, H, D]
    part = xs[..., start:start + rot].float().unsqueeze(0)  # [1, T, H, R]
    c, s = cos.float(), sin.float()
    if inverse:
        s = -s
    if interleaved:
        r1, r2, mode = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1), "interleave"
    else:
        r1, r2, mode = torch.cat([c, c], -1), torch.cat([s, s], -1), "half"
    y = torch_npu.npu_rotary_mul(part, r1[None, :, None, :], r2[None, :, None, :], rotary_mode=mode)
    out = xs.clone()
    out[..., start:start + rot] = y[0].to(x.dtype)
    return out.view_as(x)


def apply_rope_supported(x: torch.Tensor, cos: torch.Tensor, **_: object) -> str | None:
    if x.dim() not in (2, 3):
        return f"x must be [T, H, D] or [T, D], got {x.dim()} dims"
    if cos.shape[-1] == 0:
        return "empty rotary slice"
    return None


# ---------------------------------------------------------------------------------------------
# attention (varlen prefill): npu_fused_infer_attention_score, layout TND

def _attention_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
                      window: int | None, sinks: torch.Tensor | None) -> str | None:
    if sinks is not None:
        return "sinks: the fused op has no per-head sink logit"
    if window is not None:
        return "window: band masks (sparse_mode 4) are not mapped yet"
    if q.dtype not in _HALF:
        return f"dtype {q.dtype}: the fused op takes fp16/bf16"
    dv = (v if v is not None else k).shape[-1]
    if dv != q.shape[-1]:
        return f"Dk={q.shape[-1]} != Dv={dv}"
    if q.shape[-1] % _ALIGN or q.shape[-1] > _MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} not a multiple of {_ALIGN} up to {_MAX_HEAD_DIM}"
    return None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, *, scale: float, causal: bool = True,
              window: int | None = None, sinks: torch.Tensor | None = None,
              gate: torch.Tensor | None = None) -> torch.Tensor:
    """Deviations: the sequence lengths go to the op as host lists (one device sync per call);
    softmax precision is the op's own (inner_precise=0, documented high precision); the gate
    multiplies after the op in fp32, so the attention output is rounded to q.dtype once before it.
    """
    v = k if v is None else v
    ends_q = cu_seqlens_q[1:].tolist()
    ends_k = cu_seqlens_k[1:].tolist()
    kwargs = dict(sparse_mode=3, atten_mask=_causal_mask(q.device)) if causal else dict(sparse_mode=0)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        q, k, v, actual_seq_lengths=ends_q, actual_seq_lengths_kv=ends_k, num_heads=q.shape[1],
        num_key_value_heads=k.shape[1], scale=scale, input_layout="TND", **kwargs)
    if gate is not None:
        out = (out.float() * torch.sigmoid(gate.float())).to(q.dtype)
    return out


def attention_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
                        cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                        causal: bool = True, window: int | None = None,
                        sinks: torch.Tensor | None = None, **_: object) -> str | None:
    reason = _attention_common(q, k, v, window, sinks)
    if reason:
        return reason
    lens_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1])
    lens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1])
    if bool((lens_q == 0).any()) or bool((lens_k == 0).any()):
        return "empty sequences in the batch"
    if causal and bool((lens_q > lens_k).any()):
        return "causal with q_len > k_len"
    return None


# ---------------------------------------------------------------------------------------------
# paged_attention (decode, speculative verification): the same fused op with a block table.
# npu_incre_flash_attention serves only Sq = 1; the fused op covers Sq >= 1 with one call.

def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
                    window: int | None = None, sinks: torch.Tensor | None = None,
                    gate: torch.Tensor | None = None) -> torch.Tensor:
    """Deviations: seq_lens go to the op as a host list (a device sync per call); the caches are
    viewed as [num_blocks, block_size, Hkv * D] (the op's paged BSH form, no copy); gate as in
    ``attention``."""
    b, sq, hq, d = q.shape
    nb, bs, hkv, _ = k_cache.shape
    v_cache = k_cache if v_cache is None else v_cache
    kwargs = (dict(sparse_mode=3, atten_mask=_causal_mask(q.device), actual_seq_lengths=[sq] * b)
              if sq > 1 else {})
    out, _ = torch_npu.npu_fused_infer_attention_score(
        q, k_cache.reshape(nb, bs, hkv * d), v_cache.reshape(nb, bs, -1),
        block_table=block_table, block_size=bs, actual_seq_lengths_kv=seq_lens.tolist(),
        num_heads=hq, num_key_value_heads=hkv, scale=scale, input_layout="BSND", **kwargs)
    if gate is not None:
        out = (out.float() * torch.sigmoid(gate.float())).to(q.dtype)
    return out


def paged_attention_supported(q: torch.Tensor, k_cache: torch.Tensor,
                              v_cache: torch.Tensor | None, block_table: torch.Tensor, *,
                              window: int | None = None, sinks: torch.Tensor | None = None,
                              **_: object) -> str | None:
    reason = _attention_common(q, k_cache, v_cache, window, sinks)
    if reason:
        return reason
    bs = k_cache.shape[1]
    if bs % _ALIGN or bs > _MAX_HEAD_DIM:
        return f"block size {bs} not a multiple of {_ALIGN} up to 512"
    if not k_cache.is_contiguous() or (v_cache is not None and not v_cache.is_contiguous()):
        return "non-contiguous cache"
    if block_table.dtype != torch.int32:
        return f"block_table dtype {block_table.dtype}, the op takes int32"
    return None


# ---------------------------------------------------------------------------------------------
# route_topk: npu_moe_gating_top_k_softmax (softmax, no bias, no groups) and
# npu_moe_gating_top_k (sigmoid/softmax + bias, grouped by top-2 sums, renormalized).

# npu_moe_gating_top_k limits as documented for Atlas A2/A3 (torch_npu 7.0): 256 experts,
# k_group 4, k <= 32; newer CANN documents wider limits, lift these after a hardware run.
GATING_EXPERTS, GATING_K_GROUP, GATING_MAX_K = 256, 4, 32


def route_topk(logits: torch.Tensor, *, top_k: int, scoring: str = "softmax",
               bias: torch.Tensor | None = None, renormalize: bool = True, scaling: float = 1.0,
               n_group: int = 1, topk_group: int = 1,
               expert_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Deviations: logits are upcast to fp32 before the op (the contract scores in fp32);
    ``expert_scale`` and, on the softmax path, renormalization and scaling are applied after
    the op in torch."""
    x = logits.float()
    if scoring == "softmax" and bias is None and n_group == 1:
        w, ids, _ = torch_npu.npu_moe_gating_top_k_softmax(x, None, k=top_k)
        w = w.float()
        if renormalize:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * scaling
    else:
        w, ids, _ = torch_npu.npu_moe_gating_top_k(
            x, top_k, bias=bias.float(), k_group=topk_group, group_count=n_group,
            group_select_mode=1, renorm=0, norm_type=0 if scoring == "softmax" else 1,
            out_flag=False, routed_scaling_factor=scaling, eps=1e-20)
        w = w.float()
    if expert_scale is not None:
        w = w * expert_scale.float()[ids.long()]
    return w, ids.to(torch.int32)


def route_topk_supported(logits: torch.Tensor, *, top_k: int, scoring: str = "softmax",
                         bias: torch.Tensor | None = None, renormalize: bool = True,
                         n_group: int = 1, topk_group: int = 1, **_: object) -> str | None:
    if logits.dim() != 2:
        return "logits must be [T, E]"
    if scoring == "softmax" and bias is None and n_group == 1:
        return None
    if scoring not in ("softmax", "sigmoid"):
        return f"scoring {scoring!r}: the fused op scores by softmax or sigmoid only"
    if bias is None:
        return "the grouped gating op needs a bias (documented as required)"
    if not renormalize:
        return "the grouped gating op always renormalizes"
    e = logits.shape[-1]
    if e != GATING_EXPERTS or n_group == 1 or topk_group != GATING_K_GROUP or top_k > GATING_MAX_K:
        return (f"E={e}, n_group={n_group}, topk_group={topk_group}, top_k={top_k}: outside the "
                f"documented limits (E={GATING_EXPERTS}, grouped, k_group={GATING_K_GROUP}, "
                f"k<={GATING_MAX_K})")
    return None


# ---------------------------------------------------------------------------------------------
# moe_experts: sort tokens by expert, two npu_grouped_matmul calls, weighted scatter-add.

GMM_MAX_GROUPS = 1024  # group_list length limit assumed from the docs; not checked on hardware


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, *, activation: str = "swiglu", limit: float | None = None,
                swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                situ_linear_beta: float | None = None) -> torch.Tensor:
    """Deviations from the contract's all-fp32 math: the grouped matmuls take x.dtype inputs
    and return x.dtype (fp32 accumulation inside the op), so the gate/up projections and the
    activation are rounded to x.dtype between the two matmuls; the activation itself and the
    weighted sum run in fp32. Weights are passed as transposed views ([E, H, 2I], [E, I, H]).
    """
    t, h = x.shape
    e = w13.shape[0]
    flat = ids.reshape(-1).long()
    slot_order = torch.argsort(torch.where(flat < 0, e, flat), stable=True)
    kept = slot_order[flat[slot_order] >= 0]
    token = kept // ids.shape[1]
    counts = torch.bincount(flat[kept], minlength=e)
    group_list = counts.cumsum(0)
    xs = x[token]
    (gate_up,) = torch_npu.npu_grouped_matmul([xs], [w13.transpose(1, 2)], group_list=group_list,
                                              split_item=2, group_type=0, group_list_type=0)
    act = glu(gate_up.float(), activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    (down,) = torch_npu.npu_grouped_matmul([act.to(x.dtype)], [w2.transpose(1, 2)],
                                           group_list=group_list, split_item=2, group_type=0,
                                           group_list_type=0)
    out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    out.index_add_(0, token, down.float() * weights.reshape(-1)[kept].float()[:, None])
    return out.to(x.dtype)


def moe_experts_supported(x: torch.Tensor, w13: torch.Tensor, *, activation: str = "swiglu",
                          limit: float | None = None, **_: object) -> str | None:
    # Clamped and wide-range activations (DeepSeek-V4 / MiniMax-M3 limits, K3 SiTU) push the
    # projections into magnitudes where rounding them to bf16 between the two matmuls leaves
    # the contract's bf16 tolerance (seen with a stand-in computing the documented semantics).
    if limit is not None or activation in ("swiglu_oai", "situ"):
        return (f"activation {activation!r} (limit {limit}): x.dtype intermediates between the "
                "grouped matmuls exceed the contract's tolerance")
    if x.dtype not in _HALF:
        return f"dtype {x.dtype}: the grouped matmul path runs fp16/bf16"
    if w13.dtype != x.dtype:
        return f"weights {w13.dtype} differ from x {x.dtype}"
    if w13.shape[0] > GMM_MAX_GROUPS:
        return f"{w13.shape[0]} experts > {GMM_MAX_GROUPS} groups"
    return None
