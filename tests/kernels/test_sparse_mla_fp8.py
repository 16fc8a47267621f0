"""The Triton sparse MLA decode over DeepSeek-V4's packed fp8_ds_mla caches, interpreted, in the
tilings the conformance cases do not reach on the CPU: value tiles narrower than the row (the
value loads decode the packed rows themselves), several splits with the merge kernel, and both
row sets packed. Against the reference (which dequantizes the caches exactly first)."""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")

SCRIPT = r"""
import torch
from hwinfer.kernels.triton.sparse_mla import sparse_mla_decode
from hwinfer.ops import sparse_mla as ref
from hwinfer.ops.kv_pack import pack_fp8_ds_mla
g = torch.Generator().manual_seed(0)
B, S, H, D = 2, 1, 16, 512
q = torch.randn(B, S, H, D, generator=g)
kv = pack_fp8_ds_mla(torch.randn(6, 16, D, generator=g) * 3)
extra = pack_fp8_ds_mla(torch.randn(4, 8, D, generator=g))
idx = torch.randint(-1, 96, (B, S, 40), generator=g, dtype=torch.int32)
idx2 = torch.randint(-1, 32, (B, S, 24), generator=g, dtype=torch.int32)
sinks = torch.randn(H, generator=g)
for kw in (dict(block_v=128, num_splits=2), dict(block_v=256, num_splits=3, block_h=16)):
    for extra_kw in ({}, dict(extra_kv_cache=extra, extra_indices=idx2)):
        out = sparse_mla_decode(q, kv, idx, sinks, scale=D ** -0.5, **extra_kw, **kw)
        want = ref.sparse_mla_decode(q, kv, idx, sinks, scale=D ** -0.5, **extra_kw)
        err = (out - want).abs().max().item() / want.abs().max().item()
        assert err < 1e-5, (kw, list(extra_kw), err)
print("ok")
"""


def test_packed_cache_value_tiles_and_splits_interpreted():
    run_interpreted(SCRIPT)
