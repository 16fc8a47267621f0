"""Intel XPU impl table: portable Triton kernels through Intel's Triton backend, then the
portable torch kernels on torch.xpu."""
from hwinfer.backend import Impl, vendor
from hwinfer.backend.portable import portable_impls

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm", when=vendor("intel"),
         priority=10, check="hwinfer.kernels.triton.norm:rms_norm_supported",
         requires=("triton",), interpretable=True),
    *portable_impls(vendor("intel"), priority=5),
]
