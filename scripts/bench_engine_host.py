"""The engine's host work per decode step, the model forward stubbed out: what the GPU waits for
between two graph replays when steps are not overlapped (and what overlapped steps hide).

    python3 scripts/bench_engine_host.py [--batch 32] [--prompt 1024] [--profile]

Runs the tiny Qwen3.5 checkpoint on the CPU through the fixed-size (graph) decode path with the
forward replaced by constant logits, so only scheduling, input preparation, sampling and
bookkeeping are timed. ``--profile``: the functions with the most own time (cProfile).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time

import torch

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    model = load_model(write_checkpoint("qwen3_5", tempfile.mkdtemp()), device="cpu")
    b, p = args.batch, args.prompt
    longest = p + 2 * args.steps + 8
    engine = Engine(model, max_num_seqs=b, max_num_batched_tokens=b * p, cuda_graphs=True,
                    num_blocks=b * -(-longest // model.cache_block_size()) + 1, graph_max_len=longest)
    params = SamplingParams(max_tokens=2 * args.steps, temperature=0, ignore_eos=True)
    reqs = [engine.add_request([1 + (i + j) % 97 for j in range(p)], params) for i in range(b)]
    while any(not r.output_ids for r in reqs):
        engine.step()
    logits = torch.zeros(engine.graphs.sizes[-1], model.config["vocab_size"])
    engine.graphs._forward = lambda size: logits[:size]   # the forward stubbed: host work only
    for overlap in (False, True):
        engine.overlap = overlap
        engine.step()
        prof = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        for _ in range(args.steps // 2):
            engine.step()
        if prof:
            prof.disable()
        us = (time.perf_counter() - t0) / (args.steps // 2) * 1e6
        print(f"batch {b}, prompt {p}, overlap {overlap}: {us:.1f} us of host work per decode step")
        if prof:
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            print(text.getvalue())


if __name__ == "__main__":
    main()
