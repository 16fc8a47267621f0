"""Intel XPU impl table: portable Triton kernels through Intel's Triton backend."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm", when=vendor("intel"),
         priority=10, check="hwinfer.kernels.triton.norm:rms_norm_supported",
         requires=("triton",), interpretable=True),
]
