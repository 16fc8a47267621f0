"""Time gdn_chunked / kda_chunked prefill on the GPU: Triton chunked kernels vs fla-core's
chunk_gated_delta_rule / chunk_kda (when importable) vs the portable torch impl (vs the
reference only on the smallest shape: it loops over chunks and rows in Python).

Shapes: Qwen3.5-0.8B GDN (Hk = Hv = 16, Dk = Dv = 128) and Kimi-Linear KDA (H = 32, D = 128);
prefill of 1 x 4k, 1 x 16k and 8 x 2k tokens (the latter packed with cu_seqlens, as the engine
batches prefills). q/k/v bf16, g/beta fp32, a given fp32 initial state, final state returned.

FLOPs per chunk of C = 64 tokens and head (Dk = Dv = D), counted as 2 per multiply-add:
A = K K^T (2 C^2 D), w and u (2 x 2 C^2 D), deltas u - w S (2 C D^2), state update
(2 C D^2), output q S (2 C D^2) + causal q k^T and P d (2 x 2 C^2 D): 10 C^2 D + 6 C D^2.
TFLOP/s against the card's measured bf16 matmul rate (~780 on the H200) says little about such a latency-bound,
fp32-heavy op; tokens/s and microseconds are the numbers to compare.

Prints one CSV line per measurement on stdout (op,impl,shape,us,gbps_or_tflops,unit,
pct_of_peak) and a readable table with tokens/s and errors on stderr. ``--quick``: 1 x 4k only.
``--variant NAME@ITEM[;ITEM...]`` (repeatable) adds the Triton impl called with keyword arguments
(``KW=VALUE``) and module constants set (``MODULE:ATTR=VALUE``), e.g. ``"ob32s@block_k_out=32;
hwinfer.kernels.triton.delta_chunk:STATE_DOTS='bf16'"``;
``--set MODULE:ATTR=VALUE`` (repeatable) sets one for the whole run (the breakdown included).
"""
from __future__ import annotations

import argparse
import ast
import sys

import torch
import triton.testing

from hwinfer.ci.ceilings import describe, matmul_tflops
from hwinfer.kernels.torch import linear_attention as torch_la
from hwinfer.kernels.triton import delta_chunk as triton_la
from hwinfer.kernels.triton import delta_rule
from hwinfer.ops import linear_attention as ref_la
from kernel_regs import constants, set_constant

C = 64

try:  # fla-core is on the machine only if the lead carried its wheel there
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda
    FLA = True
except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
    print(f"fla not available ({type(exc).__name__}: {str(exc)[:120]})", file=sys.stderr)
    FLA = False


def make(kind: str, nseq: int, seqlen: int):
    hk, hv, d = (16, 16, 128) if kind == "gdn" else (32, 32, 128)
    T = nseq * seqlen
    g_shape = (1, T, hv) if kind == "gdn" else (1, T, hv, d)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    inputs = {
        "q": torch.randn(1, T, hk, d, **bf), "k": torch.randn(1, T, hk, d, **bf),
        "v": torch.randn(1, T, hv, d, **bf),
        "g": -torch.rand(*g_shape, device="cuda") * 2 - 0.01,
        "beta": torch.rand(1, T, hv, device="cuda") * 0.9 + 0.05,
        "initial_state": torch.randn(nseq, hv, d, d, device="cuda") * 0.1,
    }
    if nseq > 1:
        inputs["cu_seqlens"] = torch.arange(0, T + 1, seqlen, device="cuda", dtype=torch.int32)
    chunks = nseq * triton.cdiv(seqlen, C)
    flops = chunks * hv * (10 * C * C * d + 6 * C * d * d)
    return inputs, flops, T


def fla_call(kind: str):
    fn = fla_gdn if kind == "gdn" else fla_kda

    def call(q, k, v, g, beta, initial_state, cu_seqlens=None):
        # fla wants cu_seqlens as int64 (LongTensor); g is the log-decay as ours.
        cu = cu_seqlens.long() if cu_seqlens is not None else None
        return fn(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                  output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return call


def variant(fn, items: list[str]):
    """fn with keyword arguments (KW=VALUE) and module constants (MODULE:ATTR=VALUE) of items."""
    consts = [i for i in items if ":" in i.split("=", 1)[0]]
    kw = {k.strip(): ast.literal_eval(v) for k, v in
          (i.split("=", 1) for i in items if i not in consts)}

    def call(*args, **kwargs):
        # (no AOT spec rebuild: host time inside the timed call; docs/kernels.md, 32nd session)
        with constants(consts, rebuild=False):
            return fn(*args, **kwargs, **kw)
    return call


def rel_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def breakdown(label: str, fn) -> None:
    """Per-kernel GPU time of one call (after a warm call), to stderr."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    for e in sorted((e for e in prof.key_averages() if e.device_type.name == "CUDA"),
                    key=lambda e: -e.self_device_time_total)[:8]:
        print(f"#   {label}: {e.self_device_time_total:9.1f} us  x{e.count}  {e.key[:60]}",
              file=sys.stderr)


def compiled_stats() -> None:
    """Registers and spills of every compiled variant of the chunked kernels, to stderr."""
    from hwinfer.kernels.triton import compiled_report, delta_chunk_wy

    for kernel in (delta_chunk_wy._wy_kernel, delta_chunk_wy._kda_diag_kernel,
                   triton_la._wy_blocked_kernel, triton_la._state_kernel, triton_la._out_kernel,
                   triton_la._out_blocked_kernel):
        for line in compiled_report(kernel):
            print(f"#   {line}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1 x 4k only (< 60 s)")
    parser.add_argument("--no-variants", action="store_true",
                        help="skip the block-size variants of the Triton kernels")
    parser.add_argument("--shapes", default=None, help="e.g. 1x16384,8x2048 (default: all)")
    parser.add_argument("--kinds", default="gdn,kda")
    parser.add_argument("--no-torch", action="store_true", help="skip the portable torch impl")
    parser.add_argument("--no-fla", action="store_true", help="skip fla (its first calls autotune)")
    parser.add_argument("--breakdown", action="store_true",
                        help="GPU time of each kernel of the Triton impl and of each --variant "
                             "(torch profiler)")
    parser.add_argument("--variant", action="append", default=[],
                        metavar="NAME@ITEM[;ITEM...]", help="ITEM: KW=VALUE or MODULE:ATTR=VALUE")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE:ATTR=VALUE")
    args = parser.parse_args()
    for item in args.set:
        set_constant(item)
    shapes = [(1, 4096)] if args.quick else [(1, 4096), (1, 16384), (8, 2048)]
    if args.shapes:
        shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    for kind in args.kinds.split(","):
        op = f"{kind}_chunked"
        tri = getattr(triton_la, op)
        impls = [("triton", tri)]
        if not (args.quick or args.no_variants):
            # state value blocks / output value blocks / warps of every stage; the WY stage whole
            for name, kw in (("bv16", dict(block_v=16)), ("bv16_w4", dict(block_v=16, num_warps=4)),
                             ("w4", dict(num_warps=4)), ("bv16_bvo128", dict(block_v=16, block_v_out=128)),
                             ("whole_wy", dict(block_k=0)), ("bvo128", dict(block_v_out=128)),
                             ("bvo128_w8", dict(block_v_out=128, num_warps=8)),
                             ("out_bf16", dict(dots="bf16")),
                             ("out_bf16_bvo128", dict(dots="bf16", block_v_out=128))):
                impls.append((f"triton_{name}", lambda *a, _f=tri, _kw=kw, **k: _f(*a, **_kw, **k)))
        custom = [(f"triton_{spec.split('@', 1)[0]}",
                   variant(tri, [i.strip() for i in spec.split("@", 1)[1].split(";")]))
                  for spec in args.variant]
        impls += custom
        if FLA and not args.no_fla:
            impls.append(("fla", fla_call(kind)))
        if not args.no_torch:
            impls.append(("torch", getattr(torch_la, op)))
        for nseq, seqlen in shapes:
            inputs, flops, T = make(kind, nseq, seqlen)
            shape = f"{nseq}x{seqlen}"
            # The token loop is too slow at these lengths: the Triton recurrent kernel (checked
            # against it by the conformance suite) is the yardstick; fla's too when present.
            o_ref, s_ref = getattr(delta_rule, f"{kind}_recurrent")(**inputs)
            for name, fn in impls:
                try:
                    o, s = fn(**inputs)[:2]
                    err = f"o {rel_rmse(o, o_ref):.1e} S {rel_rmse(s, s_ref):.1e}"
                    ms = triton.testing.do_bench(lambda: fn(**inputs), warmup=10, rep=50)
                except Exception as exc:  # noqa: BLE001 - report and go on with the others
                    print(f"{op} {shape:<8} {name:<26} FAILED {type(exc).__name__}: "
                          f"{str(exc)[:160]}", file=sys.stderr)
                    continue
                tflops = flops / ms / 1e9
                print(f"{op},{name},{shape},{ms * 1e3:.1f},{tflops:.2f},TFLOP/s,"
                      f"{100 * tflops / matmul_tflops():.2f}")
                print(f"{op} {shape:<8} {name:<26} {ms * 1e3:9.1f} us "
                      f"{T / ms / 1e3:9.3f} Mtok/s {tflops:6.1f} TFLOP/s  rel-rmse vs recurrent: "
                      f"{err}", file=sys.stderr)
            if args.breakdown:
                breakdown(f"{op} {shape}", lambda: tri(**inputs))
                for name, fn in custom:
                    breakdown(f"{op} {shape} {name}", lambda: fn(**inputs))
                if FLA and not args.no_fla:
                    breakdown(f"{op} {shape} fla", lambda: fla_call(kind)(**inputs))
            if shape == "1x4096" and not args.quick:   # the reference, once
                ms = triton.testing.do_bench(lambda: getattr(ref_la, op)(**inputs), warmup=1,
                                             rep=1)
                print(f"{op},reference,{shape},{ms * 1e3:.1f},{flops / ms / 1e9:.2f},TFLOP/s,"
                      f"{100 * flops / ms / 1e9 / matmul_tflops():.2f}")


if __name__ == "__main__":
    print(describe(("TFLOP/s",)), file=sys.stderr)
    main()
    if "--breakdown" in sys.argv:
        compiled_stats()
