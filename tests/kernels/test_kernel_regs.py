"""scripts/kernel_regs.py's SASS reading (``--sass``), the source of the instruction counts the
docs quote for kernels no card has timed: a kernel with one loop of known shape must show that
loop (its body and its barrier), and one without a loop none."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from kernel_regs import sass_report  # noqa: E402


@triton.jit
def _looped(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n):
        # a reduction across the program's warps: a barrier in the loop's body
        x = tl.load(x_ptr + i * BLOCK + tl.arange(0, BLOCK))
        acc += tl.sum(x, axis=0) * x
    tl.store(y_ptr + tl.arange(0, BLOCK), acc)


@triton.jit
def _straight(x_ptr, y_ptr, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.store(y_ptr + tl.arange(0, BLOCK), x * 2.0)


def _ptx(fn, signature, constexprs):
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}},
                    constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4}).asm["ptx"]


def test_sass_report_finds_the_loop_and_its_barrier():
    looped = sass_report(_ptx(_looped, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"},
                              {"BLOCK": 512}))
    assert len(looped["loops"]) == 1, looped
    body, barriers = looped["loops"][0]
    assert 0 < body < looped["instructions"] and barriers >= 1, looped
    assert looped["spill_ops"] == 0
    straight = sass_report(_ptx(_straight, {"x_ptr": "*fp32", "y_ptr": "*fp32"}, {"BLOCK": 512}))
    assert straight["loops"] == [] and straight["instructions"] > 0, straight
