"""Time the varlen prefill `attention` op on the GPU: Triton against the torch impl (one SDPA
call per sequence, flash / efficient backends) and the bf16 tensor-core roofline.

Shapes (bf16, real head counts and dims of the models that call the op in prefill):
  qwen3.5   Hq 8,  Hkv 2, D 256, sigmoid gate (Qwen3.5-0.8B full-attention layers)
  gemma4    Hq 8,  Hkv 4, D 256, sliding window 512
  kimi-mla  Hq 32, Hkv 32, Dk 192, Dv 128 (Kimi-Linear MLA, non-absorbed)
  dsv4-swa  Hq 64, Hkv 1, D 512, V = K, window 128, sinks (DeepSeek-V4 sliding layers)
each at 1 x 1,024, 1 x 8,192 and 32 sequences of 512 .. 1,536 tokens (mean 1,024).
FLOPs per call = 2 * (Dk + Dv) * Hq * (query, key) pairs visible under the mask; roofline: the
card's measured bf16 matmul rate (hwinfer/ci/ceilings.py; ~780 TFLOP/s on the H200, device/H200.md).
Error: max |Triton - torch| where the torch impl runs (on CUDA it
refuses sinks; the conformance suite checks those cases against the reference).

stdout: CSV `op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak`; stderr: a readable table.

    python3 scripts/bench_attention.py [--quick] [--sweep]

``--sweep`` also times the Triton kernel at other tile shapes (BM, BN, warps) per head dim, as
rows "triton BMxBN wW" (the module's TILES table is the default).
"""
from __future__ import annotations

import sys

import torch
import triton.testing

import hwinfer.kernels.triton.attention as triton_module

from hwinfer.ci.ceilings import describe, matmul_tflops
from hwinfer.kernels.torch.attention import attention as torch_attention
from hwinfer.kernels.torch.attention import check_attention_impl
from hwinfer.kernels.triton.attention import attention as triton_attention

MODELS = {  # name: (Hq, Hkv, Dk, Dv or None for V = K, window, sinks, gate)
    "qwen3.5": (8, 2, 256, 256, None, False, True),
    "gemma4": (8, 4, 256, 256, 512, False, False),
    "kimi-mla": (32, 32, 192, 128, None, False, False),
    "dsv4-swa": (64, 1, 512, None, 128, True, False),
}


def lengths(kind: str) -> list[int]:
    if kind == "1x1024":
        return [1024]
    if kind == "1x8192":
        return [8192]
    gen = torch.Generator().manual_seed(0)
    return torch.randint(512, 1537, (32,), generator=gen).tolist()


def visible_pairs(lens: list[int], window: int | None) -> int:
    total = 0
    for n in lens:
        if window is None:
            total += n * (n + 1) // 2
        else:
            w = min(window, n)
            total += w * (w + 1) // 2 + (n - w) * w
    return total


SWEEP = {128: [(128, 64, 8, None), (64, 64, 4, None), (128, 32, 4, None)],
         256: [(64, 64, 8, None), (64, 32, 8, None), (64, 32, 4, None)],
         512: [(16, 32, 4, None), (32, 32, 8, None), (32, 16, 8, None)]}


def bench(model: str, kind: str, sweep: bool = False) -> None:
    hq, hkv, dk, dv, window, sinks, gate = MODELS[model]
    lens = lengths(kind)
    t = sum(lens)
    dev, dt = "cuda", torch.bfloat16
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    args = dict(q=torch.randn(t, hq, dk, device=dev, dtype=dt),
                k=torch.randn(t, hkv, dk, device=dev, dtype=dt),
                v=None if dv is None else torch.randn(t, hkv, dv, device=dev, dtype=dt),
                cu_seqlens_q=cu, cu_seqlens_k=cu, scale=dk ** -0.5, window=window,
                sinks=torch.randn(hq, device=dev) if sinks else None,
                gate=torch.randn(t, hq, dv or dk, device=dev, dtype=dt) if gate else None)
    flops = 2 * (dk + (dv or dk)) * hq * visible_pairs(lens, window)
    shape = f"{model}:{kind}"
    out = triton_attention(**args)
    impls = [("triton", lambda: triton_attention(**args))]
    if check_attention_impl(**args) is None:
        impls.append(("torch_sdpa", lambda: torch_attention(**args)))
    if sweep:
        key = max(64, triton.next_power_of_2(dk), triton.next_power_of_2(dv or dk))
        for tiles in SWEEP.get(key, []):
            def variant(tiles=tiles, key=key):
                table = triton_module.TILES["cuda", 2]   # bf16 operands on NVIDIA
                saved = table[key]
                table[key] = tiles
                try:
                    return triton_attention(**args)
                finally:
                    table[key] = saved
            impls.append((f"triton {tiles[0]}x{tiles[1]} w{tiles[2]}", variant))
    # Each impl's max |difference| from the torch impl where it runs, else from the default
    # Triton kernel (the conformance suite checks that one against the reference).
    base = impls[1][1]() if len(impls) > 1 and impls[1][0] == "torch_sdpa" else out
    for name, fn in impls:
        try:
            err = (fn().float() - base.float()).abs().max().item()
            ms = triton.testing.do_bench(fn, warmup=10, rep=100)
        except Exception as exc:  # noqa: BLE001 (an OOM or a failed tiling: reported, not fatal)
            print(f"{shape:<22} {name:<18} failed: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            continue
        tf = flops / ms / 1e9
        print(f"attention,{name},{shape},{ms * 1e3:.1f},{tf:.1f},TFLOP/s,{100 * tf / matmul_tflops():.1f}",
              flush=True)
        print(f"{shape:<22} {name:<18} {ms * 1e3:10.1f} us {tf:8.1f} TFLOP/s "
              f"({100 * tf / matmul_tflops():5.1f}%)  max|diff| {err:.2e}", file=sys.stderr, flush=True)


def main() -> None:
    quick, sweep = "--quick" in sys.argv, "--sweep" in sys.argv
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    kinds = ["1x1024", "32xvar"] if quick else ["1x1024", "1x8192", "32xvar"]
    for model in MODELS:
        for kind in kinds:
            bench(model, kind, sweep)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    print(describe(("TFLOP/s",)), file=sys.stderr)
    main()
