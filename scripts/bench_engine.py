"""Engine benchmarks: throughput vs concurrency, and the prefix-cache hit rate on a shared prefix.

    python scripts/bench_engine.py --arch qwen3_5 --size small --device cpu [--concurrency 1,4,16]
    python scripts/bench_engine.py --preset qwen3.5-0.8b --device cuda --dtype bf16

Writes a generated checkpoint of ``--arch``/``--size`` (random weights; the tokens are
meaningless, the work is real), then for each concurrency c submits c requests at once (prompt
``--prompt`` tokens, ``--new`` greedy tokens each, eos ignored) and reports output tokens per
second over the whole run. The prefix workload sends ``--concurrency`` max requests that share
a long prefix, after one warm request, and reports the hit rate and the time saved.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from hwinfer import load_model
from hwinfer.api import random_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint


def _prompts(n: int, length: int, vocab: int, seed: int, shared: list[int] | None = None) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    head = shared or []
    return [head + torch.randint(3, vocab, (length - len(head),), generator=gen).tolist() for _ in range(n)]


def throughput(model, concurrency: int, prompt_len: int, new: int, budget: int, spec: int = 0) -> dict:
    engine = Engine(model, max_num_seqs=concurrency, max_num_batched_tokens=budget,
                    num_blocks=concurrency * -(-(prompt_len + new + spec) // model.cache_block_size()) + 1,
                    num_speculative_tokens=spec)
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in _prompts(concurrency, prompt_len, model.config["vocab_size"], 1)]
    _sync(model)
    start = time.perf_counter()
    engine.run(reqs)
    _sync(model)
    seconds = time.perf_counter() - start
    row = {"concurrency": concurrency, "spec_tokens": spec, "seconds": round(seconds, 3),
           "steps": engine.steps, "output_tok_s": round(concurrency * new / seconds, 1),
           "total_tok_s": round(concurrency * (prompt_len + new) / seconds, 1)}
    if spec:
        stats = engine.spec_stats()
        row.update(acceptance_rate=round(stats.acceptance_rate, 4),
                   tokens_per_verify=round(stats.tokens_per_verify, 3))
    return row


def prefix_workload(model, n: int, prefix_len: int, suffix_len: int, new: int, budget: int, chunk: int) -> dict:
    vocab = model.config["vocab_size"]
    shared = _prompts(1, prefix_len, vocab, 2)[0]
    prompts = _prompts(n + 1, prefix_len + suffix_len, vocab, 3, shared)
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    bs = model.cache_block_size()
    chunk = bs * -(-chunk // bs)  # a multiple of the block size (so of every compression ratio)
    out = {"chunk_tokens": chunk}
    for on in (False, True):
        engine = Engine(model, max_num_seqs=n, max_num_batched_tokens=budget,
                        num_blocks=(n + 2) * -(-(prefix_len + suffix_len + new) // model.cache_block_size()),
                        enable_prefix_caching=on, prefix_chunk_tokens=chunk if on else None)
        engine.run([engine.add_request(prompts[0], params)])
        _sync(model)
        start = time.perf_counter()
        tokens = [o.token_ids for o in engine.run([engine.add_request(p, params) for p in prompts[1:]])]
        _sync(model)
        out["on" if on else "off"] = {"seconds": round(time.perf_counter() - start, 3), "tokens": tokens}
        if on:
            out["hit_rate"] = round(engine.prefix.stats.hit_rate, 3)
    out["identical"] = out["on"]["tokens"] == out["off"]["tokens"]
    for k in ("on", "off"):
        out[k].pop("tokens")
    return out


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3_5")
    ap.add_argument("--size", default="small")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--prefix", type=int, default=192)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--spec", type=int, default=0, help="also measure MTP speculation with k drafts")
    ap.add_argument("--preset", default=None, help="real dimensions, random weights (e.g. qwen3.5-0.8b)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if args.preset:
        model = random_model(args.preset, device=args.device, dtype=args.dtype)
        name = args.preset
    else:
        root = Path(tempfile.mkdtemp(prefix=f"hwinfer-bench-{args.arch}-"))
        write_checkpoint(args.arch, root, size=args.size)
        model = load_model(root, device=args.device, dtype=args.dtype)
        name = f"{args.arch}/{args.size}"
    print(f"{name} on {model.device} ({next(model.parameters()).dtype}); "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
    results = {"throughput": [], "prefix": None}
    for c in (int(x) for x in args.concurrency.split(",")):
        row = throughput(model, c, args.prompt, args.new, args.budget)
        results["throughput"].append(row)
        print(json.dumps(row))
        if args.spec:
            row = throughput(model, c, args.prompt, args.new, args.budget, spec=args.spec)
            results["throughput"].append(row)
            print(json.dumps(row))
    results["prefix"] = prefix_workload(model, max(int(x) for x in args.concurrency.split(",")),
                                        args.prefix, 16, args.new, args.budget, args.chunk)
    print(json.dumps({"prefix": results["prefix"]}))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
