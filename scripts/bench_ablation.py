"""What each kind of kernel costs inside a captured decode step: the step's CUDA-graph replay
with one group of ops replaced by stand-ins that launch nothing (timing only: the tokens are
garbage), against the full step. The difference is that group's marginal cost where it runs,
after programmatic dependent launch and graph overlap, which a profiler's per-kernel durations
cannot show (with PDL a kernel's measured span includes the wait for the one before it).

    python3 scripts/bench_ablation.py --preset qwen3.5-0.8b --batch 1 --prompt 1024 --new 32
    python3 scripts/bench_ablation.py --groups non_gemv \
        --set hwinfer.kernels.triton.gemv:PERSIST_PER_SM=3   # a tuning constant's effect
    python3 scripts/bench_ablation.py --groups none \
        --variant "persist3@hwinfer.kernels.triton.gemv:PERSIST_PER_SM=3"  # full steps side by side

Groups (each a list of ops; the stand-ins return an input of the output's shape):
  conv          causal_conv1d -> (x, state)
  delta_rule    gdn_gated_recurrent / kda_recurrent / gdn_recurrent -> (v, state)
  attention     paged_attention -> q (needs Dk = Dv), rms_norm_rope_kv_store -> q
  non_gemv      all of the above together: what is left is the projections, norms and glue
``--groups none`` times the full step only. ``--variant NAME@MODULE:ATTR=VALUE[;...]`` (repeatable)
times the full step again with those constants set, then restores them (an item
``op:OPNAME=reference`` runs that op's plain-PyTorch reference instead of its chosen impl);
``--repeat N`` runs N rounds of (default, every variant) and ends with each variant's median
saving over its round's default (a step drifts by ~20 us over a run: single differences of that
size are noise).
stdout: one JSON row per (batch, group or variant): graph replay ms and its difference to the
full step.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_model import bench_hwinfer, shrunk_config  # noqa: E402
from kernel_regs import constants, live_registers, set_constant  # noqa: E402

from hwinfer.api import random_model  # noqa: E402
from hwinfer.ops.contract import get_op  # noqa: E402


def _conv(x, weight, bias=None, state=None, **_):
    return x, state


def _delta(q, k, v, *args, **kw):
    # the state pool is the last 4-D positional argument (KDA's g is 4-D too, and comes first)
    state = next((a for a in reversed(args) if hasattr(a, "dim") and a.dim() == 4), None)
    return v, kw.get("initial_state", state)


def _first(q, *_, **__):
    return q


STANDINS = {
    "conv": {"causal_conv1d": _conv},
    "delta_rule": {"gdn_gated_recurrent": _delta, "gdn_recurrent": _delta, "kda_recurrent": _delta},
    "attention": {"paged_attention": _first, "rms_norm_rope_kv_store": _first},
}
STANDINS["non_gemv"] = {k: v for group in STANDINS.values() for k, v in group.items()}


@contextlib.contextmanager
def references(ops, items: list[str]):
    """``op:NAME=reference`` items: those ops run their references for the duration."""
    saved = {}
    try:
        for item in items:
            name, _, impl = item[len("op:"):].partition("=")
            if impl != "reference":
                raise ValueError(f"{item!r}: only op:NAME=reference is supported")
            saved[name] = getattr(ops, name)
            setattr(ops, name, get_op(name).reference)
        yield
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)


def _row(base: dict, row: dict, **fields) -> str:
    """One JSON result line: ``fields``, the run's replay / step ms and what it saved on ``base``."""
    ms = lambda r: r.get("graph_replay_ms") or r["ms_per_step"]  # noqa: E731
    return json.dumps({**fields, "replay_ms": row.get("graph_replay_ms"),
                       "step_ms": row["ms_per_step"], "saved_ms": ms(base) - ms(row)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--groups", default=",".join(STANDINS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE:NAME=VALUE",
                    help="set a kernel module's tuning constant for every run, e.g. "
                         "hwinfer.kernels.triton.gemv:PERSIST_PER_SM=3 (repeatable)")
    ap.add_argument("--regs", action="store_true",
                    help="after the runs, one JSON row per compiled Triton kernel: registers, "
                         "spills, warps (scripts/kernel_regs.py live_registers)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME@MODULE:ATTR=VALUE[;...]")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of (default step, every variant); with more than one, a last "
                         "row per variant gives the median of its saving over its round's default")
    args = ap.parse_args()
    for item in args.set:
        set_constant(item)
    variants = [(v.split("@", 1)[0], v.split("@", 1)[1].split(";")) for v in args.variant]
    model = random_model(shrunk_config(args.preset, args.layers), device=args.device, dtype="bf16")
    ops = model.ops
    for batch in (int(b) for b in args.batch.split(",")):
        base = bench_hwinfer(model, batch, args.prompt, args.new, graphs=True)
        print(json.dumps({"batch": batch, "group": "full step", "replay_ms": base.get("graph_replay_ms"),
                          "step_ms": base["ms_per_step"]}), flush=True)
        # Variants in rounds, each against a fresh default step of its own round: a step drifts
        # by ~20 us over a run (H200), so one-off differences of that size are noise.
        paired = {vname: [] for vname, _ in variants}
        for rnd in range(args.repeat if variants else 0):
            if rnd:
                base = bench_hwinfer(model, batch, args.prompt, args.new, graphs=True)
                print(json.dumps({"batch": batch, "group": "full step", "round": rnd,
                                  "replay_ms": base.get("graph_replay_ms"),
                                  "step_ms": base["ms_per_step"]}), flush=True)
            for vname, items in variants:
                with constants([i for i in items if not i.startswith("op:")]), \
                        references(ops, [i for i in items if i.startswith("op:")]):
                    row = bench_hwinfer(model, batch, args.prompt, args.new, graphs=True)
                line = _row(base, row, batch=batch, variant=vname, set=items, round=rnd)
                paired[vname].append(json.loads(line)["saved_ms"])
                print(line, flush=True)
        if args.repeat > 1:
            for vname, diffs in paired.items():
                print(json.dumps({"batch": batch, "variant": vname, "rounds": len(diffs),
                                  "median_saved_ms": statistics.median(diffs),
                                  "saved_ms": diffs}), flush=True)
        for group in [g for g in args.groups.split(",") if g != "none"]:
            saved = {name: getattr(ops, name) for name in STANDINS[group] if name in ops.choices}
            for name in saved:
                setattr(ops, name, STANDINS[group][name])
            try:
                row = bench_hwinfer(model, batch, args.prompt, args.new, graphs=True)
            finally:
                for name, fn in saved.items():
                    setattr(ops, name, fn)
            print(_row(base, row, batch=batch, group=group, ops=sorted(saved)), flush=True)
    if args.regs:
        for row in live_registers():
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
