"""NVIDIA impl table: (op, impl name, target, predicate, priority)."""
from hwinfer.backend import Impl, min_sm

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm", when=min_sm(80),
         priority=10, check="hwinfer.kernels.triton.norm:rms_norm_supported",
         requires=("triton",), interpretable=True),
]
