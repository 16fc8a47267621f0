"""hwinfer's NVIDIA backend: CUDA devices (Hopper, Blackwell, ...), Triton kernels, NCCL.

Detection reads the compute capability once; AMD GPUs also report device type "cuda" and are
left to the AMD backend (``torch.version.hip`` tells them apart).
"""
from __future__ import annotations

import torch

from hwinfer.backend import Backend, DeviceInfo
from hwinfer.backend.device import nvidia_family, nvidia_features

from hwinfer_nvidia.impls import IMPLS


def _detect() -> list[DeviceInfo]:
    if getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return []
    devices = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        props = torch.cuda.get_device_properties(i)
        devices.append(DeviceInfo(
            vendor="nvidia", arch=f"sm_{major}{minor}", family=nvidia_family(major, minor),
            features=nvidia_features(major, minor), device_type="cuda", index=i,
            name=props.name, memory_bytes=props.total_memory))
    return devices


backend = Backend(
    name="nvidia",
    vendors=("nvidia",),
    detect=_detect,
    impl_table=lambda: list(IMPLS),
    dist_backend="nccl",
    hardware_status="strict conformance suite passed on an H200 (sm_90) 2026-12-01 and on an H100 (sm_90) 2026-12-05 at 1137b7c, sparse MLA again on an H100 2026-12-06 at 386cf69, chunked GDN / KDA at 59e497a (docs/hardware-runs.md); sm_100 compiled and interpreted only",
)
