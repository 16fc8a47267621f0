"""Time lightning_indexer on the GPU: reference vs portable torch vs Triton.

DeepSeek-V4-Flash CSA shapes (MODELS.md §2.7: index_n_heads 64, index_head_dim 128, index_topk
512, keys = compressed entries, bf16) and one GLM-5 DSA line (32 heads, top-2048, per-token keys):
  * decode: B requests, one query each, every request with C compressed entries of its own
    (C = 8k, 32k, 64k; 64k entries = 256k tokens at ratio 4). Memory-bound: bytes = keys read
    (B * C * 128 * 2) + q + scores scratch (written and read, fp32) -> GB/s vs the card's copy bandwidth.
  * prefill: a 2048-token chunk at the end of a C-entry prefix (token i sees C - 2048 + i + 1
    entries). Compute-bound: FLOPs = 2 * sum(visible) * 64 * 128 -> TFLOP/s vs its bf16 matmul rate.

stdout: CSV lines op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak; stderr: readable table
(``match`` = the Triton rows equal the torch impl's as sets).

    python3 scripts/bench_indexer.py [--quick] [--reference] [--sweep]
"""
from __future__ import annotations

import sys

import torch
import triton.testing

from hwinfer.backend import resolve_device, select
from hwinfer.ci.ceilings import describe, peak as ceiling
from hwinfer.kernels.torch.indexer import lightning_indexer as torch_impl
from hwinfer.kernels.triton.indexer import lightning_indexer as triton_impl
from hwinfer.ops.indexer import lightning_indexer as reference



def decode_inputs(batch: int, entries: int, heads: int = 64, dim: int = 128, topk: int = 512):
    dev = "cuda"
    offsets = torch.arange(batch + 1, device=dev, dtype=torch.int32) * entries
    return {"q": torch.randn(batch, heads, dim, device=dev, dtype=torch.bfloat16),
            "k": torch.randn(batch * entries, dim, device=dev, dtype=torch.bfloat16),
            "weights": torch.rand(batch, heads, device=dev, dtype=torch.bfloat16) * heads ** -0.5,
            "k_start": offsets[:-1].contiguous(), "k_end": offsets[1:].contiguous(),
            "topk": topk, "scale": dim ** -0.5}


def prefill_inputs(entries: int, chunk: int = 2048, heads: int = 64, dim: int = 128, topk: int = 512):
    dev = "cuda"
    return {"q": torch.randn(chunk, heads, dim, device=dev, dtype=torch.bfloat16),
            "k": torch.randn(entries, dim, device=dev, dtype=torch.bfloat16),
            "weights": torch.rand(chunk, heads, device=dev, dtype=torch.bfloat16) * heads ** -0.5,
            "k_start": torch.zeros(chunk, device=dev, dtype=torch.int32),
            "k_end": torch.arange(entries - chunk + 1, entries + 1, device=dev, dtype=torch.int32),
            "topk": topk, "scale": dim ** -0.5}


def same_sets(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.sort(dim=1).values == b.sort(dim=1).values).all(dim=1).float().mean().item()


def measure(shape: str, impls: list, inputs: dict, work: float, unit: str) -> None:
    base = impls[0][1](**inputs)
    for name, fn, kw in impls:
        try:
            out = fn(**inputs, **kw)
            ms = triton.testing.do_bench(lambda: fn(**inputs, **kw), warmup=5, rep=40)
        except Exception as exc:
            print(f"lightning_indexer {shape:<26} {name:<24} failed: {type(exc).__name__}: {str(exc)[:100]}",
                  file=sys.stderr)
            continue
        rate = work / ms / (1e6 if unit == "GB/s" else 1e9)
        peak = ceiling(unit)
        print(f"lightning_indexer,{name},{shape},{ms * 1e3:.1f},{rate:.1f},{unit},{100 * rate / peak:.1f}", flush=True)
        print(f"lightning_indexer {shape:<26} {name:<24} {ms * 1e3:10.1f} us {rate:8.1f} {unit} "
              f"({100 * rate / peak:5.1f}%)  rows matching torch {same_sets(out, base):.3f}",
              file=sys.stderr, flush=True)


def main() -> None:
    argv = sys.argv[1:]
    quick, with_ref, sweep = "--quick" in argv, "--reference" in argv, "--sweep" in argv
    dev = resolve_device("cuda")
    print(f"device: {dev.describe()}; chosen lightning_indexer: "
          f"{select(dev).chosen('lightning_indexer')}", file=sys.stderr)
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    tiles = [(f"triton n{bn} w{w}", dict(block_n=bn, num_warps=w)) for bn, w in
             ((32, 4), (64, 4), (64, 8), (128, 8))] if sweep else []
    cases = [(32, 8192), (128, 32768)] if quick else [(b, c) for b in (1, 32, 128) for c in (8192, 32768, 65536)]
    for batch, entries in cases:
        inputs = decode_inputs(batch, entries)
        maxlen = {"max_len": entries}  # the engine knows its bound: no host sync
        impls = [("torch", torch_impl, {}), ("triton", triton_impl, {}), ("triton max_len", triton_impl, maxlen)]
        if with_ref and batch <= 32:
            impls.append(("reference", reference, {}))
        impls += [(n, triton_impl, kw) for n, kw in tiles]
        moved = batch * entries * (128 * 2 + 8) + inputs["q"].nbytes
        measure(f"decode_B{batch}_C{entries}", impls, inputs, moved, "GB/s")
        del inputs
        torch.cuda.empty_cache()
    glm = decode_inputs(32, 65536, heads=32, topk=2048)
    measure("glm5_decode_B32_L65536_top2048", [("torch", torch_impl, {}), ("triton", triton_impl, {})],
            glm, 32 * 65536 * (128 * 2 + 8), "GB/s")
    del glm
    for entries in (8192,) if quick else (8192, 32768, 65536):
        inputs = prefill_inputs(entries)
        vis = (inputs["k_end"] - inputs["k_start"]).sum().item()
        impls = [("torch", torch_impl, {}), ("triton", triton_impl, {})] + [
            (n, triton_impl, kw) for n, kw in tiles]
        measure(f"prefill_T2048_C{entries}", impls, inputs, 2.0 * vis * 64 * 128, "TFLOP/s")
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    print(describe(), file=sys.stderr)
    main()
