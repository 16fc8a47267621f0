"""CPU impls for the sparse_mla family: gathered, batched torch versions."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("sparse_mla_prefill", "torch", "hwinfer.kernels.torch.sparse_mla:sparse_mla_prefill",
         when=vendor("cpu"), priority=10),
    Impl("sparse_mla_decode", "torch", "hwinfer.kernels.torch.sparse_mla:sparse_mla_decode",
         when=vendor("cpu"), priority=10),
]
