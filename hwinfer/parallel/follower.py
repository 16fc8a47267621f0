"""Ranks 1..N-1 of a tensor-parallel model: they load and shard the same checkpoint as rank 0,
then execute rank 0's model calls on their own shard until rank 0 says stop.

The driver (:mod:`hwinfer.parallel.driver`, rank 0) runs the engine, the scheduler, the sampler
and the server; a follower only mirrors the model calls that contain collectives. Each call
arrives as one :class:`Command`, broadcast over a gloo group of its own (``commands``: CPU
pickles, no timeout while rank 0 is idle), separate from the model's communicator (nccl, xccl,
hccl or gloo, with the collective timeout):

* ``call``: a model method (``forward_batch``, ``forward_batch_mtp``, ``mtp_forward``) with its
  arguments. A :class:`~hwinfer.runtime.batch.ForwardBatch` travels as :class:`BatchMsg`: its
  tensors on the CPU (ids, positions, lengths, slots, block table: small), its cache as a
  handle. Each rank allocates its own cache (local head counts) the first time rank 0 uses a
  cache (``alloc``), and frees it once rank 0 has dropped it (``free``). ``reset`` lists the
  slots whose request starts at position 0 in this call: their ring / per-request state is
  zeroed first, as rank 0's pool did when it handed the slot out. Other tensors (the MTP
  head's input) travel by value; every rank holds the same replicated values.
* ``replay``: speculative decoding's rollback of a recurrent layer's state (the rank-0 layer
  named ``method``), over the captured rows of the last forward that captured
  (:mod:`hwinfer.runtime.capture`), for ``slots`` with ``cu_seqlens``.
* ``stop``: leave the loop.

Sampling happens on rank 0 only: every rank computes the same step from the same inputs, so the
tokens need no further agreement. A follower that raises reports its error to the rendezvous
store (rank 0 names it) and exits at once, so rank 0's pending collective fails instead of
waiting. Spawned followers run ``python -m hwinfer.parallel.follower`` (a fresh interpreter,
so the user's script is never re-imported) and exit when their parent process disappears.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hwinfer.cache.model_cache import ModelCache
from hwinfer.runtime.batch import ForwardBatch
from hwinfer.runtime.capture import StateCapture

ENV = "HWINFER_PARALLEL"  # "host,port,rank,world,parent pid" of a spawned follower
SPEC_KEY, JOINED_KEY, READY_KEY, ERROR_KEY = "spec", "joined/{}", "ready/{}", "error/{}"
COMMAND_TIMEOUT = timedelta(days=365)  # a server may sit idle for a long time between requests


@dataclass(frozen=True)
class Spec:
    """What every rank loads: the checkpoint and ``load_model``'s arguments, the parallel sizes,
    and where the ranks' devices start (rank r on ``device_type:first_index + r``)."""

    path: str
    device_type: str
    first_index: int
    dtype: Any
    impl: dict
    strict: bool
    tensor_parallel: int
    expert_parallel: int
    collective_timeout: float

    def device(self, local_rank: int) -> str:
        return "cpu" if self.device_type == "cpu" else f"{self.device_type}:{self.first_index + local_rank}"


@dataclass
class CacheRef:
    handle: int


@dataclass
class BatchMsg:
    """A ForwardBatch on the wire: its fields with tensors on the CPU, the cache as a CacheRef,
    ``capture`` as its rows (or None); ``scratch`` is per forward and starts empty."""

    values: dict


@dataclass
class Command:
    op: str                                           # call | replay | stop
    method: str = ""                                  # model method, or the replayed layer's name
    args: tuple = ()
    alloc: list = field(default_factory=list)         # (handle, specs, num_slots, num_blocks, block_size)
    free: list = field(default_factory=list)          # handles rank 0 no longer holds
    reset: list = field(default_factory=list)         # (handle, "reset" | "copy", slots) before the call


def encode_batch(batch: ForwardBatch, handle: int | None) -> BatchMsg:
    """``batch`` for the wire; ``handle``: rank 0's handle of its cache (None: no cache)."""
    values = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        if f.name == "scratch":
            continue
        if f.name == "cache":
            v = None if v is None else CacheRef(handle)
        elif f.name == "capture":
            v = None if v is None else v.rows.detach().cpu()
        elif isinstance(v, torch.Tensor):
            v = v.detach().cpu()
        values[f.name] = v
    return BatchMsg(values)


class Mirror:
    """A follower's side of the calls: its model, its caches (by rank 0's handles) and what the
    last capturing forward recorded (for ``replay``)."""

    def __init__(self, model, device: torch.device) -> None:
        self.model, self.device = model, device
        self.caches: dict[int, ModelCache] = {}
        self.layers = dict(model.named_modules())
        # The last capturing forward: (its batch, slot -> (first captured row, index among the
        # captured requests), layer position -> per-request state before it).
        self.captured: tuple | None = None

    def execute(self, cmd: Command) -> None:
        for handle in cmd.free:
            self.caches.pop(handle, None)
        for handle, specs, num_slots, num_blocks, block_size in cmd.alloc:
            self._check_specs(specs)
            self.caches[handle] = ModelCache.allocate(specs, num_slots=num_slots, num_blocks=num_blocks,
                                                      block_size=block_size, device=self.device)
        for handle, op, slots in cmd.reset:
            if op == "copy":
                self.caches[handle].copy_slots(*slots)
            else:
                self.caches[handle].reset_slots(torch.tensor(slots, device=self.device))
        if cmd.op == "call":
            args = [self._decode(a) for a in cmd.args]
            batch = next((a for a in args if isinstance(a, ForwardBatch)), None)
            if batch is not None and batch.capture is not None:
                self._snapshot(batch)
            getattr(self.model, cmd.method)(*args)
        elif cmd.op == "replay":
            self._replay(cmd.method, *cmd.args)
        else:
            raise ValueError(f"unknown command {cmd.op!r}")

    def _check_specs(self, specs: list) -> None:
        mine = self.model.cache_specs()
        for i, (theirs, ours) in enumerate(zip(specs, mine)):
            if [(s.name, s.shape) for s in theirs] != [(s.name, s.shape) for s in ours]:
                raise RuntimeError(f"layer {i}'s cache differs between rank 0 ({theirs}) and this rank ({ours}): "
                                   "the sharding gave the ranks different local sizes")

    def _decode(self, value):
        if isinstance(value, BatchMsg):
            v = {k: self._decode(x) for k, x in value.values.items()}
            if v["capture"] is not None:
                v["capture"] = StateCapture(v["capture"])
            return ForwardBatch(**v)
        if isinstance(value, CacheRef):
            return self.caches[value.handle]
        if isinstance(value, torch.Tensor):
            return value.to(self.device)
        if isinstance(value, (list, tuple)):
            return type(value)(self._decode(x) for x in value)
        return value

    def _snapshot(self, batch: ForwardBatch) -> None:
        """Before a capturing forward: each captured request's slot and first row among the
        captured rows, and a copy of the per-request state of those slots (what speculative
        decoding's rollback restores; the same rows rank 0's engine copies)."""
        rows = batch.capture.rows
        request = torch.searchsorted(batch.cu_seqlens[1:].to(torch.int64), rows, right=True)
        order, counts = torch.unique_consecutive(request, return_counts=True)
        slots = batch.slots.index_select(0, order).tolist()
        starts = [0] + torch.cumsum(counts, 0).tolist()[:-1]
        where = {s: (start, k) for k, (s, start) in enumerate(zip(slots, starts))}
        index = torch.tensor(slots, device=self.device)
        snapshot = {}
        for i, layer in enumerate(batch.cache.layers if batch.cache is not None else []):
            names = [n for n, s in layer.specs.items() if s.per == "request"] if layer else []
            if names:
                snapshot[i] = {n: layer[n].index_select(0, index).clone() for n in names}
        self.captured = (batch, where, snapshot)

    def _replay(self, name: str, slots: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        """Rank 0 rolled layer ``name``'s state of ``slots`` back to before the capturing forward
        and advanced it over each slot's first ``cu_seqlens`` diff captured rows: do the same."""
        if self.captured is None:
            raise RuntimeError("replay without a capturing forward")
        batch, where, snapshot = self.captured
        layer_module = self.layers[name]
        record = next((r for r in batch.capture.records if r[0] is layer_module), None)
        if record is None:
            raise RuntimeError(f"layer {name} recorded no inputs in the last capturing forward")
        _, cache, inputs = record
        position = next(i for i, layer in enumerate(batch.cache.layers) if layer is cache)
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        slot_list = slots.tolist()
        keep = torch.cat([torch.arange(where[s][0], where[s][0] + n) for s, n in zip(slot_list, lens)])
        pick = torch.tensor([where[s][1] for s in slot_list], device=self.device)
        state = {n: t.index_select(0, pick) for n, t in snapshot[position].items()}
        keep = keep.to(self.device)
        layer_module.replay(cache, slots.to(self.device), state,
                            {n: t.index_select(0, keep) for n, t in inputs.items()}, cu_seqlens.to(self.device))


# --- joining and loading (every rank) ---------------------------------------------------------
def join(spec: Spec, rank: int, world: int, local_rank: int, store) -> Any:
    """Open the model's process group (the device backend's communicator, the collective
    timeout) and the command group; returns the command group."""
    from hwinfer.backend import resolve_device
    from hwinfer.parallel.launch import dist_backend_for

    dev = resolve_device(spec.device(local_rank))
    module = getattr(torch, dev.device_type, None)
    if dev.device_type != "cpu" and module is not None and hasattr(module, "set_device"):
        module.set_device(dev.index)
    if not dist.is_initialized():
        dist.init_process_group(dist_backend_for(dev), store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=spec.collective_timeout))
    return dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)


def load_local(spec: Spec, local_rank: int):
    """This rank's whole model (sharded later, once the process group is up)."""
    from hwinfer.api import load_model

    return load_model(spec.path, device=spec.device(local_rank), dtype=spec.dtype, impl=spec.impl or None,
                      strict=spec.strict, progress=False if local_rank else None)


def shard(model, spec: Spec):
    """Shard ``model`` over the default group; expert parallelism when ``expert_parallel > 1``."""
    import inspect

    from hwinfer.parallel.tensor import shard_model

    if spec.expert_parallel == 1:
        return shard_model(model)
    if "expert_parallel" not in inspect.signature(shard_model).parameters:
        raise ValueError("expert_parallel > 1 is not supported by this version of hwinfer.parallel.tensor")
    return shard_model(model, expert_parallel=True)


def report(store, rank: int, exc: BaseException) -> None:
    """Leave this rank's error where rank 0 looks for it (best effort: the store may be gone)."""
    try:
        if store is not None:
            store.set(ERROR_KEY.format(rank), pickle.dumps((f"{type(exc).__name__}: {exc}",
                                                            traceback.format_exc(), time.time())))
    except Exception:
        pass


def run(spec: Spec, rank: int, world: int, local_rank: int, store, *, owns_group: bool = True) -> None:
    """A follower's life: load, join, shard, announce, then execute commands until ``stop``.
    Any error is reported and ends the process at once (rank 0's collectives then fail fast).
    ``owns_group``: the default process group was opened here, so leave it at the end."""
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C reaches every process of the terminal's group (and torchrun forwards it to every
        # rank): rank 0 decides when followers stop, and tells them.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        model = load_local(spec, local_rank)
        if store is not None:
            store.set(JOINED_KEY.format(rank), b"1")
        commands = join(spec, rank, world, local_rank, store)
        shard(model, spec)
        if store is not None:
            store.set(READY_KEY.format(rank), b"1")
        else:
            dist.barrier(group=commands)  # no store to announce through: rank 0 waits here
        mirror = Mirror(model, model.device)
        with torch.no_grad():
            while True:
                box: list = [None]
                dist.broadcast_object_list(box, src=0, group=commands)
                if box[0].op == "stop":
                    break
                mirror.execute(box[0])
    except BaseException as exc:
        report(store, rank, exc)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group(commands)
    if owns_group:
        dist.destroy_process_group()


def _watch_parent(parent: int) -> None:
    """Exit when the process that spawned us is gone (it cannot send ``stop`` any more)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def main() -> None:
    host, port, rank, world, parent = os.environ[ENV].split(",")
    rank_, world_ = int(rank), int(world)
    threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True).start()
    store = dist.PrefixStore("hwinfer/", dist.TCPStore(host, int(port), world_, is_master=False,
                                                       timeout=timedelta(seconds=120)))
    spec: Spec = pickle.loads(store.get(SPEC_KEY))
    if spec.device_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_))  # the ranks share the host's cores
    run(spec, rank_, world_, rank_, store)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the commands unpickle to the
    # classes of hwinfer.parallel.follower.
    from hwinfer.parallel import follower

    follower.main()
