"""The kernels of one captured decode step's graph replay, per kernel name, for the default
step and for variants with module constants set (as bench_ablation.py's ``--variant``): what a
difference between two replay times is made of.

    python3 scripts/profile_replay.py --batch 32 \
        --variant "outside@hwinfer.engine.graphs:GREEDY_IN_GRAPH=False"

Per variant: an engine at the batch size decodes a few steps (compiles, captures every size),
then ``--replays`` replays of the batch's graph run under the torch profiler. stdout: one JSON
row per (variant, kernel) with its GPU us per replay, the kernel count per replay and the
replays' wall us (CUDA events, outside the profiler); stderr: the top kernels per variant.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_model import _print_profile, _prompts, shrunk_config  # noqa: E402
from kernel_regs import constants  # noqa: E402

from hwinfer.api import random_model  # noqa: E402
from hwinfer.engine import Engine, SamplingParams  # noqa: E402


def replay_kernels(model, batch: int, prompt: int, replays: int):
    """(torch profile of ``replays`` replays of the batch's decode graph, wall us per replay)."""
    from torch.profiler import ProfilerActivity, profile

    bs = model.cache_block_size()
    engine = Engine(model, max_num_seqs=batch, max_num_batched_tokens=batch * prompt,
                    num_blocks=batch * -(-(prompt + 24) // bs) + 1, cuda_graphs=True,
                    graph_max_len=prompt + 24)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    engine.run([engine.add_request(p, params) for p in _prompts(batch, prompt, model.config["vocab_size"])])
    engine.graphs.capture_all()
    graph = engine.graphs.graphs[batch][0]
    if graph is None:
        raise RuntimeError(f"no graph for batch {batch}: {engine.graphs.disabled}")
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    wall = start.elapsed_time(end) * 1e3 / replays
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    return prof, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME@MODULE:ATTR=VALUE[;...]")
    args = ap.parse_args()
    model = random_model(shrunk_config(args.preset, args.layers), device="cuda", dtype="bf16")
    runs = [("default", [])] + [(v.split("@", 1)[0], v.split("@", 1)[1].split(";")) for v in args.variant]
    for name, items in runs:
        with constants(items):
            prof, wall = replay_kernels(model, args.batch, args.prompt, args.replays)
        print(f"# {name}: replay {wall:.1f} us wall", file=sys.stderr)
        _print_profile(prof, name, args.replays, args.top)
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
                print(json.dumps({"variant": name, "kernel": e.key[:200],
                                  "us": round(e.self_device_time_total / args.replays, 2),
                                  "count": e.count / args.replays, "replay_wall_us": round(wall, 1)}))

if __name__ == "__main__":
    main()
