"""CPU impls for the block_sparse family: chunked torch versions (causal key truncation; the
attention gathers each chunk's union of selected blocks)."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("block_sparse_indexer", "torch", "hwinfer.kernels.torch.block_sparse:block_sparse_indexer",
         when=vendor("cpu"), priority=10),
    Impl("block_sparse_attention", "torch", "hwinfer.kernels.torch.block_sparse:block_sparse_attention",
         when=vendor("cpu"), priority=10),
]
