"""Run one function on N local processes joined by a torch.distributed process group.

``run_parallel(fn, world_size, args, device=...)`` spawns ``world_size`` processes (the
``spawn`` start method, so CUDA / XPU / NPU runtimes start clean in each), sets up the
rendezvous on 127.0.0.1 and a free port, opens the process group with the communicator the
device's hwinfer backend names (``Backend.dist_backend``: nccl, xccl, hccl; gloo on the CPU) and
a timeout on every collective, then calls ``fn(ctx, *args, **kwargs)`` in each, ``ctx`` being a
:class:`RankContext` (rank, world size, this rank's device string, communicator name). Rank 0's
return value comes back to the caller (pickled by value, so tensors are copied out).

Failure is loud and quick: when a rank raises, or dies without reporting (a signal, os._exit,
the OOM killer), the caller gets :class:`RankFailed` naming that rank with its error and
traceback, and every other rank is terminated: nobody is left waiting in a collective.
``fn`` must be importable by name from the child processes (a module-level function), as
with any ``spawn`` start.
"""
from __future__ import annotations

import os
import pickle
import queue as queue_mod
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hwinfer.backend import DeviceInfo, backends, resolve_device


@dataclass(frozen=True)
class RankContext:
    """What ``fn`` learns about its place: rank, world size, its device (``cpu``, ``cuda:1``,
    ...) and the torch.distributed backend of the default process group."""

    rank: int
    world_size: int
    device: str
    backend: str


class RankFailed(RuntimeError):
    """A rank raised or died; ``rank`` names it, ``error`` is its one-line error, ``remote_traceback``
    its traceback (empty when the process died without a word)."""

    def __init__(self, rank: int, world_size: int, error: str, remote_traceback: str = "") -> None:
        self.rank, self.world_size = rank, world_size
        self.error, self.remote_traceback = error, remote_traceback
        text = f"rank {rank} of {world_size} failed: {error}"
        if remote_traceback:
            text += f"\n--- traceback of rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)


def dist_backend_for(dev: DeviceInfo) -> str:
    """The torch.distributed backend of the hwinfer backend serving ``dev`` (gloo for a CPU no
    installed backend claims)."""
    for b in backends():
        if b.serves(dev):
            return b.dist_backend
    if dev.device_type == "cpu":
        return "gloo"
    raise ValueError(f"no installed hwinfer backend serves {dev.describe()}: no communicator to use")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, backend: str, kind: str, collective_timeout: float,
            fn: Callable[..., Any], args: tuple, kwargs: dict, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        if kind == "cpu":
            device = "cpu"
            if "OMP_NUM_THREADS" not in os.environ:  # N processes share the host's cores
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        else:
            device = f"{kind}:{rank}"
            module = getattr(torch, kind, None)
            if module is not None and hasattr(module, "set_device"):
                module.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout))
        result = fn(RankContext(rank, world_size, device, backend), *args, **kwargs)
        payload = pickle.dumps(result) if rank == 0 else None
        dist.barrier()  # nobody tears the group down while a peer still uses it
        dist.destroy_process_group()
        results.put((rank, "ok", payload, ""))
    except BaseException as exc:  # reported to the caller, which ends the other ranks
        results.put((rank, "error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        # Do not tear the group down here: a peer may sit in a collective with us; the caller
        # terminates everyone.


def exit_message(code: int, missing: str = "a result") -> str:
    """Why a rank's process ended without a word: its signal or exit code."""
    if code < 0:
        try:
            return f"process died from signal {signal.Signals(-code).name} without reporting"
        except ValueError:
            return f"process died from signal {-code} without reporting"
    return f"process exited with code {code} without reporting {missing}"


def run_parallel(fn: Callable[..., Any], world_size: int, args: tuple = (), kwargs: dict | None = None, *,
                 device: str = "cpu", backend: str | None = None, timeout: float | None = None,
                 collective_timeout: float = 120.0) -> Any:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` local processes; return rank 0's result.

    ``device``: cpu (every rank on the CPU) or an accelerator type (cuda, xpu, npu, auto: rank r
    on device r). ``backend``: the torch.distributed backend, by default the one the device's
    hwinfer backend names. ``timeout``: seconds for the whole run (None: no limit); on expiry
    the ranks are terminated and TimeoutError names the ones still running.
    ``collective_timeout``: seconds any one collective may wait (the process group's timeout).
    Raises :class:`RankFailed` (naming the rank) when a rank raises or dies.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    dev = resolve_device(device)
    name = backend or dist_backend_for(dev)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, name=f"hwinfer-rank{r}", daemon=True,
                         args=(r, world_size, port, name, dev.device_type, collective_timeout, fn,
                               tuple(args), dict(kwargs or {}), results))
             for r in range(world_size)]
    deadline = None if timeout is None else time.monotonic() + timeout
    done: dict[int, Any] = {}
    failed: dict[int, tuple[str, str, bool]] = {}  # rank -> (error, traceback, died silently)
    exited_at: dict[int, float] = {}
    grace_end: float | None = None

    try:
        for p in procs:
            p.start()
        while len(done) < world_size:
            try:
                rank, status, payload, tb = results.get(timeout=0.05)
                if status == "error":
                    failed.setdefault(rank, (payload, tb, False))
                else:
                    done[rank] = payload
            except queue_mod.Empty:
                pass
            now = time.monotonic()
            for r, p in enumerate(procs):
                if r in done or r in failed or p.exitcode is None:
                    continue
                # Its last message may still be in the pipe: wait a moment before calling it dead.
                if now - exited_at.setdefault(r, now) > 0.5:
                    failed[r] = (exit_message(p.exitcode), "", True)
            if failed and grace_end is None:
                # A rank's failure makes its peers fail too (a closed connection in a collective):
                # wait briefly for the whole picture, then blame the root cause.
                grace_end = now + 1.5
            if grace_end is not None and (now > grace_end or len(done) + len(failed) == world_size):
                silent = [r for r, f in failed.items() if f[2]]
                culprit = silent[0] if silent else next(iter(failed))
                error, tb, _ = failed[culprit]
                others = [r for r in failed if r != culprit]
                if others:
                    error += f" (then rank(s) {', '.join(map(str, others))} failed too)"
                raise RankFailed(culprit, world_size, error, tb)
            if deadline is not None and now > deadline:
                pending = [r for r in range(world_size) if r not in done]
                raise TimeoutError(f"ranks {pending} of {world_size} did not finish within {timeout} s")
        for p in procs:
            p.join(timeout=10)
        return pickle.loads(done[0])
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
        results.close()
