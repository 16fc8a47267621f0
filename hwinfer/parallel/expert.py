"""Expert parallelism: all-to-all dispatch of (token, choice) rows to the rank owning the expert.

Experts are partitioned contiguously: with E experts over W ranks, rank r owns experts
[r*E/W, (r+1)*E/W). Each rank handles a contiguous slice of the tokens (:func:`token_slice`,
ceil(T/W) rows; the last ranks may get fewer or none). For one MoE call:

1. :meth:`Dispatch.plan` sorts this rank's (token, choice) pairs by expert (hence by owning
   rank) and exchanges the per-expert counts with ONE ``all_to_all_single`` of E ints, so every
   rank learns how many rows it receives from each peer *and* which of its experts each row
   goes to (rows arrive grouped by source rank, then by expert): no ids travel with the rows.
2. :meth:`Dispatch.send` copies each token row once per choice routed to a peer and exchanges
   them (``all_to_all_single`` with split sizes).
3. The owner runs its experts on the received rows (``run_local``).
4. :meth:`Dispatch.combine` sends the results back the same way and sums them per token,
   weighted, in fp32, choice by choice in the router's order (the order of the single-device
   ``moe_experts`` reference, so fp32 results match it bit for bit).

The split sizes are host integers (one device sync per plan), so a model using this is not
CUDA-graph capturable; ``shard_model(expert_parallel=True)`` turns graph decode off.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist


def _rank_world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("expert parallelism needs an initialised torch.distributed process group "
                         "(see hwinfer.parallel.run_parallel)")
    return dist.get_rank(group), dist.get_world_size(group)


def token_slice(num_tokens: int, group=None) -> slice:
    """This rank's contiguous token rows of a replicated [T, ...] batch: ceil(T/W) rows per
    rank, so the last ranks may get fewer or none (T < W)."""
    rank, world = _rank_world(group)
    chunk = -(-num_tokens // world)
    start = min(rank * chunk, num_tokens)
    return slice(start, min(start + chunk, num_tokens))


def _exchange(x: torch.Tensor, out_rows: int, out_splits: list[int], in_splits: list[int],
              group) -> torch.Tensor:
    """all_to_all_single of the rows of x [S, D] -> [out_rows, D] (splits per rank)."""
    out = x.new_empty((out_rows, *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class Dispatch:
    """One MoE call's all-to-all plan over ``group``. Experts are partitioned contiguously:
    rank r owns experts [r*E/W, (r+1)*E/W).

    Attributes: ``local_ids`` [M] int64, the local expert (0..E/W-1) of each received row;
    ``num_tokens`` N, ``top_k`` k of the ids it was planned from."""

    def __init__(self, ids: torch.Tensor, order: torch.Tensor, send_counts: torch.Tensor,
                 recv_counts: torch.Tensor, group) -> None:
        # send_counts / recv_counts [W, E/W]: rows to / from each rank, per (its / our) local expert.
        self.group = group
        self.num_tokens, self.top_k = ids.shape
        self.order = order                      # [S]: flat (token * k + choice) index of each sent row
        self.send_splits = send_counts.sum(1).tolist()
        self.recv_splits = recv_counts.sum(1).tolist()
        local = torch.arange(recv_counts.shape[1], device=ids.device).repeat(recv_counts.shape[0])
        self.local_ids = torch.repeat_interleave(local, recv_counts.reshape(-1).to(ids.device))

    @staticmethod
    def _sort(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(order of the valid flat entries sorted by expert, per-expert counts [E])."""
        flat = ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        order = order[flat[order] >= 0]  # -1 (skipped) sorts first; drop it
        counts = torch.bincount(flat[order], minlength=num_experts)
        if counts.numel() != num_experts:  # an id >= E (checked by shape: no device sync)
            raise ValueError(f"expert ids must lie in [0, {num_experts}) or be -1 (skipped)")
        return order, counts

    @classmethod
    def plan(cls, ids: torch.Tensor, num_experts: int, group=None) -> "Dispatch":
        """Plan from ids [N, k] (the expert of each (token, choice) of THIS rank's N tokens,
        -1 = skipped); one exchange of the per-expert counts."""
        return cls.plan_many([ids], num_experts, group)[0]

    @classmethod
    def plan_many(cls, ids_list: list[torch.Tensor], num_experts: int, group=None) -> list["Dispatch"]:
        """Plans of several MoE calls (e.g. layers whose routing is known before the forward)
        with ONE count exchange."""
        _, world = _rank_world(group)
        if num_experts % world:
            raise ValueError(f"expert parallelism over {world} ranks needs the number of experts "
                             f"divisible by {world}, got {num_experts}")
        if any(ids.dim() != 2 for ids in ids_list):
            raise ValueError("ids must be [N, k] per plan")
        local = num_experts // world
        sorted_ = [cls._sort(ids, num_experts) for ids in ids_list]
        # [W (destination), L (plan), E/W]: each destination's chunk holds every plan's counts.
        send = torch.stack([c.view(world, local) for _, c in sorted_], dim=1)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv.view(-1), send.reshape(-1).contiguous(), group=group)
        send, recv = send.cpu(), recv.cpu()  # the split sizes are host values (one sync)
        return [cls(ids, order, send[:, i], recv[:, i], group)
                for i, (ids, (order, _)) in enumerate(zip(ids_list, sorted_))]

    def send(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [N, D] -> [M, D] received: each token row once per choice routed to this rank,
        grouped by source rank then by local expert (matching ``local_ids``)."""
        if rows.shape[0] != self.num_tokens:
            raise ValueError(f"send: {rows.shape[0]} rows for a plan of {self.num_tokens} tokens")
        out = rows[torch.div(self.order, self.top_k, rounding_mode="floor")]
        return _exchange(out, int(self.local_ids.numel()), self.recv_splits, self.send_splits, self.group)

    def combine(self, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """y [M, D] (one result per received row) -> [N, D]: sent back, then per token the sum
        over its choices of weights[t, j] * y (fp32, in choice order; skipped choices add 0),
        cast to y.dtype."""
        if y.shape[0] != self.local_ids.numel():
            raise ValueError(f"combine: {y.shape[0]} rows, {self.local_ids.numel()} were received")
        if tuple(weights.shape) != (self.num_tokens, self.top_k):
            raise ValueError(f"combine: weights {tuple(weights.shape)} != {(self.num_tokens, self.top_k)}")
        back = _exchange(y, int(self.order.numel()), self.send_splits, self.recv_splits, self.group)
        n, k, d = self.num_tokens, self.top_k, y.shape[1]
        full = torch.zeros(n * k, d, dtype=torch.float32, device=y.device)
        full[self.order] = back.float()
        full = full.view(n, k, d) * weights.float()[..., None]
        out = torch.zeros(n, d, dtype=torch.float32, device=y.device)
        for j in range(k):  # sequential, as the reference accumulates
            out += full[:, j]
        return out.to(y.dtype)


def _gather_rows(part: torch.Tensor, num_tokens: int, group) -> torch.Tensor:
    """all_gather of each rank's token slice [n_r, H] -> [T, H] (slices padded to ceil(T/W))."""
    _, world = _rank_world(group)
    chunk = -(-num_tokens // world)
    padded = part.new_zeros((chunk, *part.shape[1:]))
    padded[: part.shape[0]] = part
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat(parts)[:num_tokens]


def expert_parallel_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                        run_local: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], group=None,
                        plan: Dispatch | None = None, gather: bool = True) -> torch.Tensor:
    """Routed experts with expert parallelism; x [T, H] replicated on every rank (as attention
    TP leaves it), weights / ids [T, k] (fp32 weights; ids -1 = skipped) -> [T, H].

    Each rank takes its token slice (:func:`token_slice`), dispatches its (token, choice) rows,
    runs ``run_local(rows [M, D], local_ids [M]) -> [M, D]`` on its own experts, combines, then
    all_gathers the slices back to [T, H] on every rank. ``plan``: a :class:`Dispatch` made
    beforehand from ``ids[token_slice(T, group)]`` (hash routing). ``gather=False``: return
    [T, H] holding this rank's slice and zeros elsewhere, for a caller that sums over ranks
    anyway (an all_reduce it needs for a tensor-parallel shared expert)."""
    if x.dim() != 2 or weights.shape[0] != x.shape[0] or tuple(ids.shape) != tuple(weights.shape):
        raise ValueError(f"expert_parallel_moe: x [T, H], weights and ids [T, k]; got "
                         f"{tuple(x.shape)}, {tuple(weights.shape)}, {tuple(ids.shape)}")
    rows = token_slice(x.shape[0], group)
    if plan is None:
        plan = Dispatch.plan(ids[rows], num_experts, group)
    elif plan.num_tokens != rows.stop - rows.start:
        raise ValueError(f"expert_parallel_moe: the plan covers {plan.num_tokens} tokens, this "
                         f"rank's slice has {rows.stop - rows.start}")
    received = plan.send(x[rows])
    # Experts receiving nothing are not run at all (kernels need not accept empty inputs).
    y = run_local(received, plan.local_ids) if received.shape[0] else received
    part = plan.combine(y, weights[rows])
    if gather:
        return _gather_rows(part, x.shape[0], group)
    out = x.new_zeros(x.shape[0], part.shape[1])
    out[rows] = part
    return out
