"""The order in which a captured decode step reads its projection weights, for L2 prefetch.

A batch-1 decode step is a chain of ~100 small weight products (GEMVs) with norms, recurrences
and attention between them. Each GEMV streams its weights from DRAM only once it is scheduled, so
the DRAM idles at every kernel boundary and under every non-GEMV kernel (on the H200 the 97
products of a Qwen3.5-0.8B step take ~0.52 ms chained, 68% of their bandwidth bound). A GEMV that
knows which weight the step reads next can ask the L2 for it while it works on its own, and the
next product then finds its weights in L2.

The order is a property of the model's forward, not of any kernel, so the engine records it:
:func:`recording` around one warm-up run of the step (each decode GEMV implementation reports its
weight through :func:`note`), then :func:`applied` around the CUDA-graph capture of the same step,
when :func:`note` answers with the weight read ``DISTANCE`` products later. A replay runs the
kernels with the addresses baked in at capture, so nothing is consulted afterwards. Outside
these two contexts :func:`note` does nothing and returns None: eager steps never prefetch.

Prefetching changes no value (it moves bytes into a cache), so a wrong or stale order costs
speed only. The order holds weak references: a weight made per call (a cast, freed after its
product) is gone by the capture and drops out, so every address a captured GEMV prefetches is
that of a weight alive for as long as the model.
"""
from __future__ import annotations

import contextlib
import weakref

import torch

DISTANCE = 1   # how many products ahead a GEMV prefetches
_recording: list[weakref.ref] | None = None
_plan: dict[int, torch.Tensor] | None = None


@contextlib.contextmanager
def recording():
    """Collect the weights :func:`note` reports, in order; yields the list being filled (weak
    references, for :func:`applied`)."""
    global _recording
    previous, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = previous


@contextlib.contextmanager
def applied(recorded: list, distance: int | None = None):
    """While inside, :func:`note` (weight ``order[i]``) returns ``order[i + distance]`` (wrapping
    past the end: the last product of a step prefetches the next step's first), ``order`` being
    the ``recorded`` weights (tensors or weak references; dead ones dropped). The first
    occurrence of a weight read twice in a step decides its successor."""
    global _plan
    distance = DISTANCE if distance is None else distance
    order = [w for w in (r() if isinstance(r, weakref.ref) else r for r in recorded) if w is not None]
    plan: dict[int, torch.Tensor] = {}
    if order and distance > 0:
        for i, w in enumerate(order):
            plan.setdefault(w.data_ptr(), order[(i + distance) % len(order)])
    previous, _plan = _plan, plan
    try:
        yield plan
    finally:
        _plan = previous


def note(weight: torch.Tensor) -> torch.Tensor | None:
    """Called by a decode GEMV implementation with the weight it is about to read: recorded
    while :func:`recording`, and the weight to prefetch (or None) returned while :func:`applied`.
    """
    if _recording is not None:
        _recording.append(weakref.ref(weight))
        return None
    if _plan:
        nxt = _plan.get(weight.data_ptr())
        return None if nxt is None or nxt.data_ptr() == weight.data_ptr() else nxt
    return None


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to one past its last (strided rows included)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()
