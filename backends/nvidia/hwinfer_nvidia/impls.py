"""NVIDIA impl table: Triton kernels first, then the portable torch kernels (priority 5) for ops
that have no Triton kernel yet, then the deliberate reference choices."""
from hwinfer.backend import Impl, min_sm, vendor
from hwinfer.backend.portable import portable_impls

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm", when=min_sm(80),
         priority=10, check="hwinfer.kernels.triton.norm:rms_norm_supported",
         requires=("triton",), interpretable=True),
    *portable_impls(vendor("nvidia"), priority=5),
]
