"""Paths of the Triton paged-attention and causal-conv1d kernels that the conformance cases do
not reach, interpreted (``TRITON_INTERPRET`` is read at decoration, hence a fresh process).

paged_attention: Sq = 8 with several row blocks per kv head, many splits (those before the
window or past the end exit, table entries there are -1), one split (no combine), an odd block
size (5), Dk != Dv, q fp32 over an fp16 cache, NaN in unwritten slots, window + sinks + gate;
the default splits, which share each sequence's visible keys on the device (with and without a
window); the merge done by each row block's last split (``COMBINE_IN_SPLIT``).
causal_conv1d: an empty packed sequence, chunks shorter than K-1 (state read across chunks),
K = 1 and 2, an fp32 state with fp16 inputs.
"""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton import paged_attention as pa, conv as cv
from hwinfer.ops import attention_paged as ref_pa, conv as ref_cv
def rel(a, b):
    return ((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()).item()
gen = torch.Generator().manual_seed(0)
for lens, sq, hq, hkv, dk, dv, bs, extra, kw in (
        ([40, 8, 77], 8, 8, 2, 32, 32, 16, dict(window=20, sinks=True, gate=True), dict(block_m=16, split=16)),
        ([33, 9], 2, 4, 1, 32, 64, 5, dict(window=7, unused="big"), dict(split=8)),
        ([60, 3], 1, 4, 2, 48, None, 16, dict(sinks=True), dict(split=4096)),
        ([25, 64], 4, 4, 4, 16, 16, 8, dict(gate=True), {}),
        ([90, 30], 1, 4, 2, 32, None, 8, dict(window=24, sinks=True, unused="big"), {})):
    inputs = ref_pa._paged_case(lens, sq, hq, hkv, dk, dv, bs, **extra)(gen, torch.float16, "cpu")
    want = ref_pa.paged_attention(**inputs)
    assert pa.paged_attention_supported(**inputs) is None
    got = pa.paged_attention(**inputs, **kw)
    assert got.shape == want.shape and not got.isnan().any() and rel(got, want) < 2e-3, (lens, kw)
    inputs["q"] = inputs["q"].float()  # q in another dtype than the cache
    got = pa.paged_attention(**inputs, **kw)
    assert got.dtype == torch.float32 and rel(got, ref_pa.paged_attention(**inputs)) < 2e-3
# COMBINE_IN_SPLIT: the last live split of each row block merges the partials (a ticket each),
# equal bit for bit to the combine kernel's merge, tickets back at rest after every call; a
# sequence with no visible key (length 0) still gets its rows written (zeros, as the combine).
from hwinfer.kernels.triton.resting import held_words
empty_alloc = torch.empty
def poisoned_empty(*args, **kwargs):   # outputs and partials NaN until written
    t = empty_alloc(*args, **kwargs)
    return t.fill_(float("nan")) if t.is_floating_point() else t
torch.empty = poisoned_empty
for lens, sq, hq, hkv, dk, dv, bs, extra, kw in (
        ([40, 8, 77], 8, 8, 2, 32, 32, 16, dict(window=20, sinks=True, gate=True), dict(block_m=16, split=16)),
        ([90, 30], 1, 4, 2, 32, None, 8, dict(window=24, sinks=True), {}),
        ([33, 9], 2, 4, 1, 32, 64, 5, dict(gate=True), dict(split=8))):
    inputs = ref_pa._paged_case(lens, sq, hq, hkv, dk, dv, bs, **extra)(gen, torch.float16, "cpu")
    for empty in (False, True):
        if empty:
            inputs["seq_lens"][1] = 0
        pa.COMBINE_IN_SPLIT = False
        two = pa.paged_attention(**inputs, **kw)
        pa.COMBINE_IN_SPLIT = True
        one = torch.full_like(two, float("nan"))
        for _ in range(2):   # twice: the tickets must be at rest for the second call
            one = pa.paged_attention(**inputs, **kw)
            assert not one.isnan().any() and torch.equal(one, two), (lens, kw, empty)
        assert all((w[0] == 0).all() for w in held_words("paged_attention", "cpu")), lens
        if not empty:
            assert rel(one, ref_pa.paged_attention(**inputs)) < 2e-3, (lens, kw)
        else:
            assert (one[1] == 0).all(), lens
pa.COMBINE_IN_SPLIT = False
torch.empty = empty_alloc
assert held_words("paged_attention", "cpu"), "the fused form never ran"
for K, kw in ((4, dict(chunk=2, cu=[0, 3, 3, 9, 10])), (2, dict(cu=[0, 0, 5])), (1, dict()),
              (3, dict(chunk=1, state32=True))):
    C = 40
    cu = kw.get("cu")
    T = cu[-1] if cu else 6
    B = 1 if cu else 2
    n = len(cu) - 1 if cu else B
    x = torch.randn(B, T, C, generator=gen).half()
    w = torch.randn(C, K, generator=gen).half()
    st = torch.randn(n, C, K - 1, generator=gen)
    st = st if kw.get("state32") else st.half()
    cus = torch.tensor(cu, dtype=torch.int32) if cu else None
    y1, s1 = cv.causal_conv1d(x, w, None, st, cu_seqlens=cus, chunk=kw.get("chunk"))
    y2, s2 = ref_cv.causal_conv1d(x, w, None, st, cu_seqlens=cus)
    assert s1.dtype == s2.dtype and (s1 == s2).all(), (K, kw)
    assert (y1.float() - y2.float()).abs().max().item() < 2e-3, (K, kw)
print("ok")
"""


def test_uncovered_paths_interpreted():
    run_interpreted(SCRIPT, timeout=600)


def test_per_call_checks_refuse_uncovered_shapes():
    import torch

    from hwinfer.kernels.triton.conv import causal_conv1d_supported
    from hwinfer.kernels.triton.paged_attention import paged_attention_supported

    table, lens = torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    q, kc = torch.randn(1, 1, 4, 64), torch.randn(4, 16, 2, 64)
    assert paged_attention_supported(q, kc, kc, table, lens) is None
    # any width up to 576 (padded and masked), e.g. a 40-wide MLA latent; not a strided head dim
    assert paged_attention_supported(q[..., :40], kc[..., :40], None, table, lens) is None
    assert paged_attention_supported(q, kc.transpose(1, 3).contiguous().transpose(1, 3), None,
                                     table, lens) is not None
    big = torch.randn(1, 1, 4, 640)
    assert paged_attention_supported(big, torch.randn(1, 16, 2, 640), None, table, lens) is not None
    assert paged_attention_supported(torch.randn(1, 17, 4, 64), kc, kc, table, lens) is not None
    x = torch.randn(1, 3, 8)
    assert causal_conv1d_supported(x, torch.randn(8, 4)) is None
    assert causal_conv1d_supported(x, torch.randn(8, 5)) is not None


def test_merge_in_split_on_cuda(monkeypatch):
    """On a CUDA device: the merge done by each row block's last split equals the combine
    kernel's bit for bit with many live splits a row block (so the tickets really race):
    Qwen3.5's decode shape, 4 sequences of 1k-8k keys, twice each."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from hwinfer.kernels.triton import paged_attention as pa
    from hwinfer.ops import attention_paged as ref_pa

    gen = torch.Generator().manual_seed(0)
    inputs = ref_pa._paged_case([1024, 4100, 8192, 77], 1, 8, 2, 256, 256, 64,
                                gate=True)(gen, torch.bfloat16, "cuda")
    monkeypatch.setattr(pa, "COMBINE_IN_SPLIT", False)
    two = pa.paged_attention(**inputs)
    monkeypatch.setattr(pa, "COMBINE_IN_SPLIT", True)
    for _ in range(2):
        one = pa.paged_attention(**inputs)
        assert torch.equal(one, two)
