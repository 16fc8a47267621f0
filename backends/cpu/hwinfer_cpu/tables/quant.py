"""CPU impls for the quant family: table-gather FP4 / broadcast FP8 dequantization and the
fp32 matmuls built on them (``hwinfer.kernels.torch.quant``)."""
from hwinfer.backend import Impl, vendor

_K = "hwinfer.kernels.torch.quant"

IMPLS = [
    Impl("dequant_fp8_block", "torch", f"{_K}:dequant_fp8_block", when=vendor("cpu"), priority=10),
    Impl("dequant_fp4", "torch", f"{_K}:dequant_fp4", when=vendor("cpu"), priority=10),
    Impl("linear_fp8_block", "torch", f"{_K}:linear_fp8_block", when=vendor("cpu"), priority=10),
    Impl("linear_fp4", "torch", f"{_K}:linear_fp4", when=vendor("cpu"), priority=10),
]
