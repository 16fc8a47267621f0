"""Every op's reference on every case and dtype: runs, is deterministic, is finite, leaves its
inputs alone (ops declaring an in-place update get copies), and returns what the harness can compare (tensors or tuples of tensors)."""
from __future__ import annotations

import pytest
import torch

from hwinfer.ops import all_ops
from hwinfer.testing.conformance import _changed_inputs, _clone_tensors, _snapshot, case_seed, same_bits

CASES = [(spec, case, dtype) for spec in all_ops().values() for case in spec.cases for dtype in spec.dtypes]


@pytest.mark.parametrize("spec,case,dtype", CASES,
                         ids=[f"{s.name}-{c.name}-{str(d).replace('torch.', '')}" for s, c, d in CASES])
def test_reference(spec, case, dtype, request):
    seed = case_seed(f"ref-{spec.name}-{case.name}-{dtype}", request.config.hwinfer_seed)
    inputs = case.make(torch.Generator().manual_seed(seed), dtype, torch.device("cpu"))
    snap = _snapshot(inputs)
    # Ops that declare in-place updates (a state pool) run on fresh copies each time.
    fresh = (lambda: _clone_tensors(inputs)) if spec.mutates else (lambda: inputs)
    first = spec.reference(**fresh())
    assert not _changed_inputs(inputs, snap, ()), "the reference modified its inputs"
    second = spec.reference(**fresh())
    leaves = list(first) if isinstance(first, (tuple, list)) else [first]
    again = list(second) if isinstance(second, (tuple, list)) else [second]
    assert leaves, "the reference returned nothing"
    for a, b in zip(leaves, again):
        if not isinstance(a, torch.Tensor):
            continue
        assert same_bits(a, b), "the reference is not deterministic"
        if a.is_floating_point() and a.dtype.itemsize > 1:
            assert torch.isfinite(a.float()).all(), "the reference produced non-finite values"
