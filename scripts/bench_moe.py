"""Time the routed-expert FFN and the router on the GPU: portable torch vs Triton (reference too
with ``--reference``, small T only: it dequantizes every expert in fp32).

DeepSeek-V4-Flash expert shapes (MODELS.md §2): hidden H=4096, moe_intermediate I=2048, E=256
routed experts, top-6 (``--topk 8`` for the top-8 models), swiglu with limit 10; FP4 (packed
e2m1 + 1x32 UE8M0, the DSV4 expert format) and FP8 (e4m3 + 128x128 UE8M0 blocks); x bf16;
T in {1, 32, 512, 4096} tokens, routing uniformly random (k distinct experts per token).

Work per call: for T <= 32 the kernel is weight-bandwidth bound, so the figure is GB/s over
bytes = weights (+ scales) of the experts actually used + x + y, against the card's copy bandwidth;
for larger T it is TFLOP/s over 2 * T*k * 3*H*I FLOPs against its bf16 matmul rate (dense: the
dequantized tiles feed bf16 tensor-core dots). The router (route_topk, DSV4: sqrtsoftplus +
bias, top-6 of 256, scaling 1.5) is reported in GB/s of logits read.

``--latent`` times Kimi-K3's latent MoE instead (MODELS.md §4.5: H=7168 -> latent L=3584,
E=896 packed-FP4 experts of I=3072, top-16, situ; x bf16), the whole op (both projections, the
experts, the norm), FLOPs 2 * T * (2*H*L + k * 3*L*I).

``--variant NAME@ATTR=VALUE[;ATTR=VALUE...]`` (repeatable) also times the Triton impl with
module switches of hwinfer.kernels.triton.moe_gemm set (FP4_GROUPS=0, A_PAIRS=0,
TILE_OVERRIDE=16x64x128x4 as BM x BN x BK x warps, NUM_STAGES=4, DECODE_FORM=gemv,
GEMV_TILE=4x512x4, GEMV_MAX_PAIRS=256), restored afterwards.

stdout: CSV ``op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak``; stderr: a readable table.

    python3 scripts/bench_moe.py [--quick] [--topk 8] [--reference] [--tokens 1,512]
        [--formats fp4,fp8] [--no-torch] [--latent] [--variant NAME@ATTR=VALUE;...]
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import triton.testing

from hwinfer.ci.ceilings import copy_gbps, describe, matmul_tflops
from hwinfer.kernels.torch import moe as torch_moe
from hwinfer.kernels.triton import moe_gemm, moe_route
from hwinfer.ops import moe as moe_ops
from hwinfer.ops import moe_experts as ref_moe

H, I, E = 4096, 2048, 256
LATENT = (7168, 3584, 3072, 896, 16)  # Kimi-K3: H, latent L, expert I, E, top-k
DEV = "cuda"


def expert_weights(fmt: str, dev: str = DEV) -> dict:
    """Random quantized experts of DSV4-Flash size; finite codes, scales near 2^-6."""
    g = torch.Generator(device=dev).manual_seed(0)

    def ue8m0(*shape):
        return torch.randint(118, 124, shape, generator=g, device=dev, dtype=torch.uint8)

    if fmt == "bf16":  # dense experts (12.9 GB at this size)
        return {"w13": torch.randn(E, 2 * I, H, generator=g, device=dev, dtype=torch.bfloat16) / 64,
                "w2": torch.randn(E, H, I, generator=g, device=dev, dtype=torch.bfloat16) / 64}
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
                     for n in ("w13", "w13_scale", "w2", "w2_scale") if n in wts)
    return used * per_expert + 2 * x.numel() * x.element_size()


def emit(op, impl, shape, us, value, unit, peak) -> None:
    print(f"{op},{impl},{shape},{us:.1f},{value:.1f},{unit},{100 * value / peak:.1f}")
    print(f"  {op:<16} {impl:<10} {shape:<28} {us:10.1f} us {value:9.1f} {unit:<7} "
          f"{100 * value / peak:5.1f}% of peak", file=sys.stderr)


@contextlib.contextmanager
def switches(items: dict):
    """moe_gemm's module switches set for the duration (see --variant)."""
    old = {name: getattr(moe_gemm, name) for name in items}
    for name, value in items.items():
        setattr(moe_gemm, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(moe_gemm, name, value)


BOOL_SWITCHES = {"SWAP_AB", "FP4_GROUPS", "A_PAIRS"}  # None (auto) by default, 0 / 1 in a variant


def parse_variant(spec: str) -> tuple[str, dict]:
    """"name@FP4_GROUPS=0;TILE_OVERRIDE=16x64x128x4" -> (name, {switch: value})."""
    name, _, rest = spec.partition("@")
    items = {}
    for item in filter(None, (i.strip() for i in rest.split(";"))):
        key, _, value = item.partition("=")
        if not hasattr(moe_gemm, key):
            raise SystemExit(f"--variant {spec!r}: moe_gemm has no switch {key!r}")
        now = getattr(moe_gemm, key)
        items[key] = (tuple(int(v) for v in value.split("x")) if "x" in value
                      else value if isinstance(now, str) else bool(int(value))
                      if isinstance(now, bool) or key in BOOL_SWITCHES else int(value))
    return name, items


def time_impls(op, shape, impls, args, bytes_moved, flops, variants) -> None:
    """Time each impl (and the Triton impl under each variant) on the same args; the first impl
    is the check. bytes_moved given: GB/s (decode sizes), else TFLOP/s."""
    runs = [(name, fn, {}) for name, fn in impls]
    runs += [(f"triton[{vname}]", dict(impls)["triton"], items) for vname, items in variants]
    check = None
    for name, fn, items in runs:
        with switches(items):
            out = fn(**args).float()
            check = out if check is None else check
            err = ((out - check).abs().max() / check.abs().max()).item()
            ms = triton.testing.do_bench(lambda: fn(**args), warmup=10, rep=100)
        if bytes_moved:
            emit(op, name, shape, ms * 1e3, bytes_moved / ms / 1e6, "GB/s", copy_gbps())
        else:
            emit(op, name, shape, ms * 1e3, flops / ms / 1e9, "TFLOP/s", matmul_tflops())
        print(f"    max|{name} - {runs[0][0]}| / max|{runs[0][0]}| = {err:.3e}", file=sys.stderr)


def bench_experts(fmt: str, t: int, k: int, with_reference: bool, with_torch: bool = True,
                  variants=()) -> None:
    wts = expert_weights(fmt)
    weights, ids = routing(t, k)
    x = torch.randn(t, H, device=DEV, dtype=torch.bfloat16)
    args = dict(x=x, weights=weights, ids=ids, activation="swiglu", limit=10.0, **wts)
    op = "moe_experts" if fmt == "bf16" else f"moe_experts_{fmt}"
    impls = [("torch", getattr(torch_moe, op))] * with_torch + [("triton", getattr(moe_gemm, op))]
    if with_reference and t <= 4:
        impls.insert(0, ("reference", getattr(ref_moe, op)))
    if fmt == "fp4" and DEV == "cuda" and torch.cuda.get_device_capability()[0] >= 10:
        impls.append(("triton_dot_scaled", moe_gemm.moe_experts_fp4_blackwell))
    moved = moved_bytes(fmt, ids, wts, x) if t <= 32 else 0
    time_impls(op, f"T{t}xk{k}xH{H}xI{I}xE{E}", impls, args, moved, 6 * t * k * H * I, variants)
    del wts
    if DEV == "cuda":
        torch.cuda.empty_cache()


def bench_latent(t: int, variants=()) -> None:
    """Kimi-K3's latent MoE at its real size (packed FP4 experts, UE8M0 scales)."""
    hk, lat, ik, ek, kk = LATENT
    g = torch.Generator(device=DEV).manual_seed(0)

    def packed(*shape):
        return torch.randint(0, 256, shape, generator=g, device=DEV, dtype=torch.uint8)

    def ue8m0(*shape):  # ~unit outputs: e2m1 values are O(1), fan-in of L or I
        return torch.randint(119, 122, shape, generator=g, device=DEV, dtype=torch.uint8)

    ids = torch.rand(t, ek, generator=g, device=DEV).topk(kk, dim=-1).indices.to(torch.int32)
    w = torch.rand(t, kk, generator=g, device=DEV) + 0.1
    args = dict(x=torch.randn(t, hk, device=DEV, dtype=torch.bfloat16),
                weights=w / w.sum(-1, keepdim=True), ids=ids,
                down_proj=(torch.randn(lat, hk, device=DEV) * hk ** -0.5).to(torch.bfloat16),
                w13=packed(ek, 2 * ik, lat // 2), w2=packed(ek, lat, ik // 2),
                up_proj=(torch.randn(hk, lat, device=DEV) * lat ** -0.5).to(torch.bfloat16),
                norm_weight=torch.ones(lat, device=DEV), w13_scale=ue8m0(ek, 2 * ik, lat // 32),
                w2_scale=ue8m0(ek, lat, ik // 32), activation="situ", situ_beta=1.0,
                situ_linear_beta=10.0)
    used = torch.unique(ids).numel()
    moved = (used * (2 * ik * lat // 2 + lat * ik // 2) * 17 // 16 + 2 * 2 * hk * lat) if t <= 32 else 0
    flops = 2 * t * (2 * hk * lat + kk * 3 * lat * ik)
    time_impls("latent_moe", f"T{t}xk{kk}xH{hk}xL{lat}xI{ik}xE{ek}",
               [("triton", moe_gemm.latent_moe)], args, moved, flops, variants)
    del args
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
        emit("route_topk", name, f"T{t}xE{E}xk{k}", ms * 1e3, moved / ms / 1e6, "GB/s", copy_gbps())
        print(f"    ids match reference: {same}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T in {1, 512} only (< 60 s)")
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--reference", action="store_true", help="also time the reference (T=1)")
    ap.add_argument("--tokens", help="comma-separated T (default 1,32,512,4096; --quick 1,512)")
    ap.add_argument("--formats", default="fp4,fp8", help="of fp4, fp8, bf16")
    ap.add_argument("--no-torch", action="store_true", help="skip the portable torch impl")
    ap.add_argument("--latent", action="store_true", help="Kimi-K3's latent MoE only")
    ap.add_argument("--variant", action="append", default=[], help="NAME@ATTR=VALUE;...")
    a = ap.parse_args()
    tokens = (1, 512) if a.quick else (1, 32, 512, 4096)
    tokens = tuple(int(t) for t in a.tokens.split(",")) if a.tokens else tokens
    variants = [parse_variant(v) for v in a.variant]
    print(f"device: {torch.cuda.get_device_name()}", file=sys.stderr)
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    if a.latent:
        for t in tokens:
            bench_latent(t, variants)
    else:
        for fmt in a.formats.split(","):
            for t in tokens:
                bench_experts(fmt, t, a.topk, a.reference, not a.no_torch, variants)
        for t in tokens:
            bench_router(t, a.topk)
    compiled_stats()


def compiled_stats() -> None:
    """Registers and spills of every compiled variant of the expert GEMMs, to stderr."""
    from hwinfer.kernels.triton import compiled_report

    for kernel in (moe_gemm._gemm1_kernel, moe_gemm._gemm2_kernel, moe_gemm._mm_kernel):
        for line in compiled_report(kernel):
            print(f"#   {line}", file=sys.stderr)


if __name__ == "__main__":
    print(describe(), file=sys.stderr)
    main()
