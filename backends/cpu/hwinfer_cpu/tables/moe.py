"""CPU impls for the moe family.

Routing is a score function, one ``topk`` and a gather: the reference is already what the CPU
does best, so it is listed as the deliberate choice. The expert ops use the grouped torch impls
(one matmul per active expert instead of one matvec per token slot; quantized experts dequantize
only the experts some token chose).
"""
from hwinfer.backend import Impl, vendor

_K = "hwinfer.kernels.torch.moe"

IMPLS = [
    Impl("route_topk", "reference", "hwinfer.ops.moe:route_topk", when=vendor("cpu"), priority=0,
         is_reference=True),
    Impl("route_hash", "reference", "hwinfer.ops.moe:route_hash", when=vendor("cpu"), priority=0,
         is_reference=True),
    Impl("moe_experts", "torch", f"{_K}:moe_experts", when=vendor("cpu"), priority=10),
    Impl("moe_experts_fp8", "torch", f"{_K}:moe_experts_fp8", when=vendor("cpu"), priority=10),
    Impl("moe_experts_fp4", "torch", f"{_K}:moe_experts_fp4", when=vendor("cpu"), priority=10),
    Impl("latent_moe", "torch", f"{_K}:latent_moe", when=vendor("cpu"), priority=10),
]
