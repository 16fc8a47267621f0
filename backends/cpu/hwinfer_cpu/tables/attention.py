"""CPU impls for the dense attention family (varlen prefill and paged decode)."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("attention", "torch", "hwinfer.kernels.torch.attention:attention", when=vendor("cpu"),
         priority=10, check="hwinfer.kernels.torch.attention:check_attention_impl",
         note="fused SDPA per sequence; sinks through the CPU flash kernel's log-sum-exp"),
    Impl("paged_attention", "torch", "hwinfer.kernels.torch.attention:paged_attention",
         when=vendor("cpu"), priority=10,
         note="one gather of the visible slots, then batched GQA-grouped matmuls"),
]
