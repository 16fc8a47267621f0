"""Time sparse_mla_decode / sparse_mla_prefill on the GPU: reference vs portable torch vs Triton.

Decode: DeepSeek-V4-Flash shapes (H=64, D=512, bf16, sinks, inverse RoPE on the last 64
channels): the sliding-window ring (128 rows, ``kv_cache``) plus compressed entries
(``extra_kv_cache``): CSA-like K = 128 + 512 indexer picks, HCA-like K = 128 + 8192 entries (1M
context at ratio 128), HCA also with both caches packed (fp8_ds_mla: 584 B a row, the bytes
counted as such); and GLM-5 absorbed MLA (D=576, v_dim=512, top-2048, no sinks). S=1.
The Triton decode is timed in CUDA graph replays (the engine's decode path), the rest eagerly.
Bytes = gathered KV rows (every index valid: K * D * 2 per token, counted once) + q + o, against
the card's copy bandwidth ("triton" is the default path, on NVIDIA sm_90 the warp-specialised
Gluon kernel for the V4 bf16 shapes; "triton split" forces the Triton split kernel). Prefill:
V4 CSA (K = 128 + 512) and GLM-5 (K = 2048) over T tokens, FLOPs = 2 * T * H * K * (D +
v_dim), against its bf16 matmul rate.

stdout: one CSV line per measurement (op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak);
stderr: a readable table with max |diff| against the torch impl.

    python3 scripts/bench_sparse_mla.py [--quick] [--sweep | --sweep-focused] [--reference] [--only SUBSTR] [--ws [--floor]]

``--ws`` (``--ws-variants A,B``: only those named) adds the warp-specialised Gluon decode (hwinfer/kernels/triton/sparse_mla_ws.py; the
calls it covers, bf16 V4 rows) at its default and at the ring depths / chunk sizes in
``WS_VARIANTS``, on the packed-cache shapes its FP8 form (sparse_mla_ws_fp8.py, ``WS_FP8_VARIANTS``), on
GLM-5's 576-wide rows its RoPE form (``WS_GLM5_VARIANTS``). ``--floor`` also times each of them with every index
-1 ("... floor": no row is read, the consumers do all their work): how far a form is from its own compute floor.

``--sweep`` (``--sweep-focused``: 10 tilings around the default, then each variant's registers
and spills) times the Triton tilings (block_v x block_h x num_warps x block_k x num_splits) on
the B=32 / B=128 decode shapes; pick the best and edit DECODE_TUNING in
hwinfer/kernels/triton/sparse_mla.py.
"""
from __future__ import annotations

import itertools
import sys

import torch
import triton.testing

from hwinfer.backend import resolve_device, select
from hwinfer.ci.ceilings import describe, peak as ceiling
from hwinfer.kernels.torch.sparse_mla import sparse_mla_decode as torch_decode
from hwinfer.kernels.torch.sparse_mla import sparse_mla_prefill as torch_prefill
from hwinfer.kernels.triton.sparse_mla import sparse_mla_decode as triton_decode
from hwinfer.kernels.triton.sparse_mla import sparse_mla_prefill as triton_prefill
from hwinfer.ops.kv_pack import pack_fp8_ds_mla
from hwinfer.ops.sparse_mla import sparse_mla_decode as ref_decode
from hwinfer.ops.sparse_mla import sparse_mla_prefill as ref_prefill

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
    return {"q": torch.randn(batch, 1, HEADS, d, device=dev, dtype=dtype),
            "kv_cache": ring, "indices": win[:, None].to(dev),
            "sinks": torch.randn(HEADS, device=dev), "scale": d ** -0.5,
            "out_rope": (ang.cos(), ang.sin()),
            "extra_kv_cache": store, "extra_indices": ent[:, None].to(dev)}


def glm5_inputs(batch: int, topk: int = 2048, context: int = 65536, dtype=torch.bfloat16):
    dev, d = "cuda", 576
    gen = torch.Generator(device="cpu").manual_seed(0)
    cache = torch.randn(batch * context // PAGE, PAGE, d, device=dev, dtype=dtype)
    idx = torch.stack([torch.randperm(context, generator=gen)[:topk] + b * context for b in range(batch)])
    return {"q": torch.randn(batch, 1, HEADS, d, device=dev, dtype=dtype), "kv_cache": cache,
            "indices": idx[:, None].int().to(dev), "sinks": None, "scale": 256 ** -0.5, "v_dim": 512}


def prefill_inputs(tokens: int, kind: str, dtype=torch.bfloat16):
    """V4 CSA: window (128 previous tokens) + 512 compressed picks, D 512, sinks, rope;
    GLM-5: top-2048 of the prefix, D 576 / v 512. Rows of a 64k-row workspace."""
    dev, n = "cuda", 65536
    d, k = (512, WINDOW + 512) if kind == "dsv4" else (576, 2048)
    idx = torch.randint(0, n, (tokens, k), device=dev, dtype=torch.int32)
    inputs = {"q": torch.randn(tokens, HEADS, d, device=dev, dtype=dtype),
              "kv": torch.randn(n, d, device=dev, dtype=dtype), "indices": idx}
    if kind == "dsv4":
        ang = torch.rand(tokens, 32, device=dev) * 6.28
        inputs.update(sinks=torch.randn(HEADS, device=dev), scale=d ** -0.5, out_rope=(ang.cos(), ang.sin()))
    else:
        inputs.update(sinks=None, scale=256 ** -0.5, v_dim=512)
    return inputs


def packed(inputs: dict) -> dict:
    """The same decode inputs with DeepSeek-V4's packed FP8 caches (fp8_ds_mla, 584 B a row)."""
    return {**inputs, **{name: pack_fp8_ds_mla(inputs[name]) for name in ("kv_cache", "extra_kv_cache")
                         if inputs.get(name) is not None}}


def decode_bytes(inputs: dict, out: torch.Tensor) -> int:
    q = inputs["q"]
    k = inputs["indices"].shape[-1] + (inputs["extra_indices"].shape[-1] if "extra_indices" in inputs else 0)
    row = inputs["kv_cache"].shape[-1] * inputs["kv_cache"].element_size()   # 584 B when packed
    return q.shape[0] * q.shape[1] * k * row + q.nbytes + out.nbytes


def prefill_flops(inputs: dict, out: torch.Tensor) -> float:
    t, h, d = inputs["q"].shape
    return 2.0 * t * h * inputs["indices"].shape[1] * (d + out.shape[-1])


def measure(op: str, shape: str, impls: list, inputs: dict, work: float, unit: str) -> None:
    base = impls[0][1](**inputs, **impls[0][2])
    for name, fn, kw in impls:
        try:
            out = fn(**inputs, **kw)
            err = (out.float() - base.float()).abs().max().item()
            if op == "sparse_mla_decode" and name.startswith("triton"):
                # replayed in a CUDA graph, as the engine runs decode: without it a B=1 call
                # times the host launch (two kernels, ~80 us), not the GPU
                ms = triton.testing.do_bench_cudagraph(lambda: fn(**inputs, **kw), rep=50)
            else:
                ms = triton.testing.do_bench(lambda: fn(**inputs, **kw), warmup=10, rep=50)
        except Exception as exc:  # a sweep tiling that does not fit (shared memory, registers)
            print(f"{op} {shape:<28} {name:<34} failed: {type(exc).__name__}: {str(exc)[:100]}",
                  file=sys.stderr)
            continue
        rate = work / ms / (1e6 if unit == "GB/s" else 1e9)
        peak = ceiling(unit)
        print(f"{op},{name},{shape},{ms * 1e3:.1f},{rate:.1f},{unit},{100 * rate / peak:.1f}", flush=True)
        print(f"{op} {shape:<28} {name:<34} {ms * 1e3:10.1f} us {rate:8.1f} {unit} "
              f"({100 * rate / peak:5.1f}%)  max|diff| {err:.2e}", file=sys.stderr, flush=True)


# (name, module constants of hwinfer.kernels.triton.sparse_mla_ws) timed with --ws
_K32 = dict(BLOCK_K=32, CONSUMER_REGS=216, PRODUCER_REGS=64)   # spill-free for 32-row chunks
WS_VARIANTS = (("ws", {}), ("ws idx-in-loop", dict(PREFETCH_IDX=False)),
               ("ws qk-twice", dict(QK_SPLIT=False)), ("ws pw1", dict(PRODUCER_WARPS=1)),
               ("ws pw2", dict(PRODUCER_WARPS=2)), ("ws overlap", dict(OVERLAP=True)),
               ("ws k32 s4", dict(_K32, STAGES=4)), ("ws k32 s4 overlap", dict(_K32, STAGES=4, OVERLAP=True)),
               ("ws r216", dict(CONSUMER_REGS=216, PRODUCER_REGS=64)), ("ws sub16", dict(SUB=16)),
               ("ws splits-ceil", dict(FILL_WAVES=False)), ("ws waves2", dict(WAVES=2.0, FILL_WAVES=False)),
               ("ws min_rows512", dict(MIN_ROWS=512)))


# (name, module constants of hwinfer.kernels.triton.sparse_mla_ws_fp8) timed with --ws on the
# packed-cache shapes
WS_FP8_VARIANTS = (("ws fp8", {}), ("ws fp8 s2", dict(STAGES=2)), ("ws fp8 pw1", dict(PRODUCER_WARPS=1)),
                   ("ws fp8 r216", dict(CONSUMER_REGS=216, PRODUCER_REGS=64)),
                   ("ws fp8 ahead0", dict(DECODE_AHEAD=0)),
                   ("ws fp8 ahead1 r232", dict(DECODE_AHEAD=1, CONSUMER_REGS=232, PRODUCER_REGS=40)))
# on GLM-5's 576-wide rows (sparse_mla_ws.py's ROPE_TUNING forms)
_ROPE = dict(BLOCK_K=32, STAGES=3, QK_SPLIT=True, CONSUMER_REGS=216, PRODUCER_REGS=64)
WS_GLM5_VARIANTS = (("ws glm5", {}),
                    ("ws glm5 k64 qk-twice", dict(ROPE_TUNING=dict(BLOCK_K=64, STAGES=2, QK_SPLIT=False,
                                                                   CONSUMER_REGS=232, PRODUCER_REGS=40))),
                    ("ws glm5 r224", dict(ROPE_TUNING=dict(_ROPE, CONSUMER_REGS=224, PRODUCER_REGS=56))),
                    ("ws glm5 pw2", dict(ROPE_TUNING=dict(_ROPE, PRODUCER_WARPS=2))),
                    ("ws glm5 sub16", dict(ROPE_TUNING=dict(_ROPE, SUB=16))))


def ws_impl(consts: dict, module: str = "sparse_mla_ws"):
    """sparse_mla_decode forced onto the Gluon kernel with ``consts`` set during the call."""
    import importlib

    ws = importlib.import_module(f"hwinfer.kernels.triton.{module}")

    def run(**inputs):
        old = {k: getattr(ws, k) for k in consts}
        for k, v in consts.items():
            setattr(ws, k, v)
        try:
            return triton_decode(**inputs, ws=True)
        finally:
            for k, v in old.items():
                setattr(ws, k, v)
    return run


def no_rows(fn):
    """``fn`` on the same call with every index -1: the producer's copies zero-fill and read no
    rows, the consumers do all their work: the kernel's time without the memory (its floor)."""
    made = {}   # the -1 lists, built once (not inside the timed graph)

    def run(**inputs):
        for k in ("indices", "extra_indices"):
            if k in inputs and k not in made:
                made[k] = torch.full_like(inputs[k], -1)
        return fn(**{**inputs, **made})
    return run


def sweep_configs(focused: bool):
    """The tilings to time: the full grid (75), or a focused set (10) around the CUDA default (timed as "triton")
    (all 64 heads x 512 channels, 64-row chunks, 8 warps, 2 stages, 2 waves, 128 rows a split):
    stages, chunk rows, warps, splits."""
    if focused:
        base = dict(block_v=512, block_h=64, num_warps=8, block_k=64, num_stages=2, waves=2.0,
                    min_rows=128)
        for change in (dict(waves=1.0), dict(waves=4.0, min_rows=64), dict(num_stages=1),
                       dict(block_k=128, num_stages=1), dict(block_k=32, num_stages=3),
                       dict(num_warps=16), dict(num_warps=16, block_k=32, num_stages=3),
                       dict(num_warps=4), dict(min_rows=256),
                       dict(block_v=256, num_warps=4, block_k=16)):
            kw = {**base, **change}
            yield "triton " + " ".join(f"{k}={v}" for k, v in change.items()), kw
        return
    grid = [(bv, bh, w, bk, s) for bv, bh in ((512, 64), (512, 32), (256, 64), (128, 64), (256, 32))
            for w, bk in ((4, 32), (8, 32), (8, 16), (8, 64), (16, 32)) for s in (None, 1, 4)]
    for bv, bh, warps, bk, splits in grid:
        yield f"triton v{bv} h{bh} w{warps} k{bk} s{splits}", dict(
            block_v=bv, block_h=bh, num_warps=warps, block_k=bk, num_splits=splits)


def compiled_stats() -> None:
    """Registers / spills / shared memory of every compiled split-kernel variant (to stderr)."""
    from hwinfer.kernels.triton import compiled_report
    from hwinfer.kernels.triton.sparse_mla_kernels import _sparse_mla_split_kernel

    for line in compiled_report(_sparse_mla_split_kernel):
        print(f"#   {line}", file=sys.stderr)


def main() -> None:
    argv = sys.argv[1:]
    quick, with_ref = "--quick" in argv, "--reference" in argv
    sweep, focused = "--sweep" in argv or "--sweep-focused" in argv, "--sweep-focused" in argv
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    with_ws = "--ws" in argv
    dev = resolve_device("cuda")
    table = select(dev)
    print(f"device: {dev.describe()}; chosen: decode {table.chosen('sparse_mla_decode')}, "
          f"prefill {table.chosen('sparse_mla_prefill')}", file=sys.stderr)
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    batches = (32, 128) if quick or (sweep and not focused) else (1, 32, 128)
    for batch in batches:
        for label, make in ((f"dsv4_csa_K128+512_B{batch}", lambda: dsv4_inputs(batch, 512)),
                            (f"dsv4_hca_K128+8192_B{batch}", lambda: dsv4_inputs(batch, None)),
                            (f"dsv4_hca_fp8cache_K128+8192_B{batch}", lambda: packed(dsv4_inputs(batch, None))),
                            (f"glm5_D576_K2048_B{batch}", lambda: glm5_inputs(batch))):
            if only not in label:
                continue
            inputs = make()
            # "triton": the default path (on NVIDIA sm_90 the Gluon kernel where it applies);
            # "triton split": the Triton split kernel itself
            impls = [("torch", torch_decode, {}), ("triton", triton_decode, {}),
                     ("triton split", triton_decode, {"ws": False})]
            if with_ref and batch <= 32:
                impls.append(("reference", ref_decode, {}))
            if sweep:
                impls += [(name, triton_decode, kw) for name, kw in sweep_configs(focused)]
            if with_ws:
                pick = argv[argv.index("--ws-variants") + 1].split(",") if "--ws-variants" in argv else None
                fp8 = "fp8cache" in label
                variants = WS_GLM5_VARIANTS if "glm5" in label else WS_FP8_VARIANTS if fp8 else WS_VARIANTS
                ws = [(f"triton {name}", ws_impl(consts, "sparse_mla_ws_fp8" if fp8 else "sparse_mla_ws"), {})
                      for name, consts in variants if pick is None or name in pick]
                impls += ws
                if "--floor" in argv:
                    impls += [(f"{name} floor", no_rows(fn), kw) for name, fn, kw in ws]
            out = impls[1][1](**inputs)
            measure("sparse_mla_decode", label, impls, inputs, decode_bytes(inputs, out), "GB/s")
            del inputs
            torch.cuda.empty_cache()
    if sweep:
        compiled_stats()
        return
    if with_ws:   # the Gluon kernel is decode only
        return
    for tokens, kind in itertools.product((1024,) if quick else (1024, 8192), ("dsv4", "glm5")):
        label = f"{kind}_prefill_T{tokens}"
        if only not in label:
            continue
        inputs = prefill_inputs(tokens, kind)
        impls = [("torch", torch_prefill, {}), ("triton", triton_prefill, {})]
        if not quick:
            impls += [(f"triton v{bv} h{bh} w{w} k{bk}", triton_prefill,
                       dict(block_v=bv, block_h=bh, num_warps=w, block_k=bk))
                      for bv, bh, w, bk in ((512, 64, 8, 64), (512, 64, 8, 32), (256, 64, 4, 16),
                                            (256, 64, 8, 32), (128, 64, 4, 32))]
        out = triton_prefill(**inputs)
        measure("sparse_mla_prefill", label, impls, inputs, prefill_flops(inputs, out), "TFLOP/s")
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    print(describe(), file=sys.stderr)
    main()
