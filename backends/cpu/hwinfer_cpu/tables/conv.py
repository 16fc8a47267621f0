"""CPU impls for the conv family: ``causal_conv1d`` with all sequences in one channels-last
buffer and the taps accumulated in place (faster here than a depthwise ``F.conv1d``)."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("causal_conv1d", "torch", "hwinfer.kernels.torch.conv:causal_conv1d", when=vendor("cpu"),
         priority=10),
]
