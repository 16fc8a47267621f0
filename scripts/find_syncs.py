"""List every host sync of a model's fixed-size decode step on CUDA, with where it happens.

    python3 scripts/find_syncs.py deepseek_v4 qwen3_5 --steps 12
    python3 scripts/find_syncs.py qwen3_5 kimi_linear --prefill   # the prefill forwards instead

Runs the engine's graph decode path (hwinfer.engine.graphs) eagerly on tiny checkpoints of the
given architectures, so the step sees real contexts (windows that close, entries that grow), and
turns on torch's sync debug mode "warn" after the first steps (the first ones compile kernels).
Each distinct sync prints once with its innermost hwinfer frames, and so does each op that
takes a host tensor from pageable memory into device work (``HostCopies``: such a copy may wait
for the stream, and the sync debug mode does not report it). A graph capture stops at the
first sync; this lists them all, which is what is needed to make a decode path capturable.
Exit status 1 when any architecture syncs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
import warnings
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint


def _site() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "hwinfer" in f.filename]
    return " <- ".join(f"{f.filename.split('hwinfer/')[-1]}:{f.lineno} {f.name}"
                       for f in reversed(frames[-4:]))


def _pinned(t: torch.Tensor) -> bool:
    try:
        return t.is_pinned()
    except RuntimeError:   # no accelerator to pin for: nothing is pinned
        return False


class HostCopies(TorchDispatchMode):
    """Counts, by site, the ops that take a host tensor in pageable memory (not a 0-dim scalar)
    into device work: a copy from pageable memory goes through a driver staging buffer and may
    wait for the stream, which torch's sync debug mode does not report. (A profile of Qwen3.5's
    1 x 1,024 prefill on the H200 showed 37 such copies a step with 0 syncs reported.) Pinned
    sources (ForwardBatch.host_to_device) are not counted."""

    def __init__(self, found: Counter):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
        if (any(t.device.type != "cpu" for t in flat)
                and any(t.device.type == "cpu" and t.dim() > 0 and not _pinned(t) for t in flat)):
            self.found.update([f"pageable copy ({func.__name__}): {_site()}"])
        return out


def _watched(found: Counter, fn, *args, **kwargs):
    """fn(*args, **kwargs) under torch's sync debug mode "warn" and :class:`HostCopies`, each
    sync's and pageable copy's site counted in ``found`` (the work queued before is waited for
    first, so it is not blamed)."""
    torch.cuda.synchronize()
    previous = warnings.showwarning
    # (torch's sync warnings name "synchronizing"; its one-time note on the mode does not)
    warnings.showwarning = lambda msg, *a, **k: found.update(
        [_site()] if "synchroniz" in str(msg) and "prototype" not in str(msg) else [])
    try:
        with warnings.catch_warnings(), HostCopies(found):
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            return fn(*args, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = previous


def syncs_of(arch: str, steps: int, dtype: torch.dtype, device: str = "cuda") -> Counter:
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(write_checkpoint(arch, tmp), device=device, dtype=dtype)
    engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=64, cuda_graphs=True)
    graphs = engine.graphs
    graphs.capture = False  # run the fixed-size step eagerly, so a sync is reported, not fatal
    found: Counter = Counter()
    calls = [0]
    plain = graphs._forward

    def watched(size: int):
        calls[0] += 1
        if calls[0] <= 3 or device == "cpu":  # compiles and autotunes first; cpu: a dry run
            return plain(size)
        return _watched(found, plain, size)

    graphs._forward = watched
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
    prompts = [torch.randint(3, model.config["vocab_size"], (n,), generator=gen).tolist() for n in (5, 23, 9)]
    engine.run([engine.add_request(p, params) for p in prompts])
    print(f"{arch}: {calls[0]} fixed-size decode steps, {max(0, calls[0] - 3)} watched, "
          f"{len(found)} sync / pageable-copy sites")
    return found


def prefill_syncs_of(arch: str, dtype: torch.dtype, device: str = "cuda") -> Counter:
    """The same for prefill: the engine's forwards over prompts (no decode graphs), four
    requests of different lengths packed in one step, watched after a first identical round."""
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(write_checkpoint(arch, tmp), device=device, dtype=dtype)
    found: Counter = Counter()
    watch = [False]
    plain = model.forward_batch

    def watched(batch, *args, **kwargs):
        if not watch[0] or batch.is_decode or device == "cpu":
            return plain(batch, *args, **kwargs)
        return _watched(found, plain, batch, *args, **kwargs)

    model.forward_batch = watched
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    prompts = [torch.randint(3, model.config["vocab_size"], (n,), generator=gen).tolist()
               for n in (70, 23, 130, 9)]
    for rnd in range(2):   # the first round compiles; the second is watched
        watch[0] = rnd == 1
        engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=512, num_blocks=64)
        engine.run([engine.add_request(p, params) for p in prompts])
    print(f"{arch}: prefill, {len(found)} sync / pageable-copy sites")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archs", nargs="+")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (no sync mode)")
    ap.add_argument("--prefill", action="store_true", help="the prefill forwards instead")
    args = ap.parse_args()
    bad = 0
    for arch in args.archs:
        dtype = getattr(torch, args.dtype)
        found = (prefill_syncs_of(arch, dtype, args.device) if args.prefill
                 else syncs_of(arch, args.steps, dtype, args.device))
        for site, n in found.most_common():
            print(f"  {n:4d}x  {site}")
        bad += bool(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
