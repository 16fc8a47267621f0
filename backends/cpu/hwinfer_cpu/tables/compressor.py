"""CPU impls for the compressor family: vectorised torch (all windows / all requests at once)."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("kv_compress", "torch", "hwinfer.kernels.torch.compressor:kv_compress",
         when=vendor("cpu"), priority=10),
    Impl("kv_compress_step", "torch", "hwinfer.kernels.torch.compressor:kv_compress_step",
         when=vendor("cpu"), priority=10),
]
