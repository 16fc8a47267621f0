"""Tensor parallelism: shard a loaded model in place across the ranks of a process group.

Megatron-style: a layer's input projections are split by output rows (column parallel: each
rank computes its own heads / intermediate channels, no communication) and its output projection
by input columns (row parallel: each rank computes a partial sum, then one all_reduce). Layer
code is unchanged: the layers keep their head counts as attributes (``heads``, ``kv_heads``,
``nk``, ``nv``, ``conv_dim``), which sharding sets to the local counts, so their forward and
their ``cache_specs`` (hence each rank's cache) use the local sizes; the all_reduce is folded
into the row-parallel Linear's ``matmul`` (the bias, if any, is added once, after the sum).

Supported so far: Qwen3.5 dense here (``Qwen3_5ForCausalLM`` without experts, MTP head
included); Qwen3.5-MoE, Kimi-Linear and Kimi-K3 in :mod:`hwinfer.parallel.models_kimi_qwen`;
DeepSeek-V4 in :mod:`hwinfer.parallel.deepseek_v4`; MoE blocks either split per expert or, with
``expert_parallel=True``, spread whole over the ranks (:mod:`hwinfer.parallel.expert`). The
dense case:

* gated full attention: q_proj ([query | gate] per head), k_proj, v_proj split by heads so that
  each rank keeps whole GQA groups (kv heads divisible by the world size); o_proj row parallel;
* Gated DeltaNet: in_proj_qkv and conv1d ([q: nk heads | k: nk heads | v: nv heads] channels)
  sliced per part by heads; in_proj_z, in_proj_b, in_proj_a, A_log, dt_bias by value heads
  (consecutive value heads share a key head, so contiguous head ranges stay consistent); the
  gated norm's weight is per head dim, replicated; out_proj row parallel;
* dense MLP: gate_proj / up_proj column parallel, down_proj row parallel.

Embedding, lm_head, norms and the MTP ``fc`` are replicated (every rank holds them whole).

Call :func:`shard_model` after loading (``load_model`` binds each Linear's ``matmul`` op; the
row-parallel wrap goes around it, so rebinding ``matmul`` afterwards would drop the reduction).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hwinfer.layers.basic import GatedMLP, Linear, MergedProjection
from hwinfer.layers.gated_deltanet import GatedDeltaNet


def _rank_world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("tensor parallelism needs an initialised torch.distributed process group "
                         "(see hwinfer.parallel.run_parallel)")
    return dist.get_rank(group), dist.get_world_size(group)


def _need_divisible(what: str, count: int, world: int) -> None:
    if count % world:
        raise ValueError(f"tensor parallelism over {world} ranks needs {what} divisible by {world}, "
                         f"got {count}")


def _new_param(old: nn.Parameter, value: torch.Tensor) -> nn.Parameter:
    # A fresh Parameter (new storage): a MergedProjection sees the changed data_ptr and re-stacks.
    return nn.Parameter(value.to(old.dtype).clone(memory_format=torch.contiguous_format), requires_grad=False)


def _rows(t: torch.Tensor, parts: list[tuple[int, int]]) -> torch.Tensor:
    """Concatenate the row ranges ``[(start, length), ...]`` of ``t`` (dim 0)."""
    return torch.cat([t.narrow(0, s, n) for s, n in parts], dim=0)


def _column_parallel(linear: Linear, parts: list[tuple[int, int]]) -> None:
    """Keep the output rows ``parts`` of ``linear`` (weight [out, in])."""
    linear.weight = _new_param(linear.weight, _rows(linear.weight.data, parts))
    if linear.bias is not None:
        linear.bias = _new_param(linear.bias, _rows(linear.bias.data, parts))


def _row_parallel(linear: Linear, start: int, length: int, group) -> None:
    """Keep the input columns [start, start + length) of ``linear``; its output is summed over
    the group, then the bias (whole on every rank) added once. Both entries of the Linear
    (``matmul`` and the fused ``gated_norm_matmul``) are wrapped."""
    linear.weight = _new_param(linear.weight, linear.weight.data.narrow(1, start, length))
    inner = linear.matmul

    def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = inner(x, weight, None).contiguous()
        dist.all_reduce(y, group=group)
        return y if bias is None else y + bias

    matmul.row_parallel = True
    linear.matmul = matmul
    inner_gated = linear.gated_norm_matmul

    def gated_norm_matmul(*args, **kwargs) -> torch.Tensor:   # the fused norm + product: the same sum
        y = inner_gated(*args, **kwargs).contiguous()
        dist.all_reduce(y, group=group)
        return y

    linear.gated_norm_matmul = gated_norm_matmul


def _restack(module: nn.Module) -> None:
    """Make every MergedProjection of ``module`` re-stack its (now sharded) weights on next use."""
    for m in module.modules():
        for value in vars(m).values():
            if isinstance(value, MergedProjection):
                value.weight = value.bias = None
                value._ptrs = []


def _shard_attention(attn, rank: int, world: int, group) -> None:
    _need_divisible("num_key_value_heads", attn.kv_heads, world)
    _need_divisible("num_attention_heads", attn.heads, world)
    d = attn.head_dim
    heads, kv = attn.heads // world, attn.kv_heads // world
    _column_parallel(attn.q_proj, [(rank * heads * 2 * d, heads * 2 * d)])  # [query | gate] per head
    _column_parallel(attn.k_proj, [(rank * kv * d, kv * d)])
    _column_parallel(attn.v_proj, [(rank * kv * d, kv * d)])
    _row_parallel(attn.o_proj, rank * heads * d, heads * d, group)
    attn.heads, attn.kv_heads = heads, kv


def _shard_gdn(gdn: GatedDeltaNet, rank: int, world: int, group) -> None:
    _need_divisible("linear_num_key_heads", gdn.nk, world)
    _need_divisible("linear_num_value_heads", gdn.nv, world)
    nk, nv, dk, dv = gdn.nk // world, gdn.nv // world, gdn.dk, gdn.dv
    q0, k0, v0 = 0, gdn.nk * dk, 2 * gdn.nk * dk
    channels = [(q0 + rank * nk * dk, nk * dk), (k0 + rank * nk * dk, nk * dk),
                (v0 + rank * nv * dv, nv * dv)]
    _column_parallel(gdn.in_proj_qkv, channels)
    gdn.conv1d.weight = _new_param(gdn.conv1d.weight, _rows(gdn.conv1d.weight.data, channels))
    _column_parallel(gdn.in_proj_z, [(rank * nv * dv, nv * dv)])
    _column_parallel(gdn.in_proj_b, [(rank * nv, nv)])
    _column_parallel(gdn.in_proj_a, [(rank * nv, nv)])
    gdn.A_log = _new_param(gdn.A_log, gdn.A_log.data.narrow(0, rank * nv, nv))
    gdn.dt_bias = _new_param(gdn.dt_bias, gdn.dt_bias.data.narrow(0, rank * nv, nv))
    _row_parallel(gdn.out_proj, rank * nv * dv, nv * dv, group)
    gdn.nk, gdn.nv = nk, nv
    gdn.conv_dim = 2 * nk * dk + nv * dv


def _shard_mlp(mlp: GatedMLP, rank: int, world: int, group) -> None:
    inter = mlp.gate_proj.weight.shape[0]
    _need_divisible("intermediate_size", inter, world)
    n = inter // world
    _column_parallel(mlp.gate_proj, [(rank * n, n)])
    _column_parallel(mlp.up_proj, [(rank * n, n)])
    _row_parallel(mlp.down_proj, rank * n, n, group)


def _check_qwen3_5(model) -> list:
    from hwinfer.models.qwen3_5 import GatedAttention, Qwen3_5ForCausalLM

    if not isinstance(model, Qwen3_5ForCausalLM):
        raise ValueError(f"tensor parallelism supports Qwen3.5 (dense and MoE), Kimi-Linear, Kimi-K3 "
                         f"and DeepSeek-V4 so far; {type(model).__name__} is not supported yet")
    layers = list(model.layers) + (list(model.mtp.layers) if model.mtp is not None else [])
    for layer in layers:
        if not isinstance(layer.mlp, GatedMLP):
            raise ValueError(f"tensor parallelism supports Qwen3.5 dense only so far; this model has "
                             f"{type(layer.mlp).__name__} blocks (MoE / expert parallelism is not "
                             f"supported yet)")
        if not isinstance(layer.mixer, (GatedAttention, GatedDeltaNet)):
            raise ValueError(f"unexpected mixer {type(layer.mixer).__name__}")
    return layers


def _shard_kimi_qwen(model, rank: int, world: int, group, expert_parallel: bool) -> bool:
    """Qwen3.5-MoE and Kimi-Linear / K3 (hwinfer.parallel.models_kimi_qwen); False for others."""
    from hwinfer.parallel import models_kimi_qwen

    if not models_kimi_qwen.supports(model):
        return False
    models_kimi_qwen.shard_kimi_qwen(model, rank, world, group, expert_parallel)
    _restack(model)
    model.tensor_parallel = {"rank": rank, "world_size": world, "expert_parallel": expert_parallel}
    return True


def shard_model(model, group=None, expert_parallel: bool = False):
    """Shard ``model`` (loaded, on this rank's device) in place for tensor parallelism over
    ``group`` (default: the default process group); returns it. Every rank must call it on
    the same checkpoint, and then run the same forwards (each forward has collectives).
    ``expert_parallel``: MoE experts partitioned across the ranks (all-to-all dispatch,
    :mod:`hwinfer.parallel.expert`) instead of each expert split by intermediate channels.

    Raises ValueError for what is not supported yet (other architectures, head, expert or
    intermediate counts not divisible by the world size), before changing anything."""
    rank, world = _rank_world(group)
    if getattr(model, "tensor_parallel", None):
        raise ValueError("model is already sharded")
    from hwinfer.models.deepseek_v4 import DeepseekV4ForCausalLM

    if isinstance(model, DeepseekV4ForCausalLM):
        from hwinfer.parallel.deepseek_v4 import shard_deepseek_v4

        return shard_deepseek_v4(model, group, expert_parallel=expert_parallel)
    if _shard_kimi_qwen(model, rank, world, group, expert_parallel):
        return model
    layers = _check_qwen3_5(model)
    # Check every divisibility first, so a refusal leaves the model untouched.
    for layer in layers:
        mixer = layer.mixer
        if isinstance(mixer, GatedDeltaNet):
            _need_divisible("linear_num_key_heads", mixer.nk, world)
            _need_divisible("linear_num_value_heads", mixer.nv, world)
        else:
            _need_divisible("num_key_value_heads", mixer.kv_heads, world)
            _need_divisible("num_attention_heads", mixer.heads, world)
        _need_divisible("intermediate_size", layer.mlp.gate_proj.weight.shape[0], world)
    with torch.no_grad():
        for layer in layers:
            mixer = layer.mixer
            if isinstance(mixer, GatedDeltaNet):
                _shard_gdn(mixer, rank, world, group)
            else:
                _shard_attention(mixer, rank, world, group)
            _shard_mlp(layer.mlp, rank, world, group)
    _restack(model)
    model.tensor_parallel = {"rank": rank, "world_size": world}
    return model
