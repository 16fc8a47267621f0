"""Programmatic dependent launch (PDL), NVIDIA sm_90+: a kernel may start before the one ahead of
it in the stream has finished.

A decode step is a chain of ~400 small kernels, each of which used to wait for the previous one
to finish before its programs were even scheduled, then paid the DRAM latency of its first
loads. With ``launch_pdl=True`` the GPU schedules a kernel's programs as soon as every program
of the previous kernel has called ``gdc_launch_dependents``; ``gdc_wait`` then blocks until the
previous kernel has completed and its writes are visible.

The convention every PDL kernel here follows (``pdl_enter`` at the top):
* wait first, then let the next kernel launch. So a kernel's predecessor has completed before
  its own successor starts, and by induction every earlier kernel has too;
* nothing that any kernel of the step writes is loaded, and nothing is stored, before the wait.
  The one exception is a load of data no kernel of the step writes: the decode GEMV
  (``gemv.gemv_rows``) issues its weight loads first, so they stream while the previous kernel
  finishes. The caller must know the weight was not written by the kernel just before (see
  ``gemv.linear``). ``gemv_norm.add_rms_norm_linear_conv`` also loads its conv state rows and
  slots early, and ``delta_rule`` its recurrent state rows and slots (pool form): only those
  kernels write them, in earlier steps (slots come from a copy before the step). Either is
  safe because a kernel starts only once its predecessor has passed its wait, i.e. once every
  kernel before that one has completed.

On the H200, the 97 weight products of a Qwen3.5-0.8B decode step took 570 us chained plainly and
500 us with PDL (``scripts/bench_decode_chain.py``, docs/kernels.md). ``HWINFER_PDL=0`` (read at
import) turns it off. Never under the interpreter, on AMD (no such launch) or before sm_90.
"""
from __future__ import annotations

import functools
import os

import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET

ENABLED = os.environ.get("HWINFER_PDL", "1") != "0"


@functools.lru_cache(maxsize=None)
def pdl_ok(device) -> bool:
    """Whether kernels on ``device`` may be launched with PDL."""
    import torch

    device = torch.device(device)
    if not ENABLED or INTERPRET or device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def launch_kwargs(device) -> dict:
    """``launch_pdl=True`` where :func:`pdl_ok`, else nothing: spread into a kernel launch."""
    return {"launch_pdl": True} if pdl_ok(device) else {}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Wait for the previous kernel, then let the next one launch (see the module docstring)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
