"""The decode step's weight order (kernels/weight_order.py) and the GEMVs' L2 prefetch (kernels/
triton/l2.py): what the engine records and hands to the GEMVs, and that the prefetch survives
compilation (it changes no value, so only its presence in the machine code can be checked here;
its speed is measured on the card, docs/kernels.md)."""
from __future__ import annotations

import pytest
import torch

from hwinfer.kernels import weight_order


def _weights(n):
    return [torch.empty(4, 8) for _ in range(n)]


def test_recording_then_applied_gives_each_weight_its_successor():
    a, b, c = _weights(3)
    assert weight_order.note(a) is None            # outside both contexts: nothing
    with weight_order.recording() as order:
        for w in (a, b, c):
            assert weight_order.note(w) is None
    assert [r() for r in order] == [a, b, c]
    with weight_order.applied(order):
        assert weight_order.note(a) is b
        assert weight_order.note(b) is c
        assert weight_order.note(c) is a           # the last prefetches the next step's first
        assert weight_order.note(torch.empty(3)) is None   # not in the step
    assert weight_order.note(a) is None            # the plan ends with its context


def test_distance_repeats_and_self():
    a, b, c, d = _weights(4)
    with weight_order.applied([a, b, c, d], distance=2):
        assert weight_order.note(a) is c and weight_order.note(c) is a
    with weight_order.applied([a, b, a, c]):       # the first occurrence decides
        assert weight_order.note(a) is b
    with weight_order.applied([a]):                # its own successor: nothing to prefetch
        assert weight_order.note(a) is None
    with weight_order.applied([a, b], distance=0):
        assert weight_order.note(a) is None


def test_nested_contexts_restore():
    a, b = _weights(2)
    with weight_order.applied([a, b]):
        with weight_order.recording() as inner:
            assert weight_order.note(a) is None    # recording wins inside
        assert [r() for r in inner] == [a]
        assert weight_order.note(a) is b


def test_weights_gone_before_the_capture_drop_out():
    """A weight made per call (a cast) is freed after its product: the plan skips it, so no
    captured GEMV prefetches memory that no longer holds a weight."""
    a, c = _weights(2)
    with weight_order.recording() as order:
        weight_order.note(a)
        weight_order.note(torch.empty(4, 8))   # a temporary, freed at once
        weight_order.note(c)
    with weight_order.applied(order):
        assert weight_order.note(a) is c and weight_order.note(c) is a


def test_span_bytes_of_strided_rows():
    w = torch.empty(10, 16, dtype=torch.bfloat16)
    assert weight_order.span_bytes(w) == 10 * 16 * 2
    assert weight_order.span_bytes(w[:, :8]) == (9 * 16 + 8) * 2   # rows of 8 in a stride of 16
    assert weight_order.span_bytes(w[:0]) == 0


def test_target_is_off_on_the_cpu(monkeypatch):
    pytest.importorskip("triton")
    from hwinfer.kernels.triton import l2

    monkeypatch.setattr(l2, "ENABLED", True)
    a, b = _weights(2)
    with weight_order.applied([a, b]):
        assert l2.target(a) == (a, 0, 0)       # no PTX prefetch off an NVIDIA GPU


@pytest.mark.parametrize("name,instruction", [
    ("gemv_rows[bf16,K1024,pdl,l2]", "prefetch.global.L2"),
    ("gemv_rows[bf16,K1024,pdl,l2bulk]", "cp.async.bulk.prefetch.L2.global"),
    ("add_norm_gemv[bf16,conv,pdl,l2]", "prefetch.global.L2"),
    ("add_norm_gemv[bf16,gated,pdl,l2bulk]", "cp.async.bulk.prefetch.L2.global"),
    ("gated_norm_gemv[bf16,16x128,pdl,l2]", "prefetch.global.L2")])
def test_prefetch_reaches_the_machine_code(name, instruction, tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from hwinfer.kernels.triton.aot import all_specs, compile_spec

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    specs = {s.name: s for s in all_specs()}
    ptx = compile_spec(specs[name], "sm_90")["ptx"]
    assert instruction in ptx
    plain = name.replace(",l2bulk]", "]").replace(",l2]", "]")
    assert "prefetch" not in compile_spec(specs[plain], "sm_90")["ptx"]
