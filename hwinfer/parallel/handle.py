"""Rank 0's end of a tensor-parallel group (:mod:`hwinfer.parallel.driver`): it sends each
mirrored model call to the followers (:mod:`hwinfer.parallel.follower`) before running it
locally, watches the followers, names the rank that failed, and shuts the group down.

Cache state that changes outside the model calls:

* the engine's pool zeroes a slot's ring / per-request state when it hands the slot out
  (``ModelCache.reset_slots``) and prefix caching copies it between slots
  (``ModelCache.copy_slots``): rank 0's cache gets instance-level versions of both that also
  queue the operation, and the followers apply the queue, in order, before the next command;
* speculative decoding rolls recurrent state back with ``layer.replay``: rank 0's StateCapture
  is swapped for one whose records call the layers through a proxy that sends ``replay`` first;
  ring rows need no rollback (rejected writes land on spare rows) on any rank;
* a freshly zeroed slot whose first forward starts past position 0 must have had state copied
  in; one that did not get it through ``copy_slots`` (a copy the followers never saw) is refused
  before anything is sent.
"""
from __future__ import annotations

import pickle
import subprocess
import threading
import time
import weakref
from typing import Callable

import torch
import torch.distributed as dist

from hwinfer.parallel import follower as fw
from hwinfer.parallel.launch import RankFailed, exit_message
from hwinfer.runtime.batch import ForwardBatch
from hwinfer.runtime.capture import StateCapture

MIRRORED = ("forward_batch", "forward_batch_mtp", "mtp_forward")
STARTS = ("forward_batch", "forward_batch_mtp")  # calls that advance requests' cache state
_open: weakref.WeakSet = weakref.WeakSet()  # this process's handles


def open_handles() -> list:
    """The tensor-parallel models open in this process (they share the default group: one at a time)."""
    return [h for h in _open if not h.closed]


class ParallelHandle:
    """Rank 0's end of the group: sends the commands, watches the followers, shuts down.
    ``model.parallel`` is this object (``world_size``, ``expert_parallel``, ``pids``, ``close``)."""

    def __init__(self, spec: fw.Spec, world: int, commands, store, procs: dict[int, subprocess.Popen], *,
                 owns_group: bool, master=None) -> None:
        self.spec, self.world_size, self.expert_parallel = spec, world, spec.expert_parallel
        self.commands, self.store, self.procs, self._master = commands, store, procs, master
        self.owns_group = owns_group  # we opened the default group: we close it
        self.closed = False
        self.failure: BaseException | None = None
        self._lock = threading.RLock()
        self._inside = threading.local()
        self._handles: dict[int, int] = {}              # id(ModelCache) -> handle
        self._new: list = []                            # allocations to announce with the next command
        self._dead: list[int] = []                      # handles whose cache rank 0 dropped
        self._fresh: dict[int, set[int]] = {}           # stateful cache handle -> slots zeroed, not yet run
        # (handle, "reset", slots) / (handle, "copy", [src, dst]), applied with the next command
        self._resets: list[tuple[int, str, list[int]]] = []
        self.names: dict[int, str] = {}                 # id(module) -> its name in the model
        self._next = 0

    @property
    def pids(self) -> list[int]:
        """Process ids of the followers this process started (empty under torchrun)."""
        return [p.pid for p in self.procs.values()]

    # --- start and stop ------------------------------------------------------------------------
    def start(self, model, *, follower_keys: bool):
        """Shard rank 0's ``model``, wait for the followers to be ready, and turn the model
        into the driver (its class gains the mirrored methods, ``close`` and ``with``)."""
        from hwinfer.parallel.driver import driver_class

        try:
            fw.shard(model, self.spec)
            if follower_keys:
                self.await_keys(fw.READY_KEY, "sharding the model")
            else:
                dist.barrier(group=self.commands)
        except BaseException:
            self.teardown()
            raise
        self.names = {id(m): name for name, m in model.named_modules()}
        _open.add(self)
        model.__class__ = driver_class(type(model))
        for name in MIRRORED:
            # Sharding may wrap a method on the instance (e.g. planning hash-routed dispatch
            # before the forward); that wrapper shadows the class's, so it is mirrored here.
            own = vars(model).get(name)
            if own is not None:
                setattr(model, name, self._mirrored(name, own))
        model.parallel = self
        weakref.finalize(model, self.close)
        return model

    def close(self) -> None:
        """Stop the followers and leave the process group (idempotent)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.failure is None and self.commands is not None:
                try:
                    dist.broadcast_object_list([fw.Command("stop")], src=0, group=self.commands)
                except Exception:
                    pass
            self.teardown(grace=10.0)

    def teardown(self, grace: float = 0.0) -> None:
        """Wait up to ``grace`` seconds for the followers to exit, end the rest, leave the groups."""
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self.closed = True
        for group in ([self.commands] if self.commands is not None else []) + \
                ([None] if self.owns_group and dist.is_initialized() else []):
            try:
                dist.destroy_process_group(group)
            except Exception:
                pass
        self.commands = None

    # --- mirrored calls ------------------------------------------------------------------------
    def call(self, method: str, local: Callable, args: tuple):
        if getattr(self._inside, "depth", 0):
            return local(*args)  # nested in a mirrored call: the followers run it inside theirs
        with self._lock:
            self._check_usable()
            cmd = fw.Command("call", method, tuple(self._encode(a, method) for a in args))
            return self._run(cmd, lambda: local(*args))

    def _mirrored(self, name: str, local: Callable) -> Callable:
        def method(*args):
            return self.call(name, local, args)
        method.__name__, method.__doc__ = name, local.__doc__
        return method

    def replay(self, name: str, layer, cache, slots, state, inputs, cu_seqlens) -> None:
        with self._lock:
            self._check_usable()
            cmd = fw.Command("replay", name, (slots.detach().cpu(), cu_seqlens.detach().cpu()))
            self._run(cmd, lambda: layer.replay(cache, slots, state, inputs, cu_seqlens))

    def _run(self, cmd: fw.Command, local: Callable):
        cmd.alloc, self._new = self._new, []
        cmd.free, self._dead = self._dead, []
        cmd.reset, self._resets = self._resets, []
        self._inside.depth = 1
        try:
            dist.broadcast_object_list([cmd], src=0, group=self.commands)
            return local()
        except BaseException as exc:
            failure = self._diagnose(exc)
            self.failure = failure
            self.teardown()
            if isinstance(exc, Exception):
                raise failure from exc
            raise
        finally:
            self._inside.depth = 0

    def _encode(self, value, method: str):
        if isinstance(value, ForwardBatch):
            handle = None if value.cache is None else self._register(value.cache)
            if handle is not None and method in STARTS and handle in self._fresh:
                self._start(handle, value)
            if value.capture is not None:
                value.capture = _MirroredCapture(value.capture.rows, self)
            return fw.encode_batch(value, handle)
        if isinstance(value, torch.Tensor):
            return value.detach().cpu()
        if isinstance(value, (list, tuple)):
            return type(value)(self._encode(v, method) for v in value)
        return value

    def _register(self, cache) -> int:
        handle = self._handles.get(id(cache))
        if handle is None:
            handle, self._next = self._next, self._next + 1
            self._handles[id(cache)] = handle
            specs = [list(layer.specs.values()) if layer is not None else [] for layer in cache.layers]
            self._new.append((handle, specs, cache.num_slots, cache.num_blocks, cache.block_size))
            if any(s.per != "token" for layer in specs for s in layer):
                self._fresh[handle] = set()
                self._watch_resets(cache, handle)
            weakref.finalize(cache, self._drop, id(cache), handle)
        return handle

    def _watch_resets(self, cache, handle: int) -> None:
        """Zeroing a slot on rank 0 (the pool handing it to a new request) zeroes it everywhere;
        copying one slot's state into another (prefix caching) copies it everywhere."""
        ref = weakref.ref(cache)  # no cycle: the cache's memory goes as soon as the engine drops it

        def reset_slots(slots: torch.Tensor) -> None:
            listed = slots.tolist()
            self._resets.append((handle, "reset", listed))
            self._fresh[handle].update(listed)
            type(ref()).reset_slots(ref(), slots)

        def copy_slots(src: int, dst: int) -> None:
            self._resets.append((handle, "copy", [int(src), int(dst)]))
            self._fresh[handle].discard(int(dst))  # it now holds state every rank has
            type(ref()).copy_slots(ref(), src, dst)
        cache.reset_slots, cache.copy_slots = reset_slots, copy_slots

    def _drop(self, key: int, handle: int) -> None:
        self._handles.pop(key, None)
        self._fresh.pop(handle, None)
        self._dead.append(handle)

    def _start(self, handle: int, batch: ForwardBatch) -> None:
        """A freshly zeroed slot of a stateful cache starts at position 0 unless its state was
        copied in through ``copy_slots``; any other way in is invisible to the followers."""
        fresh = self._fresh[handle]
        for s, c in zip(batch.slots.tolist(), batch.context_lens_host):
            if c and s in fresh:
                raise RuntimeError(
                    f"tensor parallel: request slot {s} starts at position {c} but its state was zeroed and "
                    "not copied in through ModelCache.copy_slots, so the other ranks cannot hold the same "
                    "state")
        fresh.difference_update(batch.slots.tolist())

    # --- failures ------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"this tensor-parallel model failed earlier and is closed: {self.failure}")
        if self.closed:
            raise RuntimeError("this tensor-parallel model was closed (model.close())")
        if any(p.poll() is not None for p in self.procs.values()):
            failure = self._diagnose(None)
            self.failure = failure
            self.teardown()
            raise failure

    def _diagnose(self, exc: BaseException | None) -> RankFailed:
        """The rank to blame: one that died without a word, else the first to report an error,
        else rank 0 itself (``exc``). Waits briefly for followers' reports to land."""
        deadline, seen_dead = time.monotonic() + 2.0, {}
        while True:
            now = time.monotonic()
            dead = {r: p.poll() for r, p in self.procs.items() if p.poll() is not None}
            for r in dead:
                seen_dead.setdefault(r, now)
            reports = self._reports()
            # A dead rank gets half a second for its report to land before it counts as silent.
            settled = all(r in reports or now - seen_dead[r] > 0.5 for r in dead)
            if ((dead or reports) and settled) or now > deadline:
                break
            time.sleep(0.05)
        silent = [r for r in sorted(dead) if r not in reports]
        if silent:
            return RankFailed(silent[0], self.world_size, exit_message(dead[silent[0]], "an error"))
        if reports:
            r = min(reports, key=lambda k: reports[k][2])
            return RankFailed(r, self.world_size, reports[r][0], reports[r][1])
        text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown failure"
        return RankFailed(0, self.world_size, text)

    def _reports(self) -> dict[int, tuple[str, str, float]]:
        out = {}
        if self.store is None:
            return out
        for r in range(1, self.world_size):
            try:
                if self.store.check([fw.ERROR_KEY.format(r)]):
                    out[r] = pickle.loads(self.store.get(fw.ERROR_KEY.format(r)))
            except Exception:
                break  # the store itself is gone
        return out

    def await_keys(self, key: str, what: str) -> None:
        """Wait until every follower set ``key``; a follower that reports an error or dies
        first raises RankFailed naming it."""
        keys = [key.format(r) for r in range(1, self.world_size)]
        while not self.store.check(keys):
            if self._reports() or any(p.poll() is not None for p in self.procs.values()):
                f = self._diagnose(None)
                raise RankFailed(f.rank, f.world_size, f"{f.error} (while {what})", f.remote_traceback)
            time.sleep(0.05)


class _MirroredCapture(StateCapture):
    """Rank 0's StateCapture: the layers it records are wrapped, so that speculative decoding's
    ``layer.replay(...)`` reaches the followers too."""

    def __init__(self, rows: torch.Tensor, handle: ParallelHandle) -> None:
        super().__init__(rows)
        self._handle = handle

    def record(self, layer, cache: dict, **inputs: torch.Tensor) -> None:
        super().record(_ReplayProxy(self._handle, layer), cache, **inputs)


class _ReplayProxy:
    def __init__(self, handle: ParallelHandle, layer) -> None:
        self._handle, self._layer = handle, layer

    def replay(self, cache, slots, state, inputs, cu_seqlens) -> None:
        name = self._handle.names[id(self._layer)]
        self._handle.replay(name, self._layer, cache, slots, state, inputs, cu_seqlens)
