"""Time the small-op Triton kernels on the GPU: reference vs portable torch vs Triton.

    python3 scripts/bench_small_ops.py [--quick] [--only greedy,sample]

Ops: mhc_pre / mhc_post (DeepSeek-V4-Flash, hidden 4096 x 4 streams, T in {1, 32, 4096}),
mhc_head, ihc_pre, ihc_post, kv_compress_step (CSA D 512 m 4, HCA D 512 m 128), rms_norm_rope
(Qwen3.5 q and DeepSeek-V4 q), sample (vocab 248,320, B in {1, 32, 256}; greedy, temperature,
top-k 50 + top-p 0.9; the Triton sampler also as CUDA-graph replays), greedy_tokens (fp32 logits as the models give them, vocab 248,320, B in {1,
32}; timed as CUDA-graph replays, as the decode graphs run it). All are bandwidth bound: the bytes are those an ideal kernel moves once
(inputs read, outputs written), reported as GB/s against the card's copy bandwidth. sample's bytes
are one read of the logits (the kernel makes several passes over each row, L2-hot at best).

stdout: CSV ``op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak``; stderr: a readable table.
"""
from __future__ import annotations

import argparse
import sys

import torch
import triton.testing

from hwinfer.ci.ceilings import copy_gbps, describe
from hwinfer.kernels.torch import compressor as tc, hyper_connection as th, norm as tn
from hwinfer.kernels.triton import compressor as kc, mhc as km, norm_rope as knr
from hwinfer.kernels.triton import sample_split as kss, sampling as ks
from hwinfer.ops import compressor as rc, hyper_connection as rh, norm as rn, sampling as rs
from hwinfer.ops.rope import rope_tables

DEV = "cuda"


def _bench(op, shape, nbytes, impls, args, kwargs, check=True, graph=False):
    """Time each impl; the first one's outputs are the baseline of the max|diff| column
    (for integer outputs: the number of differing entries)."""
    ref = None
    for name, fn in impls:
        out = fn(*args, **kwargs)
        out = out if isinstance(out, tuple) else (out,)
        note = ""
        if check:
            if ref is None:
                ref = out
            else:
                diff = max(((a.float() - b.float()).abs().max().item() if a.is_floating_point()
                            else float((a != b).sum().item())) for a, b in zip(ref, out))
                note = f"max|diff| {diff:.2e}"
        if graph:
            ms = triton.testing.do_bench_cudagraph(lambda: fn(*args, **kwargs), rep=100)
        else:
            ms = triton.testing.do_bench(lambda: fn(*args, **kwargs), warmup=25, rep=100)
        us, gbps = ms * 1e3, nbytes / ms / 1e6
        print(f"{op},{name},{shape},{us:.2f},{gbps:.1f},GB/s,{100 * gbps / copy_gbps():.1f}")
        print(f"{op:<17} {shape:<28} {name:<10} {us:9.1f} us {gbps:8.0f} GB/s "
              f"{100 * gbps / copy_gbps():5.1f}%  {note}", file=sys.stderr)


def _rand(*shape, dtype=torch.bfloat16, scale=1.0):
    return torch.randn(*shape, device=DEV, dtype=torch.float32).mul_(scale).to(dtype)


def bench_hc(tokens):
    n, h, rows = 4, 4096, 24
    for t in tokens:
        x = _rand(t, n, h)
        fn = _rand(rows, n * h, dtype=torch.float32, scale=(n * h) ** -0.5)
        base, scale = _rand(rows, dtype=torch.float32, scale=0.5), _rand(3, dtype=torch.float32) + 1
        xb, fb = x.numel() * 2, fn.numel() * 4
        kw = {"norm_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20}
        _bench("mhc_pre", f"T{t}xN4xH4096 bf16", xb + fb + t * h * 2 + t * 20 * 4,
               (("reference", rh.mhc_pre), ("torch", th.mhc_pre), ("triton", km.mhc_pre)),
               (x, fn, base, scale), kw)
        y = _rand(t, h)
        post = torch.rand(t, n, device=DEV) * 2
        comb = torch.softmax(_rand(t, n, n, dtype=torch.float32), -1)
        _bench("mhc_post", f"T{t}xN4xH4096 bf16", 2 * xb + t * h * 2,
               (("reference", rh.mhc_post), ("torch", th.mhc_post), ("triton", km.mhc_post)),
               (y, x, post, comb), {})
        _bench("ihc_post", f"T{t}xN4xH4096 bf16", 2 * xb + t * h * 2,
               (("reference", rh.ihc_post), ("torch", th.ihc_post), ("triton", km.ihc_post)),
               (y, x, post), {})
        hk = {"norm_eps": 1e-6, "hc_eps": 1e-6}
        _bench("mhc_head", f"T{t}xN4xH4096 bf16", xb + fn[:n].numel() * 4 + t * h * 2,
               (("reference", rh.mhc_head), ("torch", th.mhc_head), ("triton", km.mhc_head)),
               (x, fn[:n].contiguous(), base[:n].contiguous(), scale[:1].contiguous()), hk)
        _bench("ihc_pre", f"T{t}xN4xH4096 bf16", xb + fn[:2 * n].numel() * 4 + t * h * 2,
               (("reference", rh.ihc_pre), ("torch", th.ihc_pre), ("triton", km.ihc_pre)),
               (x, fn[:2 * n].contiguous(), base[:2 * n].contiguous(), scale[:2].contiguous()),
               hk)


def bench_compress(batches):
    for name, c, d, m, ring in (("csa", 2, 512, 4, 8), ("hca", 1, 512, 128, 128)):
        for b in batches:
            pos = torch.randint(0, 100 * m, (b,), device=DEV)
            pos[: b // 2] = (pos[: b // 2] // m) * m + m - 1      # half the requests emit
            kv, score = _rand(b, c * d, dtype=torch.float32), _rand(b, c * d, dtype=torch.float32)
            skv = _rand(b, ring, c * d, dtype=torch.float32)
            ssc = _rand(b, ring, c * d, dtype=torch.float32)
            ape, w = _rand(m, c * d, dtype=torch.float32), _rand(d, dtype=torch.float32) + 1
            cos, sin = rope_tables((pos // m) * m, rotary_dim=64, base=160000.0)
            kw = {"ratio": m, "overlap": c == 2, "eps": 1e-6, "rope": (cos, sin), "rope_dim": 64}
            # The contract returns full state copies: read + write both rings dominates.
            nbytes = 4 * skv.numel() * 4 + 2 * kv.numel() * 4 + b * d * 4
            _bench("kv_compress_step", f"{name} B{b} D{d} m{m} R{ring}", nbytes,
                   (("reference", rc.kv_compress_step), ("torch", tc.kv_compress_step),
                    ("triton", kc.kv_compress_step)),
                   (kv, score, pos, skv, ssc, ape, w), kw)


def bench_norm_rope(tokens):
    cases = (("qwen35_q", 16, 256, 64, 0, False, 1.0), ("dsv4_q", 64, 512, 64, 448, True, 0.0))
    for name, heads, d, rot, start, inter, off in cases:
        for t in tokens:
            x = _rand(t, heads, d)
            w = _rand(d, dtype=torch.float32, scale=0.1) + (0 if off else 1)
            cos, sin = rope_tables(torch.randint(0, 8192, (t,), device=DEV), rotary_dim=rot,
                                   base=1e7)
            kw = {"eps": 1e-6, "weight_offset": off, "start": start, "interleaved": inter}
            _bench("rms_norm_rope", f"{name} T{t}xH{heads}xD{d} bf16", 2 * x.numel() * 2,
                   (("reference", rn.rms_norm_rope), ("torch", tn.rms_norm_rope),
                    ("triton", knr.rms_norm_rope)),
                   (x, w, cos, sin), kw)


def bench_sample(batches):
    v = 248320
    for b in batches:
        logits = _rand(b, v, scale=3.0)
        seeds = torch.randint(0, 2**62, (b,), device=DEV)
        steps = torch.randint(0, 4096, (b,), device=DEV)
        for mode, temp, k, p in (("greedy", 0.0, 0, 1.0), ("temperature", 0.8, 0, 1.0),
                                 ("topk50_topp0.9", 0.8, 50, 0.9)):
            args = (logits, torch.full((b,), temp, device=DEV),
                    torch.full((b,), k, device=DEV, dtype=torch.int32),
                    torch.full((b,), p, device=DEV), seeds, steps)
            _bench("sample", f"{mode} B{b} V{v} bf16", logits.numel() * 2,
                   (("reference", rs.sample), ("triton", kss.sample)), args, {})
            # its ten launches as a graph replay: the GPU's time without the host's launches
            # (the reference syncs, so it cannot be captured)
            _bench("sample", f"{mode} B{b} V{v} bf16", logits.numel() * 2,
                   (("triton graph", kss.sample),), args, {}, graph=True)


def bench_greedy(batches):
    v = 248320
    for b in batches:
        logits = _rand(b, v, dtype=torch.float32, scale=3.0)
        out = torch.empty(b, dtype=torch.int64, device=DEV)
        _bench("greedy_tokens", f"B{b} V{v} fp32", logits.numel() * 4,
               (("reference", rs.greedy_tokens), ("triton", ks.greedy_tokens)), (logits, out), {},
               graph=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few shapes, < 60 s")
    groups = ("hc", "compress", "norm_rope", "sample", "greedy")
    parser.add_argument("--only", default=",".join(groups), help=f"some of {','.join(groups)}")
    args = parser.parse_args()
    quick, only = args.quick, args.only.split(",")
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    print(f"device: {torch.cuda.get_device_name()}", file=sys.stderr)
    if "hc" in only:
        bench_hc((1, 4096) if quick else (1, 32, 4096))
    if "compress" in only:
        bench_compress((32,) if quick else (1, 32, 256))
    if "norm_rope" in only:
        bench_norm_rope((32,) if quick else (1, 32, 4096))
    if "sample" in only:
        bench_sample((1, 256) if quick else (1, 32, 256))
    if "greedy" in only:
        bench_greedy((1, 32))


if __name__ == "__main__":
    print(describe(("GB/s",)), file=sys.stderr)
    main()
