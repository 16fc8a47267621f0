"""List the torch kernels a model's captured decode step launches outside its ops ("glue").

    python3 scripts/find_glue.py qwen3_5 [--device cuda] [--prefill]

On the H200 a non-Triton kernel between two decode GEMVs costs more than its own few
microseconds: it does not take part in programmatic dependent launch, so the GEMV after it
cannot stream its weights while it runs (docs/engine.md, tenth session). This runs the engine's
fixed-size decode step (hwinfer.engine.graphs, eagerly) on a tiny checkpoint and records every
aten op that launches work and is not inside an op-table call, with the innermost hwinfer frames
that issued it. On the CPU the ops run the torch reference; the glue is the same code.

``--prefill``: the same for the step that processes a 40-token prompt, whose launches a short
prefill pays on the host one by one (docs/engine.md, fifteenth session).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hwinfer import load_model
from hwinfer.engine import Engine, SamplingParams
from hwinfer.testing.checkpoints import write_checkpoint

# aten ops that only make views or allocate (no kernel)
_NO_KERNEL = {"view", "_unsafe_view", "slice", "select", "as_strided", "t", "transpose", "permute",
              "unsqueeze", "squeeze", "expand", "detach", "split", "split_with_sizes", "alias",
              "empty", "empty_strided", "empty_like", "reshape", "unbind", "narrow", "diagonal",
              "_reshape_alias", "lift_fresh", "view_as_real", "view_as_complex", "unflatten",
              "chunk", "set_", "resize_", "sym_size", "sym_stride",
              "sym_numel", "sym_storage_offset", "is_same_size", "_local_scalar_dense"}


def _site() -> str:
    frames = [f for f in traceback.extract_stack()[:-3] if "hwinfer" in f.filename
              and "torch/utils" not in f.filename]
    return " <- ".join(f"{f.filename.split('hwinfer/')[-1]}:{f.lineno} {f.name}"
                       for f in reversed(frames[-3:]))


# Functions whose torch calls work on host tensors whatever the model's device (they build the
# step's inputs on the CPU and upload them in one copy): on a CPU run they look like glue.
_HOST_WORK = {("runtime/batch.py", "from_host")}


def _inside_op() -> bool:
    """Whether an op's implementation or reference is on the stack (hwinfer/kernels, hwinfer/ops):
    its aten calls are the op's own business, not glue; or host-side input building."""
    return any("hwinfer/kernels/" in f.filename or "hwinfer/ops/" in f.filename
               or (f.filename.split("hwinfer/")[-1], f.name) in _HOST_WORK
               for f in traceback.extract_stack())


class GlueLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.found: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if (name not in _NO_KERNEL and not (name == "_to_copy" and _same(args, kwargs))
                and not _inside_op()):
            self.found[f"{name:<16} {_site()}"] += 1
        return func(*args, **(kwargs or {}))


def _same(args, kwargs) -> bool:
    """A ``.to()`` that changes nothing launches nothing."""
    x = args[0]
    kwargs = kwargs or {}
    return kwargs.get("dtype", x.dtype) == x.dtype and kwargs.get("device", x.device) == x.device


def glue_of(arch: str, device: str, steps: int, prefill: bool = False) -> tuple[Counter, int]:
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(write_checkpoint(arch, tmp), device=device, dtype=torch.bfloat16)
    log = GlueLog()
    engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=64, cuda_graphs=True)
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
    if prefill:
        # a first request warms up (weights stacked on first use, compiles); the second one's
        # prompt step is logged
        forward, armed, ran = engine._forward, [False], [0]

        def watched_prefill(scheduled):
            if armed[0]:
                armed[0] = False
                ran[0] += 1
                with log:
                    return forward(scheduled)
            return forward(scheduled)
        engine._forward = watched_prefill
        for second in (False, True):
            armed[0] = second
            prompt = torch.randint(3, model.config["vocab_size"], (40,), generator=gen).tolist()
            engine.run([engine.add_request(prompt, params)])
        return log.found, ran[0]
    graphs = engine.graphs
    graphs.capture = False   # the fixed-size step, eagerly
    plain, calls = graphs._forward, [0]

    def watched(size: int):
        calls[0] += 1
        if calls[0] != 4:    # one step after the first ones (compiles), with every layer warm
            return plain(size)
        with log:
            return plain(size)
    graphs._forward = watched
    prompt = torch.randint(3, model.config["vocab_size"], (7,), generator=gen).tolist()
    engine.run([engine.add_request(prompt, params)])
    return log.found, calls[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archs", nargs="+")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prefill", action="store_true", help="the prompt's step instead of decode")
    args = ap.parse_args()
    for arch in args.archs:
        found, steps = glue_of(arch, args.device, args.steps, args.prefill)
        what = "the prefill step" if args.prefill else f"one decode step ({steps} fixed-size steps ran)"
        print(f"{arch}: {sum(found.values())} glue kernels in {what}")
        for site, n in sorted(found.items(), key=lambda kv: kv[0].split()[1:]):
            print(f"  {n:3d}x  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
