"""Time paged_attention and causal_conv1d on the GPU (Qwen3.5-0.8B decode shapes) against HBM.

paged_attention: Hq 8, Hkv 2, D 256, bf16, sigmoid gate, Sq 1 (and Sq 4 = MTP verification),
block size 64; B in {1, 32, 128} x context {1k, 8k, 32k} (every sequence at full length).
Bytes per call = the K and V rows read (B * L * Hkv * D * 2 caches * 2 B) + q + gate + out.
Compared: the reference op (--reference; per-sequence loop), the portable torch impl
(gather + batched matmuls, syncs once), Triton (split + combine kernels, and with the merge done
by each row block's last split: ``COMBINE_IN_SPLIT``), and torch SDPA on K/V already gathered into
contiguous [B, Hkv, L, D] (the gather is not timed: a dense-cache lower bound for SDPA).

causal_conv1d: Qwen3.5-0.8B GDN conv, C = 6144, K = 4, bf16, SiLU, state: decode T = 1 for
B in {1, 32, 128}, prefill B = 1 x T 8192 and varlen 16 x 512. Bytes = x + y + state in/out.
Peer: fla-core's causal_conv1d (state [N, C, K]) when importable.

stdout: CSV `op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak`; stderr: a readable table.

    python3 scripts/bench_paged_attention.py [--quick] [--reference] [--sweep] [--graph]

``--graph`` times every call as CUDA graph replays (the decode step's way; the portable torch
impl syncs and is reported as failed there).
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton.testing

from hwinfer.ci.ceilings import copy_gbps, describe
from hwinfer.kernels.torch.attention import paged_attention as torch_paged
from hwinfer.kernels.torch.conv import causal_conv1d as torch_conv
from hwinfer.kernels.triton.conv import causal_conv1d as triton_conv
from hwinfer.kernels.triton import paged_attention as paged_module
from hwinfer.kernels.triton.paged_attention import paged_attention as triton_paged
from hwinfer.ops.attention_paged import paged_attention as reference_paged
from hwinfer.ops.conv import causal_conv1d as reference_conv

GRAPH = False  # --graph
HQ, HKV, D, BLOCK = 8, 2, 256, 64
C, K = 6144, 4


def emit(op: str, impl: str, shape: str, ms: float, moved: int, err: float | None) -> None:
    gbs = moved / ms / 1e6
    print(f"{op},{impl},{shape},{ms * 1e3:.2f},{gbs:.1f},GB/s,{100 * gbs / copy_gbps():.1f}", flush=True)
    diff = "" if err is None else f"  max|diff| {err:.2e}"
    print(f"{op:<16} {shape:<28} {impl:<24} {ms * 1e3:10.1f} us {gbs:8.0f} GB/s "
          f"({100 * gbs / copy_gbps():5.1f}%){diff}", file=sys.stderr, flush=True)


def time_impl(op, shape, name, fn, ref, moved) -> None:
    try:
        out = fn()
        o, r = (out[0], ref[0]) if isinstance(out, tuple) else (out, ref)
        err = (o.float() - r.float()).abs().max().item()
        # --graph: timed as CUDA graph replays (as the decode step runs; no launch overhead)
        ms = (triton.testing.do_bench_cudagraph(fn, rep=50) if GRAPH else
              triton.testing.do_bench(fn, warmup=10, rep=50))
    except Exception as exc:  # OOM for the torch impl at the largest shapes, a failed tiling
        print(f"{op:<16} {shape:<28} {name:<24} failed: {type(exc).__name__}: {str(exc)[:100]}",
              file=sys.stderr)
        torch.cuda.empty_cache()
        return
    emit(op, name, shape, ms, moved, err)


def paged_inputs(batch: int, ctx: int, sq: int, dtype=torch.bfloat16) -> dict:
    dev = "cuda"
    nblk = ctx // BLOCK
    # sequences own shuffled blocks, so the gather is really paged
    table = torch.randperm(batch * nblk, device=dev).int().view(batch, nblk)
    k = torch.randn(batch * nblk, BLOCK, HKV, D, device=dev, dtype=dtype)
    v = torch.randn(batch * nblk, BLOCK, HKV, D, device=dev, dtype=dtype)
    return {"q": torch.randn(batch, sq, HQ, D, device=dev, dtype=dtype), "k_cache": k, "v_cache": v,
            "block_table": table, "seq_lens": torch.full((batch,), ctx, device=dev, dtype=torch.int32),
            "scale": D ** -0.5, "gate": torch.randn(batch, sq, HQ, D, device=dev, dtype=dtype)}


def bench_paged(batch: int, ctx: int, sq: int, with_reference: bool, sweep: bool) -> None:
    inp = paged_inputs(batch, ctx, sq)
    shape = f"B{batch}xL{ctx}xSq{sq}"
    q = inp["q"]
    moved = batch * ctx * HKV * D * 2 * 2 + 3 * q.numel() * 2
    try:  # the portable impl checks Triton's numbers (it may run out of memory at 128 x 32k)
        ref = torch_paged(**inp)
    except torch.cuda.OutOfMemoryError:
        ref = triton_paged(**inp)
        torch.cuda.empty_cache()
    if with_reference:
        ref = reference_paged(**inp)
        time_impl("paged_attention", shape, "reference", lambda: reference_paged(**inp), ref, moved)
    time_impl("paged_attention", shape, "torch", lambda: torch_paged(**inp), ref, moved)
    time_impl("paged_attention", shape, "triton", lambda: triton_paged(**inp), ref, moved)
    # the merge done by each row block's last split, in place of the combine kernel
    paged_module.COMBINE_IN_SPLIT, default = True, paged_module.COMBINE_IN_SPLIT
    try:
        time_impl("paged_attention", shape, "triton merge in split", lambda: triton_paged(**inp),
                  ref, moved)
    finally:
        paged_module.COMBINE_IN_SPLIT = default
    if sweep:
        for bn, warps, split in ((32, 4, None), (64, 8, None), (128, 8, None), (64, 4, 128),
                                 (64, 4, 256), (64, 4, 512), (64, 4, 1024), (64, 4, 1 << 20),
                                 (32, 4, 128), (32, 2, 256)):
            kw = dict(block_n=bn, num_warps=warps, split=split)
            time_impl("paged_attention", shape, f"triton n{bn} w{warps} s{split}",
                      lambda: triton_paged(**inp, **kw), ref, moved)
    # SDPA on pre-gathered contiguous K/V (gather untimed), causal within the Sq new tokens
    flat = inp["block_table"].long()
    kd = inp["k_cache"][flat].reshape(batch, ctx, HKV, D).transpose(1, 2).contiguous()
    vd = inp["v_cache"][flat].reshape(batch, ctx, HKV, D).transpose(1, 2).contiguous()
    qd = q.transpose(1, 2)
    mask = None
    if sq > 1:
        pos = torch.arange(ctx, device="cuda")
        mask = pos[None, :] <= (ctx - sq + torch.arange(sq, device="cuda"))[:, None]
    gate = torch.sigmoid(inp["gate"].float())

    def sdpa():
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=D ** -0.5,
                                           enable_gqa=True)
        return (o.transpose(1, 2).float() * gate).to(q.dtype)
    time_impl("paged_attention", shape, "sdpa_gathered", sdpa, ref, moved)
    del inp, kd, vd
    torch.cuda.empty_cache()


def bench_conv(label: str, batch: int, t: int, seqs: int | None) -> None:
    dev, dt = "cuda", torch.bfloat16
    n = seqs or batch
    x = torch.randn(batch, t, C, device=dev, dtype=dt)
    w = torch.randn(C, K, device=dev, dtype=dt) * 0.5
    state = torch.randn(n, C, K - 1, device=dev, dtype=dt)
    cu = None
    if seqs:
        cu = torch.arange(0, t + 1, t // seqs, device=dev, dtype=torch.int32)
    kw = dict(activation="silu", cu_seqlens=cu)
    moved = 2 * x.numel() * 2 + 2 * state.numel() * 2 + w.numel() * 2
    ref = reference_conv(x, w, None, state, **kw)
    time_impl("causal_conv1d", label, "torch", lambda: torch_conv(x, w, None, state, **kw), ref, moved)
    time_impl("causal_conv1d", label, "triton", lambda: triton_conv(x, w, None, state, **kw), ref, moved)
    try:
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
        full = torch.cat([torch.zeros_like(state[..., :1]), state], dim=-1)  # fla keeps K inputs
        time_impl("causal_conv1d", label, "fla",
                  lambda: fla_conv(x, w, None, initial_state=full, output_final_state=True,
                                   activation="silu", cu_seqlens=cu), ref, moved)
    except Exception as exc:
        print(f"fla causal_conv1d unavailable: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)


def main() -> None:
    global GRAPH
    quick, with_reference, sweep = "--quick" in sys.argv, "--reference" in sys.argv, "--sweep" in sys.argv
    GRAPH = "--graph" in sys.argv
    grid = [(1, 1024, 1), (1, 8192, 1), (32, 1024, 1), (32, 8192, 1), (128, 1024, 1),
            (32, 8192, 4)] if quick else [
        (b, ctx, sq) for sq in (1, 4) for b in (1, 32, 128) for ctx in (1024, 8192, 32768)]
    for batch, ctx, sq in grid:
        bench_paged(batch, ctx, sq, with_reference and batch * ctx <= 32 * 8192, sweep)
    convs = [("decode B1", 1, 1, None), ("decode B128", 128, 1, None), ("prefill T8192", 1, 8192, None)]
    if not quick:
        convs += [("decode B32", 32, 1, None), ("varlen 16x512", 1, 8192, 16)]
    for label, batch, t, seqs in convs:
        bench_conv(label, batch, t, seqs)


if __name__ == "__main__":
    print(describe(("GB/s",)), file=sys.stderr)
    main()
