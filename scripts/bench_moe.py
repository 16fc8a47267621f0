"""Time the routed-expert FFN and the router on the GPU: portable torch vs Triton (reference too
with ``--reference``, small T only: it dequantizes every expert in fp32).

DeepSeek-V4-Flash expert shapes (MODELS.md §2): hidden H=4096, moe_intermediate I=2048, E=256
routed experts, top-6 (``--topk 8`` for the top-8 models), swiglu with limit 10; FP4 (packed
e2m1 + 1x32 UE8M0, the DSV4 expert format) and FP8 (e4m3 + 128x128 UE8M0 blocks); x bf16;
T in {1, 32, 512, 4096} tokens, routing uniformly random (k distinct experts per token).

Work per call: for T <= 32 the kernel is weight-bandwidth bound, so the figure is GB/s over
bytes = weights (+ scales) of the experts actually used + x + y, against the H200's 4,270 GB/s;
for larger T it is TFLOP/s over 2 * T*k * 3*H*I FLOPs against 780 TFLOP/s (bf16 dense: the
dequantized tiles feed bf16 tensor-core dots). The router (route_topk, DSV4: sqrtsoftplus +
bias, top-6 of 256, scaling 1.5) is reported in GB/s of logits read.

stdout: CSV ``op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak``; stderr: a readable table.

    python3 scripts/bench_moe.py [--quick] [--topk 8] [--reference]
"""
from __future__ import annotations

import argparse
import sys

import torch
import triton.testing

from hwinfer.kernels.torch import moe as torch_moe
from hwinfer.kernels.triton import moe_gemm, moe_route
from hwinfer.ops import moe as moe_ops
from hwinfer.ops import moe_experts as ref_moe

PEAK_GBS, PEAK_TFLOPS = 4270.0, 780.0
H, I, E = 4096, 2048, 256
DEV = "cuda"


def expert_weights(fmt: str, dev: str = DEV) -> dict:
    """Random quantized experts of DSV4-Flash size; finite codes, scales near 2^-6."""
    g = torch.Generator(device=dev).manual_seed(0)

    def ue8m0(*shape):
        return torch.randint(118, 124, shape, generator=g, device=dev, dtype=torch.uint8)

    if fmt == "fp4":
        return {"w13": torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, device=dev,
                                     dtype=torch.uint8).view(torch.int8),
                "w13_scale": ue8m0(E, 2 * I, H // 32),
                "w2": torch.randint(0, 256, (E, H, I // 2), generator=g, device=dev,
                                    dtype=torch.uint8).view(torch.int8),
                "w2_scale": ue8m0(E, H, I // 32)}

    def e4m3(*shape):  # exponent field <= 10 (|q| <= 15): no NaN codes, O(1) outputs
        b = torch.randint(0, 0x58, shape, generator=g, device=dev, dtype=torch.uint8)
        sign = torch.randint(0, 2, shape, generator=g, device=dev, dtype=torch.uint8) << 7
        return (b | sign).view(torch.float8_e4m3fn)

    return {"w13": e4m3(E, 2 * I, H), "w13_scale": ue8m0(E, 2 * I // 128, H // 128),
            "w2": e4m3(E, H, I), "w2_scale": ue8m0(E, H // 128, I // 128), "block": (128, 128)}


def routing(t: int, k: int, dev: str = DEV):
    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.rand(t, E, generator=g, device=dev).topk(k, dim=-1).indices.to(torch.int32)
    w = torch.rand(t, k, generator=g, device=dev) + 0.1
    return w / w.sum(-1, keepdim=True), ids


def moved_bytes(fmt: str, ids: torch.Tensor, wts: dict, x: torch.Tensor) -> int:
    used = torch.unique(ids[ids >= 0]).numel()
    per_expert = sum(wts[n][0].numel() * wts[n].element_size()
                     for n in ("w13", "w13_scale", "w2", "w2_scale"))
    return used * per_expert + 2 * x.numel() * x.element_size()


def emit(op, impl, shape, us, value, unit, peak) -> None:
    print(f"{op},{impl},{shape},{us:.1f},{value:.1f},{unit},{100 * value / peak:.1f}")
    print(f"  {op:<16} {impl:<10} {shape:<28} {us:10.1f} us {value:9.1f} {unit:<7} "
          f"{100 * value / peak:5.1f}% of peak", file=sys.stderr)


def bench_experts(fmt: str, t: int, k: int, with_reference: bool) -> None:
    wts = expert_weights(fmt)
    weights, ids = routing(t, k)
    x = torch.randn(t, H, device=DEV, dtype=torch.bfloat16)
    args = dict(x=x, weights=weights, ids=ids, activation="swiglu", limit=10.0, **wts)
    op = f"moe_experts_{fmt}"
    impls = [("torch", getattr(torch_moe, op)), ("triton", getattr(moe_gemm, op))]
    if with_reference and t <= 4:
        impls.insert(0, ("reference", getattr(ref_moe, op)))
    if fmt == "fp4" and DEV == "cuda" and torch.cuda.get_device_capability()[0] >= 10:
        impls.append(("triton_dot_scaled", moe_gemm.moe_experts_fp4_blackwell))
    check = impls[0][1](**args).float()
    shape = f"T{t}xk{k}xH{H}xI{I}xE{E}"
    for name, fn in impls:
        err = ((fn(**args).float() - check).abs().max() / check.abs().max()).item()
        ms = triton.testing.do_bench(lambda: fn(**args), warmup=10, rep=100)
        if t <= 32:
            gbs = moved_bytes(fmt, ids, wts, x) / ms / 1e6
            emit(op, name, shape, ms * 1e3, gbs, "GB/s", PEAK_GBS)
        else:
            emit(op, name, shape, ms * 1e3, 6 * t * k * H * I / ms / 1e9, "TFLOP/s", PEAK_TFLOPS)
        print(f"    max|{name} - {impls[0][0]}| / max|{impls[0][0]}| = {err:.3e}", file=sys.stderr)
    del wts
    if DEV == "cuda":
        torch.cuda.empty_cache()


def bench_router(t: int, k: int) -> None:
    logits = torch.randn(t, E, device=DEV, dtype=torch.bfloat16)
    bias = torch.randn(E, device=DEV) * 0.1
    args = dict(logits=logits, top_k=k, scoring="sqrtsoftplus", bias=bias, scaling=1.5)
    ref_w, ref_i = moe_ops.route_topk(**args)
    for name, fn in (("reference", moe_ops.route_topk), ("triton", moe_route.route_topk)):
        w, i = fn(**args)
        same = bool((i.sort(-1).values == ref_i.sort(-1).values).all())
        ms = triton.testing.do_bench(lambda: fn(**args), warmup=10, rep=100)
        moved = logits.numel() * 2 + t * k * 8
        emit("route_topk", name, f"T{t}xE{E}xk{k}", ms * 1e3, moved / ms / 1e6, "GB/s", PEAK_GBS)
        print(f"    ids match reference: {same}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T in {1, 512} only (< 60 s)")
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--reference", action="store_true", help="also time the reference (T=1)")
    a = ap.parse_args()
    tokens = (1, 512) if a.quick else (1, 32, 512, 4096)
    print(f"device: {torch.cuda.get_device_name()}", file=sys.stderr)
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    for fmt in ("fp4", "fp8"):
        for t in tokens:
            bench_experts(fmt, t, a.topk, a.reference)
    for t in tokens:
        bench_router(t, a.topk)


if __name__ == "__main__":
    main()
