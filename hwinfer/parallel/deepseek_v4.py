"""Tensor and expert parallelism for DeepSeek-V4 (:mod:`hwinfer.models.deepseek_v4`).

:func:`shard_deepseek_v4` shards a loaded model in place over the ranks of a process group;
``shard_model`` dispatches here for ``DeepseekV4ForCausalLM``. Layer and model code are
unchanged: parameters are sliced, head / group counts set to local values, and the one
reduction per block goes around a Linear's ``matmul`` (attention) or the MoE module's
``forward`` (an instance attribute that shadows the class method).

Attention (sparse MLA, every layer kind), rank r of W:

* query heads: ``wq_b`` keeps the rows of its heads, ``attn_sink`` their sinks. ``wq_a`` /
  ``q_norm`` are replicated: ``qr`` is per token, not per head, and the indexer reads it whole.
* grouped output projection: ``o`` [T, heads, hd] is viewed as [T, o_groups, heads/o_groups *
  hd] with consecutive heads per group, and group j goes through rows ``j*o_lora ..`` of
  ``wo_a``. The group is the unit that is split: rank r keeps ``o_groups / W`` whole groups
  (so their heads), the matching ``wo_a`` rows, and the matching input columns of ``wo_b``.
  ``wo_b`` is row parallel, so the attention output is reduced ONCE, on the block's [T, H]
  output. ``o_groups`` must be divisible by W (Flash 8, Pro 16).
* the latent KV (one head shared by all query heads, K = V), ``wkv`` / ``kv_norm``, the
  compressor and every cache tensor are replicated: each rank computes and stores them (small:
  one 512-wide head per token, or per m tokens), so cache specs do not change.
* the lightning indexer is replicated, not split by heads. Its score ``sum_h w_h ReLU(q_h .
  k)`` is a sum over heads taken before the top-k, so splitting heads needs an all_reduce of the
  partial scores, [T, N] fp32 per CSA layer (N = the request's compressed entries): an 8k-token
  prefill chunk at 128k context is 8k x 32k x 4 B = 1 GiB per layer, far more than the compute
  it saves, and the ``lightning_indexer`` op returns the top-k only (a split would also need a
  scores-only op). Replicated, every rank computes the same picks from the same inputs: the
  block inputs are identical on every rank because every reduction gives every rank the same
  bits, so the top-k needs no broadcast either.

mHC: the ``hc_mult`` residual streams [T, N, H] stay whole and replicated on every rank, and
``mhc_pre`` / ``mhc_post`` / the hyper-head mix them locally (identical inputs give identical
streams). Only a block's [T, H] output is reduced (one all_reduce per attention and per MoE),
never the [T, N, H] streams: N times less traffic than reducing the residual.

MoE (``DeepseekMoE``; router replicated):

* ``expert_parallel=False``: every expert's intermediate dim is split, ``w13`` keeps its gate and
  up rows of the rank's channels, ``w2`` those columns; the shared expert likewise (``w1`` /
  ``w3`` rows, ``w2`` columns, no reduction of its own). The routed and shared partial sums are
  added and reduced once: one all_reduce per MoE block. ``moe_intermediate_size`` must be
  divisible by W.
* ``expert_parallel=True``: rank r owns routed experts [r*E/W, (r+1)*E/W) and
  (:mod:`hwinfer.parallel.expert`) takes a slice of the (replicated) tokens, sends each
  (token, choice) row to the expert's owner with one all-to-all, runs its own experts, and
  sends the results back with another (combine, weighted in fp32). The shared expert stays split
  by intermediate channels, so the slice results (zeros on the other rows) and the shared
  partial sums are added and reduced together: still one all_reduce per MoE block. The routing
  code is the layer's own: the layer's ``ops`` becomes a view of the model's OpTable whose
  ``moe_experts`` runs the expert-parallel path. ``n_routed_experts`` must be divisible by W.
* hash-routed layers (the first ``num_hash_layers``): their experts are ``tid2eid[token_id]``,
  known before the forward. The model's ``forward_batch_mtp`` (which ``forward_batch`` and
  ``forward`` go through) is wrapped: it reads ``batch.input_ids`` first and plans every hash
  layer's dispatch with ONE count exchange (``Dispatch.plan_many``); each hash layer then uses its
  plan instead of planning (and exchanging counts) itself.

Embedding, hyper-head, final norm, lm_head and the MTP block's ``e_proj`` / ``h_proj`` / norms
are replicated; the MTP block's attention and MoE are sharded like a main layer's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hwinfer.layers.deepseek_moe import DeepseekMoE
from hwinfer.layers.deepseek_v4_attention import DeepseekV4Attention
from hwinfer.parallel.expert import Dispatch, expert_parallel_moe, token_slice
from hwinfer.parallel.tensor import _column_parallel, _need_divisible, _new_param, _rank_world, _row_parallel


def _blocks(model) -> list[nn.Module]:
    """Every decoder layer, main then MTP."""
    return list(model.layers) + (list(model.mtp) if model.mtp is not None else [])


def _check(model, world: int, expert_parallel: bool) -> None:
    """Every refusal before anything changes."""
    if getattr(model, "tensor_parallel", None):
        raise ValueError("model is already sharded")
    for block in _blocks(model):
        attn, moe = block.attn, block.ffn
        _need_divisible("o_groups", attn.groups, world)
        _need_divisible("num_attention_heads", attn.heads, world)
        if expert_parallel:
            if moe.experts.num % world:
                raise ValueError(f"expert parallelism over {world} ranks needs n_routed_experts "
                                 f"divisible by {world}, got {moe.experts.num}")
        else:
            _need_divisible("moe_intermediate_size", moe.experts.inter, world)
        _need_divisible("the shared experts' intermediate size", moe.shared_experts.w1.weight.shape[0], world)


def shard_attention(attn: DeepseekV4Attention, rank: int, world: int, group) -> None:
    """Keep this rank's o_groups / W groups of query heads; ``wo_b`` row parallel."""
    groups, heads, d = attn.groups // world, attn.heads // world, attn.head_dim
    o_lora = attn.wo_a.weight.shape[0] // attn.groups
    _column_parallel(attn.wq_b, [(rank * heads * d, heads * d)])
    attn.attn_sink = _new_param(attn.attn_sink, attn.attn_sink.data.narrow(0, rank * heads, heads))
    _column_parallel(attn.wo_a, [(rank * groups * o_lora, groups * o_lora)])
    _row_parallel(attn.wo_b, rank * groups * o_lora, groups * o_lora, group)
    attn.groups, attn.heads = groups, heads


def _split_intermediate(moe: DeepseekMoE, rank: int, world: int) -> None:
    """Keep this rank's intermediate channels of every routed expert (``w13`` [E, 2I, H]: gate
    rows then up rows; ``w2`` [E, H, I]) and of the shared expert."""
    ex, inter = moe.experts, moe.experts.inter
    n = inter // world
    w13 = ex.w13.data
    ex.w13 = _new_param(ex.w13, torch.cat((w13.narrow(1, rank * n, n), w13.narrow(1, inter + rank * n, n)), 1))
    ex.w2 = _new_param(ex.w2, ex.w2.data.narrow(2, rank * n, n))
    ex.inter = n
    _split_shared(moe, rank, world)


def _split_shared(moe: DeepseekMoE, rank: int, world: int) -> None:
    """The shared expert by intermediate channels: ``w1`` / ``w3`` rows, ``w2`` columns (its
    partial sum is reduced with the routed output, so ``w2`` gets no reduction of its own)."""
    shared = moe.shared_experts
    s = shared.w1.weight.shape[0] // world
    _column_parallel(shared.w1, [(rank * s, s)])
    _column_parallel(shared.w3, [(rank * s, s)])
    shared.w2.weight = _new_param(shared.w2.weight, shared.w2.weight.data.narrow(1, rank * s, s))


def _reduce_output(moe: DeepseekMoE, group) -> None:
    """The block's output (routed + shared partial sums) reduced once over ``group``."""
    inner = moe.forward

    def forward(x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        y = inner(x, token_ids).contiguous()
        dist.all_reduce(y, group=group)
        return y

    moe.forward = forward


def shard_moe_tp(moe: DeepseekMoE, rank: int, world: int, group) -> None:
    """Intermediate-split experts and shared expert; one all_reduce of the block output."""
    _split_intermediate(moe, rank, world)
    _reduce_output(moe, group)


class ExpertParallelOps:
    """The model's OpTable as one MoE layer sees it under expert parallelism: every op passes
    through, except ``moe_experts``, which runs :func:`expert_parallel_moe` over the layer's local
    experts. ``plan``: a :class:`Dispatch` prepared before the forward (hash layers); used once."""

    def __init__(self, ops, num_experts: int, group) -> None:
        self._ops, self.num_experts, self.group = ops, num_experts, group
        self.plan: Dispatch | None = None

    def __getattr__(self, name: str):
        return getattr(self._ops, name)

    def moe_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                    w2: torch.Tensor, **act) -> torch.Tensor:
        """x [T, H], weights / ids [T, k] (global expert ids), w13 / w2 this rank's experts ->
        [T, H]: this rank's token slice's routed output, zeros on the other rows."""
        def run_local(rows: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
            # Unweighted (weight 1 per row): combine applies the router weights, in fp32.
            ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
            return self._ops.moe_experts(rows, ones, local_ids[:, None], w13, w2, **act)

        plan, self.plan = self.plan, None
        return expert_parallel_moe(x, weights, ids, self.num_experts, run_local, self.group, plan=plan,
                                   gather=False)


def shard_moe_ep(moe: DeepseekMoE, rank: int, world: int, group) -> None:
    """This rank's E/W routed experts (all-to-all dispatch), the shared expert split by
    intermediate channels; one all_reduce of the block output."""
    ex = moe.experts
    total, local = ex.num, ex.num // world
    ex.w13 = _new_param(ex.w13, ex.w13.data.narrow(0, rank * local, local))
    ex.w2 = _new_param(ex.w2, ex.w2.data.narrow(0, rank * local, local))
    ex.num = local
    _split_shared(moe, rank, world)
    moe.ops = ExpertParallelOps(moe.ops, total, group)
    _reduce_output(moe, group)


def plan_hash_layers(model, group) -> None:
    """Wrap ``model.forward_batch_mtp``: before the layers run, plan every hash layer's
    dispatch from the batch's token ids (this rank's token slice, ``tid2eid[token_id]``) with
    one ``Dispatch.plan_many``."""
    hashed = [layer.ffn for layer in model.layers if layer.ffn.gate.hashed]
    if not hashed:
        return
    inner, num_experts = model.forward_batch_mtp, hashed[0].ops.num_experts

    def forward_batch_mtp(batch):
        token_ids = batch.input_ids[token_slice(batch.input_ids.shape[0], group)].long()
        plans = Dispatch.plan_many([moe.gate.tid2eid[token_ids] for moe in hashed], num_experts, group)
        for moe, plan in zip(hashed, plans):
            moe.ops.plan = plan
        try:
            return inner(batch)
        finally:
            for moe in hashed:
                moe.ops.plan = None

    model.forward_batch_mtp = forward_batch_mtp


def shard_deepseek_v4(model, group=None, expert_parallel: bool = False):
    """Shard a loaded ``DeepseekV4ForCausalLM`` in place over ``group`` (default: the default
    process group); returns it. Attention by groups of query heads, mHC streams replicated, MoE
    by intermediate channels (``expert_parallel=False``) or by experts with all-to-all dispatch
    (``True``). Every rank must call it on the same checkpoint and then run the same forwards.
    Raises ValueError (o_groups, heads, intermediate size or expert count not divisible by the
    world size; already sharded) before changing anything."""
    rank, world = _rank_world(group)
    _check(model, world, expert_parallel)
    with torch.no_grad():
        for block in _blocks(model):
            shard_attention(block.attn, rank, world, group)
            if expert_parallel:
                shard_moe_ep(block.ffn, rank, world, group)
            else:
                shard_moe_tp(block.ffn, rank, world, group)
    if expert_parallel:
        plan_hash_layers(model, group)
    model.tensor_parallel = {"rank": rank, "world_size": world, "expert_parallel": expert_parallel}
    return model
