"""Time sparse_mla_decode on the GPU: reference vs portable torch vs Triton, against HBM bandwidth.

DeepSeek-V4-Flash decode shapes (H=64, D=512, bf16, sinks, inverse RoPE on the last 64 channels):
the sliding-window ring (128 rows, ``kv_cache``) plus compressed entries (``extra_kv_cache``):
  * CSA-like: K = 128 window + 512 indexer picks (random distinct entries of the request)
  * HCA-like: K = 128 window + 8192 entries (every entry at 1M context with ratio 128)
plus one GLM-5-like absorbed-MLA line (D=576, v_dim=512, top-2048, no sinks, no extra rows).
Batch 1, 32, 128; one query token per request (S=1).

Bytes moved per call = gathered KV rows (every index is valid here: K * D * 2 per token, counted
once although head blocks re-read rows through L2) + q + o. GB/s = bytes / time, against the
H200's 4,270 GB/s. ``--sweep`` also times a few Triton tilings (block_h, num_warps, num_splits).

    python3 scripts/bench_sparse_mla.py [--sweep] [--no-reference]
"""
from __future__ import annotations

import sys

import torch
import triton.testing

from hwinfer.backend import resolve_device, select
from hwinfer.kernels.torch.sparse_mla import sparse_mla_decode as torch_impl
from hwinfer.kernels.triton.sparse_mla import sparse_mla_decode as triton_impl
from hwinfer.ops.sparse_mla import sparse_mla_decode as reference

PEAK_GBS = 4270.0
HEADS, WINDOW, ENTRIES, PAGE = 64, 128, 8192, 64


def dsv4_inputs(batch: int, picks: int | None, dtype=torch.bfloat16):
    """Ring rows of request b = slots b*WINDOW.., its entries = pages of its own ENTRIES entries;
    picks=None takes all entries in order (HCA), else `picks` random distinct ones (CSA)."""
    dev, d = "cuda", 512
    gen = torch.Generator(device="cpu").manual_seed(0)
    ring = torch.randn(batch, WINDOW, d, device=dev, dtype=dtype)
    store = torch.randn(batch * ENTRIES // PAGE, PAGE, d, device=dev, dtype=dtype)
    win = (torch.arange(batch)[:, None] * WINDOW + torch.arange(WINDOW)[None]).int()
    if picks is None:
        ent = torch.arange(ENTRIES).expand(batch, -1)
    else:
        ent = torch.stack([torch.randperm(ENTRIES, generator=gen)[:picks] for _ in range(batch)])
    ent = (torch.arange(batch)[:, None] * ENTRIES + ent).int()
    ang = torch.rand(batch, 1, 32, device=dev) * 6.28
    return {
        "q": torch.randn(batch, 1, HEADS, d, device=dev, dtype=dtype),
        "kv_cache": ring, "indices": win[:, None].to(dev),
        "sinks": torch.randn(HEADS, device=dev), "scale": d ** -0.5,
        "out_rope": (ang.cos(), ang.sin()),
        "extra_kv_cache": store, "extra_indices": ent[:, None].to(dev),
    }


def glm5_inputs(batch: int, topk: int = 2048, context: int = 65536, dtype=torch.bfloat16):
    dev, d = "cuda", 576
    gen = torch.Generator(device="cpu").manual_seed(0)
    cache = torch.randn(batch * context // PAGE, PAGE, d, device=dev, dtype=dtype)
    idx = torch.stack([torch.randperm(context, generator=gen)[:topk] + b * context for b in range(batch)])
    return {"q": torch.randn(batch, 1, HEADS, d, device=dev, dtype=dtype), "kv_cache": cache,
            "indices": idx[:, None].int().to(dev), "sinks": None, "scale": 256 ** -0.5, "v_dim": 512}


def nbytes(inputs: dict, out: torch.Tensor) -> int:
    q = inputs["q"]
    k = inputs["indices"].shape[-1] + (inputs["extra_indices"].shape[-1] if "extra_indices" in inputs else 0)
    rows = q.shape[0] * q.shape[1] * k * q.shape[-1] * q.element_size()
    return rows + q.numel() * q.element_size() + out.numel() * out.element_size()


def bench(label: str, inputs: dict, with_reference: bool, sweep: bool) -> None:
    ref = reference(**inputs) if with_reference else torch_impl(**inputs)
    moved = nbytes(inputs, ref)
    impls = [("torch", torch_impl, {}), ("triton", triton_impl, {})]
    if with_reference:
        impls.insert(0, ("reference", reference, {}))
    if sweep:
        for bh, warps in ((16, 4), (16, 8), (32, 4), (32, 8), (64, 8)):
            for splits in (None, 1, 4, 16):
                impls.append((f"triton bh{bh} w{warps} s{splits}", triton_impl,
                              {"block_h": bh, "num_warps": warps, "num_splits": splits}))
    for name, fn, kw in impls:
        try:
            out = fn(**inputs, **kw)
            err = (out.float() - ref.float()).abs().max().item()
            ms = triton.testing.do_bench(lambda: fn(**inputs, **kw), warmup=10, rep=60)
        except Exception as exc:  # a sweep tiling that does not fit (shared memory, registers)
            print(f"{label:<34} {name:<26} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        gbs = moved / ms / 1e6
        print(f"{label:<34} {name:<26} {ms * 1e3:10.1f} us {gbs:8.0f} GB/s "
              f"({100 * gbs / PEAK_GBS:5.1f}% of peak)  max|diff| {err:.2e}")


def main() -> None:
    sweep, with_reference = "--sweep" in sys.argv, "--no-reference" not in sys.argv
    dev = resolve_device("cuda")
    print(f"device: {dev.describe()}; chosen sparse_mla_decode: {select(dev).chosen('sparse_mla_decode')}")
    for batch in (1, 32, 128):
        for label, make in ((f"dsv4 CSA K=128+512   B={batch}", lambda: dsv4_inputs(batch, 512)),
                            (f"dsv4 HCA K=128+8192  B={batch}", lambda: dsv4_inputs(batch, None)),
                            (f"glm5 D576/512 K=2048 B={batch}", lambda: glm5_inputs(batch))):
            inputs = make()
            bench(label, inputs, with_reference, sweep)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
