"""MoE routing contracts: top-k routing (softmax / sigmoid / sqrt-softplus, noaux bias, groups,
per-expert scales) and DeepSeek-V4 hash routing. The expert FFN ops (dense, FP8, FP4) live in
:mod:`hwinfer.ops.moe_experts` and the latent MoE in :mod:`hwinfer.ops.moe_latent`, both imported
at the bottom so they are declared with this family.

Router outputs: ``weights [T, k]`` fp32 and ``ids [T, k]`` int32 (expert indices). The order of
the k entries of a row is not part of the contract (references return them by descending
selection score; transformers mostly uses ``topk(sorted=False)``): the conformance compare sorts
each row by expert id and carries the weights along.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.contract import Case, Tol, compare_tensor, define_op, randint, randn

_SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus")


def _scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    z = logits.float()
    if scoring == "softmax":
        return torch.softmax(z, dim=-1)
    if scoring == "sigmoid":
        return torch.sigmoid(z)
    if scoring == "sqrtsoftplus":
        return F.softplus(z).sqrt()  # torch's softplus: identity above 20, as in transformers
    raise ValueError(f"scoring must be one of {_SCORINGS}, not {scoring!r}")


def _finish(w: torch.Tensor, ids: torch.Tensor, renormalize: bool, scaling: float,
            expert_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if renormalize:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    w = w * scaling
    if expert_scale is not None:
        w = w * expert_scale.float()[ids.long()]
    return w, ids.to(torch.int32)


def route_topk(logits: torch.Tensor, *, top_k: int, scoring: str = "softmax",
               bias: torch.Tensor | None = None, renormalize: bool = True, scaling: float = 1.0,
               n_group: int = 1, topk_group: int = 1,
               expert_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert routing from router logits.

    In fp32: ``s = score(logits)`` (softmax over E, sigmoid, or ``sqrt(softplus(.))``);
    selection key ``c = s + bias`` (bias only *selects*: "noaux_tc"); with ``n_group > 1`` the
    E experts form n_group consecutive groups, a group's score is the sum of its two largest
    ``c``, only the ``topk_group`` best groups stay eligible; ``ids`` = the top_k largest ``c``.
    Weights are the unbiased scores of the chosen experts, ``w = s[ids]``, then
    ``w = w / (sum_k w + 1e-20)`` if ``renormalize``, then ``w *= scaling`` (applied whether or
    not renormalized, as transformers does), then ``w *= expert_scale[ids]`` if given.

    The +1e-20 only matters when the chosen scores sum below ~1e-13 (it then avoids 0/0);
    Qwen3.5, MiniMax-M3 and Gemma 4 divide without it, which is bit-identical otherwise.

    Models (config fields -> arguments):
    * DeepSeek-V4 (§2.8): ``scoring_func: sqrtsoftplus``, ``e_score_correction_bias`` -> bias,
      always renormalized (``norm_topk_prob`` ignored), ``routed_scaling_factor`` 1.5, top-6.
    * Qwen3.5-MoE (§3.5): softmax, top-8, renormalize, no bias, scaling 1. (HF then casts the
      weights to the logits dtype; here they stay fp32.)
    * Kimi-Linear / Kimi-K3 (§4.4): sigmoid + bias, ``moe_renormalize``, scaling 2.446
      (Kimi-Linear), ``num_expert_group`` / ``topk_group`` -> n_group / topk_group.
    * GLM-5 / GLM-5.3 / HY4 (§5): sigmoid + bias, ``norm_topk_prob``, ``n_group``/``topk_group``,
      scaling 2.5 / 2.827.
    * MiniMax-M3 (§5): sigmoid + bias, renormalize; transformers multiplies the *expert output*
      by ``routed_scaling_factor`` 2.0 instead — pass scaling=2.0 (same value up to rounding).
    * Gemma 4 (§5): softmax, renormalize, ``expert_scale = router.per_expert_scale``. Its logits
      are ``router.proj(RMS(x) * router.scale * H^-1/2)`` with an unweighted RMSNorm (eps
      ``rms_norm_eps``) of the layer's pre-norm residual, computed by the layer.

    Shapes: logits [T, E] any float dtype; bias [E] (fp32) or None; expert_scale [E] or None.
    Requires top_k <= E, E % n_group == 0, E / n_group >= 2 when n_group > 1,
    topk_group <= n_group and top_k <= topk_group * E / n_group.
    Returns (weights [T, top_k] fp32, ids [T, top_k] int32).
    """
    if logits.dim() != 2:
        raise ValueError(f"route_topk: logits must be [T, E], got shape {tuple(logits.shape)}")
    e = logits.shape[1]
    if not 1 <= top_k <= e:
        raise ValueError(f"route_topk: top_k={top_k} must be in [1, E={e}]")
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"route_topk: need E % n_group == 0 and 1 <= topk_group <= n_group "
                         f"(E={e}, n_group={n_group}, topk_group={topk_group})")
    if n_group > 1 and (e // n_group < 2 or top_k > topk_group * (e // n_group)):
        raise ValueError(f"route_topk: groups of {e // n_group} experts, {topk_group} kept, "
                         f"cannot supply top_k={top_k} (and a group needs >= 2 experts)")
    for name, t in (("bias", bias), ("expert_scale", expert_scale)):
        if t is not None and tuple(t.shape) != (e,):
            raise ValueError(f"route_topk: {name} shape {tuple(t.shape)} != ({e},)")
    s = _scores(logits, scoring)
    choice = s + bias.float() if bias is not None else s
    if n_group > 1:
        grouped = choice.view(-1, n_group, e // n_group)
        group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, n_group]
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(topk_group, dim=-1).indices, True)
        eligible = keep.unsqueeze(-1).expand_as(grouped).reshape(-1, e)
        choice = choice.masked_fill(~eligible, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    return _finish(s.gather(1, ids), ids, renormalize, scaling, expert_scale)


def route_hash(logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor, *,
               scoring: str = "sqrtsoftplus", renormalize: bool = True,
               scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing (DeepSeek-V4's first ``num_hash_layers`` layers, §2.8 / ENGINES.md §2.4).

    ``ids[t] = tid2eid[token_ids[t]]`` (a fixed table, row order kept); ``s = score(logits)`` in
    fp32 as in :func:`route_topk`; ``w = s[t, ids[t]]``, renormalized with +1e-20 if
    ``renormalize``, times ``scaling``. DeepSeek-V4: ``ffn.gate.tid2eid`` (int32 in the
    checkpoint, HF's ``mlp.gate.tid2eid`` buffer), sqrtsoftplus, always renormalized,
    ``routed_scaling_factor`` 1.5. The layer needs the *input token ids* (not embeddings).

    Shapes: logits [T, E]; token_ids [T] integer in [0, V); tid2eid [V, k] integer in [0, E).
    Returns (weights [T, k] fp32, ids [T, k] int32).
    """
    if logits.dim() != 2 or token_ids.dim() != 1 or tid2eid.dim() != 2:
        raise ValueError(f"route_hash: need logits [T, E], token_ids [T], tid2eid [V, k]; got "
                         f"{tuple(logits.shape)}, {tuple(token_ids.shape)}, {tuple(tid2eid.shape)}")
    if token_ids.shape[0] != logits.shape[0]:
        raise ValueError(f"route_hash: {token_ids.shape[0]} token ids for {logits.shape[0]} rows of logits")
    if token_ids.is_floating_point() or tid2eid.is_floating_point():
        raise ValueError("route_hash: token_ids and tid2eid must be integer tensors")
    if token_ids.numel() and not (0 <= int(token_ids.min()) and int(token_ids.max()) < tid2eid.shape[0]):
        raise ValueError(f"route_hash: token ids must lie in [0, {tid2eid.shape[0]})")
    if tid2eid.numel() and not (0 <= int(tid2eid.min()) and int(tid2eid.max()) < logits.shape[1]):
        raise ValueError(f"route_hash: tid2eid entries must lie in [0, E={logits.shape[1]})")
    s = _scores(logits, scoring)
    ids = tid2eid[token_ids.long()].long()
    return _finish(s.gather(1, ids), ids, renormalize, scaling, None)


def compare_routing(out, ref, inputs, tol: Tol) -> str | None:
    """Order-insensitive compare of (weights, ids): sort each row by id, carry the weights."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return "expected a (weights, ids) pair"
    (w, i), (rw, ri) = out, ref
    if not isinstance(i, torch.Tensor) or i.dtype != torch.int32 or tuple(i.shape) != tuple(ri.shape):
        return f"ids must be int32 {tuple(ri.shape)}"
    o, ro = i.long().cpu().sort(dim=-1, stable=True), ri.long().cpu().sort(dim=-1, stable=True)
    msg = compare_tensor(o.values.to(torch.int32), ro.values.to(torch.int32), tol)
    if msg:
        return f"expert ids differ: {msg}"
    msg = compare_tensor(w.cpu().gather(-1, o.indices), rw.cpu().gather(-1, ro.indices), tol)
    return f"weights: {msg}" if msg else None


def distinct_logits(gen: torch.Generator, t: int, e: int, dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """[T, E] logits with distinct values in every row, exact in bf16/fp16 (no top-k ties).

    Row = (a random permutation of 0..E-1 + a per-row integer shift - E/2) * 8/E: at most
    8 significant bits for a power-of-two E <= 256, values in [-6, 6].
    """
    perm = torch.argsort(torch.rand(t, e, generator=gen), dim=-1)
    shift = torch.randint(-(e // 4), e // 4 + 1, (t, 1), generator=gen)
    return ((perm + shift - e // 2).float() * (8.0 / e)).to(device=device, dtype=dtype)


def _topk_case(t, e, k, scoring, with_bias, renormalize, scaling, n_group=1, topk_group=1,
               with_expert_scale=False):
    def make(gen, dtype, device):
        inputs = {"logits": distinct_logits(gen, t, e, dtype, device), "top_k": k,
                  "scoring": scoring, "renormalize": renormalize, "scaling": scaling,
                  "n_group": n_group, "topk_group": topk_group}
        if with_bias:
            inputs["bias"] = randn(gen, e, dtype=torch.float32, device=device, scale=0.1)
        if with_expert_scale:
            inputs["expert_scale"] = randn(gen, e, dtype=torch.float32, device=device, scale=0.2) + 1.0
        return inputs
    return make


def _hash_case(t, e, k, vocab):
    def make(gen, dtype, device):
        table = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(vocab)])
        return {"logits": randn(gen, t, e, dtype=dtype, device=device),
                "token_ids": randint(gen, 0, vocab, t, device=device),
                "tid2eid": table.to(device=device, dtype=torch.int32),
                "scoring": "sqrtsoftplus", "renormalize": True, "scaling": 1.5}
    return make


# Routing math is fp32 whatever the logits dtype, so bf16 logits keep the fp32 tolerance.
_ROUTE_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-5, 1e-5)}

ROUTE_TOPK = define_op(
    route_topk,
    cases=[
        Case("dsv4_sqrtsoftplus_bias", _topk_case(24, 64, 6, "sqrtsoftplus", True, True, 1.5)),
        Case("qwen35_softmax_top8", _topk_case(20, 64, 8, "softmax", False, True, 1.0)),
        Case("kimi_sigmoid_bias_groups", _topk_case(16, 64, 8, "sigmoid", True, True, 2.446, 8, 4)),
        Case("glm5_sigmoid_no_renorm", _topk_case(12, 32, 4, "sigmoid", True, False, 2.5)),
        Case("gemma4_expert_scale", _topk_case(10, 32, 4, "softmax", False, True, 1.0,
                                               with_expert_scale=True)),
        Case("single_token", _topk_case(1, 16, 2, "sigmoid", True, True, 2.0)),
    ],
    tolerance=_ROUTE_TOL,
    compare=compare_routing,
)

ROUTE_HASH = define_op(
    route_hash,
    cases=[Case("dsv4_hash_top6", _hash_case(24, 64, 6, 50))],
    tolerance=_ROUTE_TOL,
    compare=compare_routing,
)

from hwinfer.ops import moe_experts, moe_latent  # noqa: E402,F401  (declare this family's expert ops)
