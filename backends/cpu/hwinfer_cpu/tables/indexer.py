"""CPU impls for the indexer family: batched score matmul + masked top-k in torch."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("lightning_indexer", "torch", "hwinfer.kernels.torch.indexer:lightning_indexer",
         when=vendor("cpu"), priority=10),
]
