"""The torch kernels a decode step launches outside its ops ("glue", scripts/find_glue.py) must
not creep back: each one also stalls the next GEMV's programmatic dependent launch on a GPU
(docs/engine.md, tenth and eleventh sessions). The ceilings are the counts after the glue was
taken out of each model's step (tiny checkpoints, the engine's fixed-size decode step run eagerly
on the CPU, where the ops run their torch impls and the glue is the same code); lower them when
a change removes more.

The prefill step has ceilings too (``--prefill``): a short prompt's step is host-bound on the
H200 (fifteenth session), every launch counts; the linear-attention layers' states are read and
written in place there, which a gather / scatter around the ops would break.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from find_glue import glue_of  # noqa: E402

# Each decode ceiling counts the step's greedy argmax (engine/graphs.py GREEDY_IN_GRAPH: it ran
# between the steps before, the same kernel, and nothing in the step comes after it).
CEILINGS = {"qwen3_5": 6, "deepseek_v4": 64, "gemma4": 50, "kimi_linear": 27, "glm_moe_dsa": 65,
            "hy_v4": 68, "minimax_m3": 58}
PREFILL_CEILINGS = {"qwen3_5": 9, "kimi_linear": 27}


@pytest.mark.parametrize("arch", sorted(CEILINGS))
def test_decode_step_glue_stays_under_its_ceiling(arch):
    found, steps = glue_of(arch, "cpu", 6)
    assert steps >= 4, f"{arch}: the watched step never ran ({steps} fixed-size steps)"
    count = sum(found.values())
    assert count <= CEILINGS[arch], (
        f"{arch}: {count} glue kernels a decode step (ceiling {CEILINGS[arch]}):\n"
        + "\n".join(f"  {n}x {site}" for site, n in found.most_common(12)))


@pytest.mark.parametrize("arch", sorted(PREFILL_CEILINGS))
def test_prefill_step_glue_stays_under_its_ceiling(arch):
    found, watched = glue_of(arch, "cpu", 2, prefill=True)
    assert watched == 1, f"{arch}: the watched prefill step never ran"
    count = sum(found.values())
    assert count <= PREFILL_CEILINGS[arch], (
        f"{arch}: {count} glue kernels in the prefill step (ceiling {PREFILL_CEILINGS[arch]}):\n"
        + "\n".join(f"  {n}x {site}" for site, n in found.most_common(12)))
