"""AMD impl table. Same portable Triton kernels as NVIDIA, listed (and tuned) separately so an
AMD change never alters NVIDIA selection; portable torch kernels behind them."""
from hwinfer.backend import Impl, family, vendor
from hwinfer.backend.portable import portable_impls

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm",
         when=family("cdna3", "cdna4", "rdna3", "rdna4"), priority=10,
         check="hwinfer.kernels.triton.norm:rms_norm_supported", requires=("triton",),
         interpretable=True),
    *portable_impls(vendor("amd"), priority=5),
]
