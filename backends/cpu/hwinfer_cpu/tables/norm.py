"""CPU impls for RMSNorm."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("rms_norm", "torch", "hwinfer.kernels.torch.norm:rms_norm", when=vendor("cpu"),
         priority=10),
    Impl("rms_norm_gated", "torch", "hwinfer.kernels.torch.norm:rms_norm_gated",
         when=vendor("cpu"), priority=10),
]
