"""Paths of the Triton varlen prefill attention that the conformance cases do not reach,
interpreted (``TRITON_INTERPRET`` is read at decoration, hence a fresh process): many sequences
with empty ones among them (the program -> sequence search, one program per empty sequence),
lengths on and off the 16-row tile edges, chunked-prefill continuations (q_len < k_len) with a
window wider than a tile (all three key loops), sinks with V = K, q / k / v as strided views of
one packed projection, fp16 against the fp32 reference, a refused mismatch of the two bounds.
"""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton import attention as tri
from hwinfer.ops import attention as ref
def rel(a, b):
    return ((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()).item()
gen = torch.Generator().manual_seed(0)
for q_lens, k_lens, hq, hkv, dk, dv, kw in (
        ([16, 0, 33, 1, 0, 47, 16, 5, 32], [16, 0, 40, 9, 3, 47, 80, 5, 32], 4, 2, 32, 32, {}),
        ([70, 17], [101, 17], 4, 1, 32, None, dict(window=40, sinks=True)),
        ([64, 3, 50], [64, 20, 90], 2, 2, 48, 24, dict(window=33, gate=True)),
        ([0, 0, 12], [5, 0, 12], 4, 4, 16, 16, dict(causal=False))):
    make = ref._varlen_case(q_lens, k_lens, hq, hkv, dk, dv, **kw)
    for dtype in (torch.float32, torch.float16):
        inputs = make(gen, dtype, "cpu")
        want = ref.attention(**{n: x.float() if torch.is_tensor(x) and x.is_floating_point() else x
                                for n, x in inputs.items()})
        got = tri.attention(**inputs)
        assert got.dtype == dtype and got.shape == want.shape, (q_lens, dtype)
        assert not got.isnan().any(), (q_lens, dtype)
        tol = 2e-5 if dtype == torch.float32 else 2e-3
        assert rel(got, want) < tol, (q_lens, dtype, rel(got, want))
# q / k / v as token-strided views of one packed [T, (Hq + 2 Hkv) * D] projection
t, hq, hkv, d = 50, 4, 2, 32
packed = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
q, k, v = packed.split([hq * d, hkv * d, hkv * d], dim=-1)
q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
cu = torch.tensor([0, 20, 50], dtype=torch.int32)
want = ref.attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, scale=d ** -0.5)
got = tri.attention(q, k, v, cu, cu, scale=d ** -0.5)
assert rel(got, want) < 2e-5
# mismatched sequence counts are refused by name
try:
    tri.attention(q, k, v, cu, cu[:2], scale=1.0)
except ValueError as err:
    assert "cu_seqlens_q" in str(err)
else:
    raise AssertionError("mismatched cu_seqlens accepted")
print("ok")
"""


def test_varlen_attention_paths_interpreted():
    run_interpreted(SCRIPT)
