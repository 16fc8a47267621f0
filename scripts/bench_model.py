"""Whole-model prefill and decode speed at real dimensions with random weights, side by side with
transformers on the same card and the weight-bandwidth roofline (issue 6, item 4).

    python3 scripts/bench_model.py --preset qwen3.5-0.8b --batch 1,32
    python3 scripts/bench_model.py --preset kimi-linear-48b-a3b --layers 4 --batch 1,32
    python3 scripts/bench_model.py --preset qwen3.5-0.8b --no-hf --csv results.csv
    python3 scripts/bench_model.py --preset deepseek-v4-flash --layers 4 --batch 32 --hf-only

For each batch size B: B prompts of ``--prompt`` random tokens are prefilled in one engine step
(prefill tok/s = B * prompt / time of that step), then ``--new`` decode steps are timed (decode
tok/s = B * new / time). hwinfer runs twice, eager and with CUDA graphs; ``graph replay`` is the
captured forward alone (what the GPU needs per step, without the engine's host work).
transformers: generate() with max_new_tokens 1 and 1 + new (decode = the difference), SDPA without
cuDNN (it re-plans per KV length, TOOLCHAIN.md). Roofline: bytes of the weights one decode step
reads (every parameter except the embedding table, which only gives B rows; lm_head counted;
routed experts: the B * top_k the batch can touch, at most all) / the card's bandwidth, times B:
the copy bandwidth measured on the card at the start (hwinfer/ci/ceilings.py; 4,270 GB/s on the H200,
3,024 on the H100 80 GB).
``--layers N`` keeps the first N decoder layers (lists of per-layer values are cut to match; for
Kimi-Linear use a multiple of 4 so a full-attention layer is among them).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from hwinfer.api import random_model
from hwinfer.ci.ceilings import copy_gbps, describe
from hwinfer.engine import Engine, SamplingParams
from hwinfer.engine.ledger import LEDGER_ONLY
from hwinfer.loader.config import load_config


def peak_bytes_s() -> float:
    """The card's measured copy bandwidth, bytes/s (hwinfer.ci.ceilings)."""
    return copy_gbps() * 1e9


def shrunk_config(preset: str, layers: int | None) -> Path:
    """A directory holding the preset's config.json, cut to ``layers`` decoder layers."""
    config = load_config(preset)
    text = config.get("text_config", config)
    if layers:
        old = text["num_hidden_layers"]
        text["num_hidden_layers"] = layers
        for key, value in list(text.items()):
            if isinstance(value, list) and len(value) in (old, old + text.get("num_nextn_predict_layers", 0)):
                text[key] = value[:layers]
        # Lists of 1-based layer numbers (Kimi-Linear's linear_attn_config) keep those that exist.
        for sub in (v for v in text.values() if isinstance(v, dict)):
            for key, value in list(sub.items()):
                if key.endswith("_layers") and isinstance(value, list):
                    sub[key] = [i for i in value if isinstance(i, int) and i <= layers]
    if config.get("model_type") in LEDGER_ONLY:
        # A config hwinfer cannot load yet (Gemma 4 12B "unified"): its text stack alone, as the
        # model type of the same attention (the ledger's mapping), announced on stderr.
        config = {**text, "model_type": LEDGER_ONLY[text["model_type"]]}
        print(f"# {preset}: text stack only, as {config['model_type']}", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="hwinfer-bench-model-"))
    (root / "config.json").write_text(json.dumps(config))
    return root


def decode_weight_bytes(model, batch: int = 1) -> int:
    """Bytes of weights one decode step of ``batch`` requests must read: every parameter except
    the embedding table (it gives B rows) and MTP; of the routed experts the share a batch of
    uniformly routed tokens touches on average, ``1 - (1 - top_k / E) ** batch`` (64% of
    Kimi-Linear's at b=32, not all of them). Random-weight models route less evenly (hash layers
    see repeated token ids), so a b > 1 figure can exceed this roofline."""
    cfg = model.config.get("text_config", model.config)
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or 0
    top_k = cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or 0  # Kimi spells it out
    share = 1.0 - (1.0 - top_k / experts) ** batch if experts and top_k else 1.0
    total = 0.0
    for name, p in model.named_parameters():
        if name.startswith(("mtp.", "embed_tokens.")) or ".mtp." in name:
            continue
        nbytes = p.numel() * p.element_size()
        total += nbytes * share if ".experts." in name else nbytes
    if getattr(model, "tied", False):
        total += model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    return int(total)


def _prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(3, vocab, (batch, length), generator=gen).tolist()


def _now() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def bench_hwinfer(model, batch: int, prompt: int, new: int, graphs: bool,
                  prefill_graphs: bool | None = None) -> dict:
    """``prefill_graphs``: the engine's option (None: its default, on for CUDA models that
    declare a graph-safe prefill when ``graphs`` is on)."""
    bs = model.cache_block_size()
    if not graphs:
        prefill_graphs = False
    engine = Engine(model, max_num_seqs=batch, max_num_batched_tokens=batch * prompt,
                    num_blocks=batch * -(-(prompt + new + 8) // bs) + 1, cuda_graphs=graphs,
                    graph_max_len=prompt + new + 8, prefill_graphs=prefill_graphs)
    params = SamplingParams(max_tokens=new + 1, temperature=0, ignore_eos=True)
    # Warm-up round at the timed shapes: Triton compiles one variant per integer specialisation
    # (==1, %16), so a shorter warm-up prompt would leave compiles inside the timed prefill
    # (transformers gets the same full-length warm-up below). It decodes as far as the timed
    # run does: with 4 warm-up tokens, DeepSeek-V4's first eager decode measured 136 ms/step
    # on the H200 against 18 ms/step once warm (compiles for later positions in the timing).
    engine.run([engine.add_request(p, SamplingParams(max_tokens=new + 1, temperature=0, ignore_eos=True))
                for p in _prompts(batch, prompt, model.config["vocab_size"])])
    t0 = time.perf_counter()
    if engine.graphs is not None:
        engine.graphs.capture_all()
    capture_s = time.perf_counter() - t0
    reqs = [engine.add_request(p, params) for p in _prompts(batch, prompt, model.config["vocab_size"])]
    t0 = _now()
    while any(not r.output_ids for r in reqs):
        engine.step()
    t1 = _now()
    for _ in range(new):
        engine.step()
    t2 = _now()
    impl = "hwinfer+graphs" if graphs else "hwinfer eager"
    row = {"impl": impl + ("+prefill graphs" if engine.prefill_graphs is not None else ""), "batch": batch,
           "prefill_tok_s": batch * prompt / (t1 - t0), "decode_tok_s": batch * new / (t2 - t1),
           "ms_per_step": 1e3 * (t2 - t1) / new}
    if engine.prefill_graphs is not None:
        row["prefill_graphs_disabled"] = engine.prefill_graphs.disabled
        row["prefill_replays"] = engine.prefill_graphs.replays
    if engine.graphs is not None:
        row["graphs_disabled"] = engine.graphs.disabled
        row["capture_s"] = capture_s
        graph = engine.graphs.graphs.get(batch, (None,))[0]
        if engine.graphs.disabled is None and graph is not None:  # no graph objects off CUDA
            graph.replay()
            t0 = _now()
            for _ in range(50):
                graph.replay()
            row["graph_replay_ms"] = 1e3 * (_now() - t0) / 50
    while engine.has_unfinished():
        engine.step()
    return row


def _print_profile(prof, label: str, steps: int, top: int = 30) -> None:
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    count = sum(e.count for e in events) / steps
    total = sum(e.self_device_time_total for e in events) / steps
    print(f"# profile {label}: {count:.0f} kernels/step, {total:.0f} us GPU time/step", file=sys.stderr)
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"#   {e.self_device_time_total / steps:8.1f} us  x{e.count / steps:5.1f}  {e.key[:90]}",
              file=sys.stderr)


def _host_profile(engine, steps: int, label: str, top: int = 25) -> None:
    """cProfile of ``steps`` engine steps: the functions with the most own host time, to stderr."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    t0 = _now()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    wall = (_now() - t0) / steps
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(f"# host profile {label}: {1e3 * wall:.1f} ms wall/step", file=sys.stderr)
    for line in text.getvalue().splitlines():
        if line.strip():
            print(f"#   {line[:150]}", file=sys.stderr)


def profile_steps(model, batch: int, prompt: int, steps: int = 5) -> None:
    """Kernels of one prefill step of ``batch`` x ``prompt`` tokens and of ``steps`` decode steps
    (eager, then replayed from a graph), after a warm-up of the same shapes: count per step and
    the top kernels by GPU time, to stderr."""
    from torch.profiler import ProfilerActivity, profile

    for graphs in ((False, True) if getattr(model, "graph_decode", False) else (False,)):
        bs = model.cache_block_size()
        engine = Engine(model, max_num_seqs=batch, max_num_batched_tokens=batch * prompt,
                        num_blocks=batch * -(-(prompt + 64) // bs) + 1, cuda_graphs=graphs)
        for rnd in range(2):  # round 0 compiles and captures; round 1 is profiled
            reqs = [engine.add_request(p, SamplingParams(max_tokens=2 * steps + 8, temperature=0, ignore_eos=True))
                    for p in _prompts(batch, prompt, model.config["vocab_size"])]
            if rnd and not graphs:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    engine.step()
                    torch.cuda.synchronize()
                _print_profile(prof, f"prefill {batch} x {prompt}", 1)
            else:
                engine.step()
            for _ in range(3):
                engine.step()
            if rnd:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(steps):
                        engine.step()
                    torch.cuda.synchronize()
                _print_profile(prof, f"decode batch {batch} {'graphs' if graphs else 'eager'}", steps)
                if not graphs:  # where the host's time goes when the GPU waits for it
                    _host_profile(engine, steps, f"decode batch {batch} eager")
            while engine.has_unfinished():
                engine.step()
            del reqs
        if not graphs:  # the host's time in a prefill step (its kernels take far less, above)
            reqs = [engine.add_request(p, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
                    for p in _prompts(batch, prompt, model.config["vocab_size"])]
            _host_profile(engine, 1, f"prefill {batch} x {prompt}", top=40)
            while engine.has_unfinished():
                engine.step()


def bench_transformers(config_dir: Path, batch: int, prompt: int, new: int, device: str) -> dict:
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = json.loads((config_dir / "config.json").read_text())
    if "text_config" in config:
        text = dict(config["text_config"])
        text.setdefault("model_type", config["model_type"] + "_text")
        config = text
    model_type = config.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **config)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.tensor(_prompts(batch, prompt, cfg.vocab_size), device=device)

    def gen(n: int) -> float:
        t0 = _now()
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                    do_sample=False)
        return _now() - t0
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                       SDPBackend.MATH]):
        gen(2)
        first = gen(1)
        full = gen(1 + new)
    del hf
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"impl": f"transformers {transformers.__version__}", "batch": batch,
            "prefill_tok_s": batch * prompt / first, "decode_tok_s": batch * new / (full - first),
            "ms_per_step": 1e3 * (full - first) / new}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--hf-only", action="store_true",
                    help="transformers alone (our model not built: all the memory is its own)")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--without-prefill-graphs", action="store_true",
                    help="at batch 1 also time the engine without its prefill CUDA graphs (a second row)")
    ap.add_argument("--profile", action="store_true", help="kernel breakdown of prefill and decode steps")
    ap.add_argument("--profile-prompt", type=int, default=256, help="prompt length when profiling")
    ap.add_argument("--impl", default="", help="op=impl overrides, comma-separated")
    ap.add_argument("--kv-format", default="auto",
                    help="cache storage, as load_model's kv_format: auto / bf16 = the compute dtype; "
                         "fp8 = DeepSeek-V4's packed fp8_ds_mla rows (the FP8 attention kernels)")
    ap.add_argument("--csv", default=None, help="append rows (model, impl, batch, metric, value, unit)")
    args = ap.parse_args()
    import atexit

    def _gemv_choices() -> None:  # which decode projections the measured choice sent to the GEMV
        from hwinfer.kernels.triton.gemv import chosen
        for (n, k, m, *_), pick in sorted(chosen().items(), key=lambda kv: kv[0][:3]):
            print(f"# linear N={n} K={k} M={m}: {'F.linear' if pick is None else f'gemv {pick}'}",
                  file=sys.stderr)
    atexit.register(_gemv_choices)
    config_dir = shrunk_config(args.preset, args.layers)
    name = args.preset + (f" ({args.layers} layers)" if args.layers else "")
    if args.hf_only:
        for batch in (int(b) for b in args.batch.split(",")):
            try:
                row = bench_transformers(config_dir, batch, args.prompt, args.new, args.device)
            except Exception as err:  # the peer may lack this architecture or run out of memory
                row = {"impl": "transformers", "batch": batch, "error": repr(err)[:300]}
            print(json.dumps({"model": name, **{k: (round(v, 3) if isinstance(v, float) else v)
                                                for k, v in row.items()}}))
        return
    impl = dict(kv.split("=", 1) for kv in args.impl.split(",") if kv)
    model = random_model(config_dir, device=args.device, dtype="bf16", impl=impl or None,
                         kv_format=args.kv_format)
    weight_bytes = decode_weight_bytes(model)
    print(f"# {name}: {weight_bytes / 1e9:.3f} GB of weights per batch-1 decode step; "
          f"roofline {peak_bytes_s() / weight_bytes:,.0f} tok/s at batch 1", file=sys.stderr)
    print("# ops: " + ", ".join(f"{r['op']}={r['chosen']}" for r in model.ops.report()), file=sys.stderr)
    rows = []
    if args.profile:
        for batch in (int(b) for b in args.batch.split(",")):
            profile_steps(model, batch, args.profile_prompt)
    for batch in (int(b) for b in args.batch.split(",")):
        roof = batch * peak_bytes_s() / decode_weight_bytes(model, batch)
        modes = [False, True] if not args.no_eager else [True]
        if not getattr(model, "graph_decode", False):
            modes = [False]  # its decode reads host-side batch values: no graphs (yet)
        for graphs in modes:
            rows.append(bench_hwinfer(model, batch, args.prompt, args.new, graphs))
            if graphs and args.without_prefill_graphs and batch == 1 and getattr(model, "graph_prefill", False):
                rows.append(bench_hwinfer(model, batch, args.prompt, args.new, graphs, prefill_graphs=False))
        if not args.no_hf:
            try:
                rows.append(bench_transformers(config_dir, batch, args.prompt, args.new, args.device))
            except Exception as err:  # the peer may lack this architecture or run out of memory
                rows.append({"impl": "transformers", "batch": batch, "error": repr(err)[:300]})
        for row in rows:
            if row["batch"] == batch and "decode_tok_s" in row:
                row["decode_pct_roofline"] = 100 * row["decode_tok_s"] / roof
                row["roofline_tok_s"] = roof
    for row in rows:
        print(json.dumps({"model": name, **{k: (round(v, 3) if isinstance(v, float) else v)
                                            for k, v in row.items()}}))
    if args.csv:
        with open(args.csv, "a") as f:
            for row in rows:
                for metric in ("prefill_tok_s", "decode_tok_s", "ms_per_step", "graph_replay_ms",
                               "decode_pct_roofline"):
                    if metric in row:
                        f.write(f"{name},{row['impl']},{row['batch']},{metric},{row[metric]:.4g}\n")


if __name__ == "__main__":
    print(describe(("GB/s",)), file=sys.stderr)
    main()
