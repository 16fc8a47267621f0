"""hwinfer's AMD backend: ROCm devices (CDNA3 gfx942, CDNA4 gfx950, ...), Triton kernels, RCCL.

PyTorch on ROCm reports device type "cuda"; this backend claims those devices when
``torch.version.hip`` is set and reads the gfx arch name from the device properties.
"""
from __future__ import annotations

import torch

from hwinfer.backend import Backend, DeviceInfo
from hwinfer.backend.device import AMD_ARCHES

from hwinfer_amd.impls import IMPLS


def _detect() -> list[DeviceInfo]:
    if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return []
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gfx = getattr(props, "gcnArchName", "gfx").split(":")[0]
        family, feats = AMD_ARCHES.get(gfx, ("unknown", frozenset({"bf16"})))
        devices.append(DeviceInfo(vendor="amd", arch=gfx, family=family, features=feats,
                                  device_type="cuda", index=i, name=props.name,
                                  memory_bytes=props.total_memory))
    return devices


backend = Backend(
    name="amd",
    vendors=("amd",),
    detect=_detect,
    impl_table=lambda: list(IMPLS),
    dist_backend="nccl",  # torch.distributed's "nccl" is RCCL on ROCm builds
    hardware_status="compiled and interpreted, not run on hardware",
)
