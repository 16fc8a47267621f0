"""``load_model(path, tensor_parallel=N, expert_parallel=M)``: one model over N processes, driven
from the caller's process.

The caller's process becomes rank 0 (the driver). Without a process group it starts ranks
1..N-1 itself (``python -m hwinfer.parallel.follower``, rendezvous on 127.0.0.1); under torchrun
(RANK / WORLD_SIZE / MASTER_ADDR in the environment) or inside an existing default process group
it joins that instead, and every rank but 0 turns into a follower inside ``load_model`` and exits
when rank 0 stops. Every rank loads the checkpoint and shards it (:func:`~hwinfer.parallel.
tensor.shard_model`); rank 0 returns its model, whose class is swapped for a subclass that
mirrors each call containing collectives (``forward_batch``, ``forward_batch_mtp``,
``mtp_forward``; the full forward goes through ``forward_batch``) to the followers before
running it locally (:mod:`hwinfer.parallel.follower` describes the wire format). Everything
else (the engine, sampling, the server) runs in rank 0 only and is unchanged.

CUDA graphs are off for such a model (``graph_decode = False``): a graph replay is not a model
call, so the followers could not mirror it.

Failure: a follower that dies or raises makes rank 0's current or next call raise
:class:`~hwinfer.parallel.launch.RankFailed` naming the rank and its error; the remaining
followers are terminated and the model refuses further calls. ``model.close()``, leaving a
``with`` block, or the interpreter's exit stops and joins the followers.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hwinfer.parallel import follower as fw
from hwinfer.parallel.handle import MIRRORED, ParallelHandle, open_handles

DEFAULT_COLLECTIVE_TIMEOUT = 300.0  # seconds; HWINFER_COLLECTIVE_TIMEOUT overrides
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_loads = 0  # loads in this process: keeps store keys of successive loads apart under torchrun


def check_sizes(tensor_parallel: Any, expert_parallel: Any) -> tuple[int, int]:
    """Validate the sizes; expert parallelism spans the tensor-parallel ranks or nothing."""
    for name, v in (("tensor_parallel", tensor_parallel), ("expert_parallel", expert_parallel)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if expert_parallel not in (1, tensor_parallel):
        raise ValueError(f"expert_parallel must be 1 or equal to tensor_parallel ({tensor_parallel}): experts "
                         f"are spread over the same ranks as the tensor-parallel shards; got {expert_parallel}")
    return tensor_parallel, expert_parallel


def torchrun_env() -> bool:
    """Is this process one rank of a torchrun (or similarly launched) job?"""
    return all(v in os.environ for v in _TORCHRUN_VARS)


def is_follower_process(tensor_parallel: int) -> bool:
    """Would ``load_model(..., tensor_parallel)`` turn this process into a follower (torchrun
    rank > 0)? ``hwinfer serve`` asks, so that only rank 0 opens the HTTP port."""
    return tensor_parallel > 1 and torchrun_env() and int(os.environ["RANK"]) != 0


def load_parallel(path: str | Path, device: str, dtype, *, tensor_parallel: int, expert_parallel: int,
                  impl=None, strict: bool = False):
    """Rank 0's model of a tensor-parallel group (see the module docstring); on torchrun ranks
    other than 0 this serves rank 0 and then exits the process."""
    from hwinfer.backend import resolve_device
    from hwinfer.loader.checkpoint import CheckpointError
    from hwinfer.loader.config import check_quantization, load_config, model_class

    global _loads
    tp, ep = check_sizes(tensor_parallel, expert_parallel)
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"checkpoint path {root} does not exist")
    config = load_config(root)  # fail on a bad checkpoint before any process starts
    model_class(config)
    check_quantization(config)
    if open_handles():
        raise ValueError("a tensor-parallel model is already open in this process (its ranks share the "
                         "default process group): close() it before loading another")
    dev = resolve_device(device)
    timeout = float(os.environ.get("HWINFER_COLLECTIVE_TIMEOUT", DEFAULT_COLLECTIVE_TIMEOUT))
    joining = dist.is_available() and (dist.is_initialized() or torchrun_env())
    first = 0 if joining or dev.device_type == "cpu" else (dev.index or 0)
    spec = fw.Spec(str(root.resolve()), dev.device_type, first, dtype, dict(impl or {}), strict, tp, ep, timeout)
    _check_devices(spec, joining)
    _loads += 1
    if joining:
        return _join_existing(spec)
    return _spawn(spec)


def _check_devices(spec: fw.Spec, joining: bool) -> None:
    if spec.device_type == "cpu":
        return
    module = getattr(torch, spec.device_type, None)
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 0
    need = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if joining else spec.first_index + spec.tensor_parallel
    if need > count:
        raise ValueError(f"tensor_parallel={spec.tensor_parallel} needs {need} {spec.device_type} devices "
                         f"(one per rank on this host, from index {spec.first_index}); {count} visible")


def _join_existing(spec: fw.Spec):
    """torchrun / an existing default group: this process is one rank among WORLD_SIZE."""
    store, owns = None, not dist.is_initialized()
    if not owns:
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_RANK"])
        base, _, _ = next(dist.rendezvous("env://", rank, world, timeout=fw.timedelta(seconds=spec.collective_timeout)))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"hwinfer/{restart}/{_loads}/", base)
        spec = fw.Spec(**{**spec.__dict__, "first_index": 0})
    if world != spec.tensor_parallel:
        raise ValueError(f"tensor_parallel={spec.tensor_parallel} must equal the process group's world size "
                         f"({world}) when joining an existing rendezvous")
    if rank != 0:
        fw.run(spec, rank, world, local, store, owns_group=owns)
        sys.exit(0)
    model = fw.load_local(spec, local)
    commands = fw.join(spec, rank, world, local, store)
    handle = ParallelHandle(spec, world, commands, store, procs={}, owns_group=owns)
    return handle.start(model, follower_keys=store is not None)


def _spawn(spec: fw.Spec):
    """Start ranks 1..N-1 on this host, then become rank 0."""
    world = spec.tensor_parallel
    master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=fw.timedelta(seconds=spec.collective_timeout))
    store = dist.PrefixStore("hwinfer/", master)
    store.set(fw.SPEC_KEY, pickle.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = {}
    handle = None
    try:
        for r in range(1, world):
            env[fw.ENV] = f"127.0.0.1,{master.port},{r},{world},{os.getpid()}"
            procs[r] = subprocess.Popen([sys.executable, "-m", "hwinfer.parallel.follower"], env=env)
        model = fw.load_local(spec, 0)
        handle = ParallelHandle(spec, world, None, store, procs, owns_group=True, master=master)
        handle.await_keys(fw.JOINED_KEY, "loading the checkpoint")
        handle.commands = fw.join(spec, 0, world, 0, store)
        return handle.start(model, follower_keys=True)
    except BaseException:
        if handle is None:
            handle = ParallelHandle(spec, world, None, store, procs, owns_group=True, master=master)
        handle.teardown()
        raise


_CLASSES: dict[type, type] = {}


def driver_class(cls: type) -> type:
    """``cls`` with its mirrored methods going through ``self.parallel`` and ``close`` /
    context-manager support; same name, so messages naming the class stay the same."""
    if cls not in _CLASSES:
        def mirrored(name: str):
            def method(self, *args):
                return self.parallel.call(name, getattr(super(new, self), name), args)
            method.__name__ = name
            method.__doc__ = getattr(cls, name).__doc__
            return method
        body: dict[str, Any] = {name: mirrored(name) for name in MIRRORED if hasattr(cls, name)}
        body.update(graph_decode=False, close=lambda self: self.parallel.close(),
                    __enter__=lambda self: self, __exit__=lambda self, *exc: self.parallel.close(),
                    __module__=cls.__module__, __qualname__=cls.__qualname__)
        new = type(cls.__name__, (cls,), body)
        _CLASSES[cls] = new
    return _CLASSES[cls]
