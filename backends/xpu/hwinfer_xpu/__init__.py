"""hwinfer's Intel XPU backend: upstream ``torch.xpu`` (IPEX is discontinued), oneCCL (xccl).

Triton kernels run through Intel's Triton backend where the XPU torch wheel brings it (the
device then carries the ``triton_xpu`` feature); the portable torch kernels otherwise.
Not run on hardware: no Intel GPU is available to this project, so nothing here is validated.
"""
from __future__ import annotations

from hwinfer.backend import Backend

from hwinfer_xpu.detection import detect
from hwinfer_xpu.impls import all_impls

backend = Backend(
    name="xpu",
    vendors=("intel",),
    detect=detect,
    impl_table=all_impls,
    dist_backend="xccl",
    hardware_status="not run on hardware",
)
