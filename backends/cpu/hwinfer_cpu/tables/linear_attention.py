"""CPU impls for the linear_attention family.

The delta-rule ops go to ``hwinfer.kernels.torch.linear_attention``: a fused single-token step
for decode and the chunked WY algorithm, batched over sequences, heads and chunks, for prefill
(also for the ``*_recurrent`` ops, whose contract it satisfies exactly up to rounding). The
gates are one elementwise expression each; the reference is already what the CPU can do.
"""
from hwinfer.backend import Impl, vendor

_K = "hwinfer.kernels.torch.linear_attention"

IMPLS = [
    Impl("gdn_recurrent", "torch", f"{_K}:gdn_recurrent", when=vendor("cpu"), priority=10),
    Impl("gdn_chunked", "torch", f"{_K}:gdn_chunked", when=vendor("cpu"), priority=10),
    Impl("kda_recurrent", "torch", f"{_K}:kda_recurrent", when=vendor("cpu"), priority=10),
    Impl("kda_chunked", "torch", f"{_K}:kda_chunked", when=vendor("cpu"), priority=10),
    Impl("gdn_gate", "reference", "hwinfer.ops.linear_attention:gdn_gate", when=vendor("cpu"),
         priority=0, is_reference=True),
    Impl("kda_gate", "reference", "hwinfer.ops.linear_attention:kda_gate", when=vendor("cpu"),
         priority=0, is_reference=True),
]
