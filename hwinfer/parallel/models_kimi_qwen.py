"""Tensor and expert parallelism for Qwen3.5-MoE and Kimi-Linear (Kimi-K3 too: same classes).

:func:`shard_kimi_qwen` shards a loaded model in place; ``shard_model`` dispatches here for a
``Qwen3_5ForCausalLM`` with MoE blocks and for ``KimiLinearForCausalLM`` (and its subclass
``KimiK3ForCausalLM``). Rank r of W keeps a contiguous range of heads of every mixer:

* Qwen3.5 gated attention and Gated DeltaNet: as for the dense model (tensor.py's helpers).
* KDA: q/k/v projections, their short-conv channels, f_b / g_b (or K3's full-rank g_proj),
  b_proj, A_log and dt_bias by heads; the low-rank f_a / g_a and the per-head-dim output norm
  are replicated; o_proj row parallel. The per-request conv / state cache holds local heads.
* MLA: q_proj (or K3's q_b_proj), kv_b_proj and K3's output gate g_proj by heads; o_proj row
  parallel. The latent path (kv_a_proj_with_mqa, q_a, their norms) is per token, not per head:
  replicated, and so is the one-row-per-token latent cache.
* dense MLPs (Kimi's first layer(s)): gate / up column parallel, down row parallel.

MoE blocks (router replicated: identical inputs give identical routing on every rank). The
shared expert is split by intermediate channels without a reduction of its own; the routed
part is a per-rank partial sum too, so each block ends with ONE all_reduce of routed + shared:

* ``expert_parallel=False``: every expert's intermediate dim is split (w13 keeps the rank's gate
  rows and up rows, w2 those columns).
* ``expert_parallel=True``: rank r owns experts [r*E/W, (r+1)*E/W); the routed rows go through
  :func:`hwinfer.parallel.expert.expert_parallel_moe` (all-to-all dispatch / combine of this
  rank's token slice), whose result (zeros outside the slice) joins the shared partial sum in
  the block's all_reduce. Host split sizes: graph decode is turned off.
* K3's latent MoE dispatches in the latent width: the token slice is down-projected first, the
  latent rows travel, and the combined latent sum is normed and up-projected on the owner of
  the tokens. With ``expert_parallel=False`` the partial latent sums [T, L] (which must be summed
  before the norm) ride in the same all_reduce as the shared partial sums.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hwinfer.layers.basic import GatedMLP, Linear
from hwinfer.layers.gated_deltanet import GatedDeltaNet
from hwinfer.layers.kda import KimiDeltaAttention
from hwinfer.layers.kimi_mla import KimiMLA
from hwinfer.layers.kimi_moe import KimiMLP, KimiMoE
from hwinfer.layers.moe import SoftmaxMoE
from hwinfer.parallel.expert import Dispatch, expert_parallel_moe, token_slice
from hwinfer.parallel.tensor import (_column_parallel, _need_divisible, _new_param, _row_parallel,
                                     _shard_attention, _shard_gdn)


class _Par:
    """Where a MoE block sits: this rank, the world size, the group, expert parallel or not."""

    def __init__(self, rank: int, world: int, group, ep: bool, num_experts: int) -> None:
        self.rank, self.world, self.group, self.ep, self.num_experts = rank, world, group, ep, num_experts


def _sum_ranks(t: torch.Tensor, group) -> torch.Tensor:
    t = t.contiguous()
    dist.all_reduce(t, group=group)
    return t


def _run_experts(block: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 act: dict) -> torch.Tensor:
    """The block's experts op on this rank's expert weights (dense or packed FP4)."""
    ex = block.experts
    if getattr(block, "packed", False):
        return block.ops.moe_experts_fp4(x, weights, ids, ex.w13, ex.w13_scale, ex.w2, ex.w2_scale, **act)
    return block.ops.moe_experts(x, weights, ids, ex.w13, ex.w2, **act)


def _one_choice(block: nn.Module, act: dict):
    """run_local for the dispatched rows: each row through its one local expert, weight 1."""
    def run(rows: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
        return _run_experts(block, rows, ones, local_ids[:, None], act)
    return run


def _routed_partial(block: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                    act: dict) -> torch.Tensor:
    """This rank's share of the routed sum, [T, H]: a partial sum over intermediate channels,
    or (expert parallel) its token slice's full result with zeros on the other rows."""
    par: _Par = block.parallel
    if not par.ep:
        return _run_experts(block, x, weights, ids, act)
    return expert_parallel_moe(x, weights, ids, par.num_experts, _one_choice(block, act), par.group,
                               gather=False)


class ParallelSoftmaxMoE(SoftmaxMoE):
    """Qwen3.5-MoE block over ranks (the class a sharded block is switched to)."""

    parallel: _Par

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.ops.route_topk(self.gate(x).float(), top_k=self.top_k, scoring="softmax",
                                           renormalize=True)
        routed = _routed_partial(self, x, weights, ids, dict(activation="swiglu"))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)  # partial sum
        return _sum_ranks(routed + shared, self.parallel.group)


class ParallelKimiMoE(KimiMoE):
    """Kimi-Linear / K3 MoE block over ranks (the class a sharded block is switched to)."""

    parallel: _Par

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(x.float(), self.gate.weight.float())
        weights, ids = self.ops.route_topk(
            logits, top_k=self.top_k, scoring="sigmoid", bias=self.gate.e_score_correction_bias,
            renormalize=self.renormalize, scaling=self.scaling, n_group=self.n_group,
            topk_group=self.topk_group)
        shared = self.shared_experts(x) if self.shared_experts is not None else None  # partial sum
        if self.latent:
            return self._latent(x, weights, ids, shared)
        routed = _routed_partial(self, x, weights, ids, self.act)
        return _sum_ranks(routed if shared is None else routed + shared, self.parallel.group)

    def _finish_latent(self, y: torch.Tensor) -> torch.Tensor:
        """Summed latent rows [n, L] -> RMSNorm (if any) -> up-projection [n, H], fp32 (the
        latent_moe op's tail)."""
        y = y.float()
        if self.routed_expert_norm is not None:
            y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.routed_expert_norm.weight.float()
        return y @ self.routed_expert_up_proj.weight.float().T

    def _latent(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                shared: torch.Tensor | None) -> torch.Tensor:
        par: _Par = self.parallel
        down = self.routed_expert_down_proj.weight.float()
        if not par.ep:
            # The norm needs the full latent sum: reduce the latent partials (with the shared ones).
            y = _run_experts(self, x.float() @ down.T, weights, ids, self.act)
            parts = [y.float()] + ([shared.float()] if shared is not None else [])
            total = _sum_ranks(torch.cat(parts, dim=-1), par.group)
            out = self._finish_latent(total[:, : y.shape[1]]).to(x.dtype)
            return out if shared is None else out + total[:, y.shape[1]:].to(x.dtype)
        rows = token_slice(x.shape[0], par.group)
        # Down-project before the dispatch: the rows travel in the latent width (model dtype).
        z = (x[rows].float() @ down.T).to(x.dtype)
        plan = Dispatch.plan(ids[rows], par.num_experts, par.group)
        received = plan.send(z)
        y = _one_choice(self, self.act)(received, plan.local_ids) if received.shape[0] else received
        out = x.new_zeros(x.shape)
        out[rows] = self._finish_latent(plan.combine(y, weights[rows])).to(x.dtype)
        return _sum_ranks(out if shared is None else out + shared, par.group)


# --- checks (everything is checked before anything changes) -----------------------------------

def _moe_blocks(model) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (SoftmaxMoE, KimiMoE))]


def _check_moe(block: nn.Module, world: int, ep: bool) -> None:
    ex = block.experts
    if ep:
        _need_divisible("the number of experts", ex.num, world)
    else:
        _need_divisible("moe_intermediate_size", ex.inter, world)
        if getattr(block, "packed", False) and (ex.inter // world) % 32:
            raise ValueError(f"tensor parallelism over {world} ranks splits packed FP4 experts by "
                             f"intermediate channels in whole 32-wide scale groups: moe_intermediate_size "
                             f"{ex.inter} / {world} is not a multiple of 32 (use expert_parallel=True)")
    shared = block.shared_expert if isinstance(block, SoftmaxMoE) else block.shared_experts
    if shared is not None:
        _need_divisible("the shared expert's intermediate size", shared.gate_proj.weight.shape[0], world)


def _check_mixer(mixer: nn.Module, world: int) -> None:
    if isinstance(mixer, GatedDeltaNet):
        _need_divisible("linear_num_key_heads", mixer.nk, world)
        _need_divisible("linear_num_value_heads", mixer.nv, world)
    elif isinstance(mixer, KimiDeltaAttention):
        _need_divisible("the KDA heads (linear_attn_config num_heads)", mixer.heads, world)
    elif isinstance(mixer, KimiMLA):
        _need_divisible("num_attention_heads", mixer.heads, world)
    else:
        _need_divisible("num_key_value_heads", mixer.kv_heads, world)
        _need_divisible("num_attention_heads", mixer.heads, world)


# --- sharding ---------------------------------------------------------------------------------

def _heads(linear: Linear, rank: int, per_head: int, local: int) -> None:
    """Column parallel by heads: keep rows of heads [rank*local, (rank+1)*local)."""
    _column_parallel(linear, [(rank * local * per_head, local * per_head)])


def _shard_kda(kda: KimiDeltaAttention, rank: int, world: int, group) -> None:
    h, d, p = kda.heads // world, kda.head_dim, kda.proj_dim
    for lin in (kda.q_proj, kda.k_proj, kda.v_proj, kda.f_b_proj, kda.g_proj if kda.full_rank_gate else kda.g_b_proj):
        _heads(lin, rank, d, h)
    _heads(kda.b_proj, rank, 1, h)
    conv = [(j * p + rank * h * d, h * d) for j in range(3)]  # q | k | v channels
    kda.conv1d.weight = _new_param(kda.conv1d.weight, torch.cat([kda.conv1d.weight.data.narrow(0, s, n)
                                                                 for s, n in conv]))
    kda.dt_bias = _new_param(kda.dt_bias, kda.dt_bias.data.narrow(0, rank * h * d, h * d))
    # Only the first `heads` entries of A_log are read (K3 stores max(heads, head_dim)).
    a_log = kda.A_log.data.reshape(-1)[: kda.heads].narrow(0, rank * h, h)
    kda.A_log = _new_param(kda.A_log, a_log.view(1, 1, h, 1) if kda.A_log.dim() == 4 else a_log)
    _row_parallel(kda.o_proj, rank * h * d, h * d, group)
    kda.heads, kda.proj_dim = h, h * d


def _shard_mla(mla: KimiMLA, rank: int, world: int, group) -> None:
    h = mla.heads // world
    _heads(mla.q_b_proj if mla.q_lora else mla.q_proj, rank, mla.nope + mla.rope, h)
    _heads(mla.kv_b_proj, rank, mla.nope + mla.v_dim, h)
    if mla.g_proj is not None:
        _heads(mla.g_proj, rank, mla.v_dim, h)
    _row_parallel(mla.o_proj, rank * h * mla.v_dim, h * mla.v_dim, group)
    mla.heads = h


def _split_mlp(mlp: GatedMLP | KimiMLP, rank: int, world: int, group, reduce: bool) -> None:
    """gate / up column parallel; down row parallel, reduced by its matmul when ``reduce``, else
    left a partial sum (a MoE block reduces it with the routed part)."""
    n = mlp.gate_proj.weight.shape[0] // world
    _column_parallel(mlp.gate_proj, [(rank * n, n)])
    _column_parallel(mlp.up_proj, [(rank * n, n)])
    if reduce:
        _row_parallel(mlp.down_proj, rank * n, n, group)
    else:
        mlp.down_proj.weight = _new_param(mlp.down_proj.weight, mlp.down_proj.weight.data.narrow(1, rank * n, n))


def _shard_experts(block: nn.Module, par: _Par) -> None:
    ex, packed = block.experts, getattr(block, "packed", False)
    names = ("w13", "w2") + (("w13_scale", "w2_scale") if packed else ())
    if par.ep:
        n = ex.num // par.world
        for name in names:
            setattr(ex, name, _new_param(getattr(ex, name), getattr(ex, name).data.narrow(0, par.rank * n, n)))
        ex.num = n
        return
    i, n = ex.inter, ex.inter // par.world
    rows = [(par.rank * n, n), (i + par.rank * n, n)]  # the rank's gate rows, then its up rows
    ex.w13 = _new_param(ex.w13, torch.cat([ex.w13.data.narrow(1, s, c) for s, c in rows], dim=1))
    if packed:  # rows are whole in w13_scale; w2 holds 2 columns a byte, w2_scale one per 32
        ex.w13_scale = _new_param(ex.w13_scale, torch.cat([ex.w13_scale.data.narrow(1, s, c) for s, c in rows], 1))
        ex.w2 = _new_param(ex.w2, ex.w2.data.narrow(2, par.rank * n // 2, n // 2))
        ex.w2_scale = _new_param(ex.w2_scale, ex.w2_scale.data.narrow(2, par.rank * n // 32, n // 32))
    else:
        ex.w2 = _new_param(ex.w2, ex.w2.data.narrow(2, par.rank * n, n))
    ex.inter = n


def _shard_moe(block: nn.Module, par: _Par) -> None:
    _shard_experts(block, par)
    shared = block.shared_expert if isinstance(block, SoftmaxMoE) else block.shared_experts
    if shared is not None:
        _split_mlp(shared, par.rank, par.world, par.group, reduce=False)
    block.parallel = par
    block.__class__ = ParallelSoftmaxMoE if isinstance(block, SoftmaxMoE) else ParallelKimiMoE


def supports(model) -> bool:
    """Whether :func:`shard_kimi_qwen` handles ``model``: Kimi-Linear / K3, or Qwen3.5 with MoE."""
    from hwinfer.models.kimi_linear import KimiLinearForCausalLM
    from hwinfer.models.qwen3_5 import Qwen3_5ForCausalLM

    if isinstance(model, KimiLinearForCausalLM):
        return True
    return isinstance(model, Qwen3_5ForCausalLM) and any(isinstance(m, SoftmaxMoE) for m in model.modules())


def shard_kimi_qwen(model, rank: int, world: int, group, expert_parallel: bool) -> None:
    """Shard a Qwen3.5-MoE or Kimi-Linear / K3 model in place (see the module docstring).
    Raises ValueError (head, expert or intermediate counts not divisible by ``world``) before
    changing anything."""
    from hwinfer.models.kimi_linear import KimiLinearForCausalLM

    kimi = isinstance(model, KimiLinearForCausalLM)
    layers = list(model.layers) + (list(model.mtp.layers) if getattr(model, "mtp", None) is not None else [])
    mixers = [layer.self_attn if kimi else layer.mixer for layer in layers]
    for mixer in mixers:
        _check_mixer(mixer, world)
    for layer in layers:
        if isinstance(layer.mlp, (SoftmaxMoE, KimiMoE)):
            _check_moe(layer.mlp, world, expert_parallel)
        else:
            _need_divisible("intermediate_size", layer.mlp.gate_proj.weight.shape[0], world)
    with torch.no_grad():
        for mixer in mixers:
            if isinstance(mixer, GatedDeltaNet):
                _shard_gdn(mixer, rank, world, group)
            elif isinstance(mixer, KimiDeltaAttention):
                _shard_kda(mixer, rank, world, group)
            elif isinstance(mixer, KimiMLA):
                _shard_mla(mixer, rank, world, group)
            else:
                _shard_attention(mixer, rank, world, group)
        for layer in layers:
            if isinstance(layer.mlp, (SoftmaxMoE, KimiMoE)):
                _shard_moe(layer.mlp, _Par(rank, world, group, expert_parallel, layer.mlp.experts.num))
            else:
                _split_mlp(layer.mlp, rank, world, group, reduce=True)
    if expert_parallel:
        model.graph_decode = False  # the all-to-all split sizes are host values
