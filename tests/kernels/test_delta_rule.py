"""The Triton delta-rule kernel's paths that the conformance cases do not reach, interpreted.

Under the interpreter the wrapper uses one value block per head; here ``block_v=16`` splits Dv
over programs, with GQA (Hv = 2 Hk), q/k as strided views of one projection, packed sequences
(one of them empty) and no initial state; gdn_gated_recurrent with its gate inputs as strided
views. ``TRITON_INTERPRET`` is read when a kernel is
decorated, so the check runs in a fresh interpreter process.
"""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton import delta_rule as tr
from hwinfer.ops import linear_attention as ref
torch.manual_seed(0)
def rel(a, b):
    return ((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()).item()
for per_channel in (False, True):
    B, T, Hk, Hv, Dk, Dv = 1, 7, 2, 4, 16, 32
    proj = torch.randn(B, T, Hk, 3 * Dk)
    q, k = proj[..., :Dk], proj[..., Dk:2 * Dk]
    v = torch.randn(B, T, Hv, Dv)
    g = -torch.rand(B, T, Hv, Dk) if per_channel else -torch.rand(B, T, Hv)
    beta = torch.rand(B, T, Hv)
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    f_t = tr.kda_recurrent if per_channel else tr.gdn_recurrent
    f_r = ref.kda_recurrent if per_channel else ref.gdn_recurrent
    for kw in (dict(cu_seqlens=cu, initial_state=torch.randn(3, Hv, Dk, Dv)), dict(),
               dict(use_qk_l2norm=False, scale=0.3)):
        o1, s1 = f_t(q, k, v, g, beta, block_v=16, **kw)
        o2, s2 = f_r(q, k, v, g, beta, **kw)
        assert o1.shape == o2.shape and s1.shape == s2.shape and s1.dtype == torch.float32
        assert rel(o1, o2) < 1e-5 and rel(s1, s2) < 1e-5, (per_channel, list(kw))
# gdn_gated_recurrent: a, b as strided views of one projection (prefill-like T > 1 and a
# B > 1 decode batch), against the reference that computes the gates first
for B, T, cu in ((1, 7, torch.tensor([0, 3, 3, 7], dtype=torch.int32)), (3, 1, None)):
    Hk, Hv, Dk, Dv = 2, 4, 16, 32
    proj = torch.randn(B, T, Hk, 3 * Dk)
    q, k = proj[..., :Dk], proj[..., Dk:2 * Dk]
    v = torch.randn(B, T, Hv, Dv).bfloat16()
    ab = (torch.randn(B, T, 2 * Hv + 3) * 3).bfloat16()
    b, a = ab[..., :Hv], ab[..., Hv + 3:]
    A_log, dt = torch.rand(Hv) * 3 - 2, torch.randn(Hv)
    n = 3
    kw = dict(cu_seqlens=cu, initial_state=torch.randn(n, Hv, Dk, Dv))
    o1, s1 = tr.gdn_gated_recurrent(q, k, v, a, b, A_log, dt, block_v=16, **kw)
    o2, s2 = ref.gdn_gated_recurrent(q, k, v, a, b, A_log, dt, **kw)
    # beta rounds to bf16 in both (the interpreter truncates where the reference rounds)
    assert rel(o1, o2) < 1e-2 and rel(s1, s2) < 1e-2, (B, T, rel(o1, o2), rel(s1, s2))
print("ok")
"""


def test_split_value_blocks_gqa_varlen_interpreted():
    run_interpreted(SCRIPT, timeout=600)


def test_per_call_check_refuses_unsupported_head_dims():
    import torch

    from hwinfer.kernels.triton.delta_rule import delta_rule_supported

    q = torch.randn(1, 2, 2, 64)
    g, beta = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    assert delta_rule_supported(q, q, torch.randn(1, 2, 2, 64), g, beta) is None
    assert delta_rule_supported(q, q, torch.randn(1, 2, 2, 96), g, beta) is not None   # not 2^n
    assert delta_rule_supported(q, q, torch.randn(1, 2, 2, 512), g, beta) is not None  # > 256
    assert delta_rule_supported(q.double(), q.double(), torch.randn(1, 2, 2, 64), g,
                                beta) is not None
