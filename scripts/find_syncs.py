"""List every host sync of a model's fixed-size decode step on CUDA, with where it happens.

    python3 scripts/find_syncs.py deepseek_v4 qwen3_5 --steps 12

Runs the engine's graph decode path (hwinfer.engine.graphs) eagerly on tiny checkpoints of the
given architectures, so the step sees real contexts (windows that close, entries that grow), and
turns on torch's sync debug mode "warn" after the first steps (the first ones compile kernels).
Each distinct sync prints once with its innermost hwinfer frames. A graph capture stops at the
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

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint


def _site() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "hwinfer" in f.filename]
    return " <- ".join(f"{f.filename.split('hwinfer/')[-1]}:{f.lineno} {f.name}"
                       for f in reversed(frames[-4:]))


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
        torch.cuda.synchronize()
        previous = warnings.showwarning
        # (torch's sync warnings name "synchronizing"; its one-time note on the mode does not)
        warnings.showwarning = lambda msg, *a, **k: found.update(
            [_site()] if "synchroniz" in str(msg) and "prototype" not in str(msg) else [])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                return plain(size)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = previous

    graphs._forward = watched
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
    prompts = [torch.randint(3, model.config["vocab_size"], (n,), generator=gen).tolist() for n in (5, 23, 9)]
    engine.run([engine.add_request(p, params) for p in prompts])
    print(f"{arch}: {calls[0]} fixed-size decode steps, {max(0, calls[0] - 3)} watched, "
          f"{len(found)} sync sites")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archs", nargs="+")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (no sync mode)")
    args = ap.parse_args()
    bad = 0
    for arch in args.archs:
        found = syncs_of(arch, args.steps, getattr(torch, args.dtype), args.device)
        for site, n in found.most_common():
            print(f"  {n:4d}x  {site}")
        bad += bool(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
