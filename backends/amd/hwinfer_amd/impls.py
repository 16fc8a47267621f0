"""AMD impl table. Same portable Triton kernels as NVIDIA, listed (and tuned) separately so an
AMD change never alters NVIDIA selection."""
from hwinfer.backend import Impl, family

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm",
         when=family("cdna3", "cdna4", "rdna3", "rdna4"), priority=10,
         check="hwinfer.kernels.triton.norm:rms_norm_supported", requires=("triton",),
         interpretable=True),
]
