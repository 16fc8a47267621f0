"""hwinfer's Intel XPU backend: upstream ``torch.xpu`` (IPEX is discontinued), oneCCL (xccl).

Triton kernels run through Intel's Triton backend where the XPU torch wheel brings it; torch
implementations otherwise. Not run on hardware: no Intel GPU is available to this project.
"""
from __future__ import annotations

import torch

from hwinfer.backend import Backend, DeviceInfo

from hwinfer_xpu.impls import IMPLS


def _detect() -> list[DeviceInfo]:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    devices = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        feats = {"bf16", "fp16"}
        if getattr(props, "has_fp64", False):
            feats.add("fp64")
        devices.append(DeviceInfo(vendor="intel", arch=getattr(props, "device_id", "xe") and "xe",
                                  family="xe", features=frozenset(feats), device_type="xpu",
                                  index=i, name=props.name,
                                  memory_bytes=getattr(props, "total_memory", 0)))
    return devices


backend = Backend(
    name="xpu",
    vendors=("intel",),
    detect=_detect,
    impl_table=lambda: list(IMPLS),
    dist_backend="xccl",
    hardware_status="not run on hardware",
)
