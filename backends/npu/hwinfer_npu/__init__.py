"""hwinfer's Ascend NPU backend: torch_npu fused ops, HCCL.

torch_npu is imported lazily and only when installed: an installed torch_npu without the CANN
toolkit breaks ``import torch`` itself (its autoload hook fails), so nothing here runs at
``import hwinfer`` time. Not run on hardware: no Ascend device is available to this project.
"""
from __future__ import annotations

import importlib.util

from hwinfer.backend import Backend, DeviceInfo

from hwinfer_npu.impls import IMPLS


def _detect() -> list[DeviceInfo]:
    if importlib.util.find_spec("torch_npu") is None:
        return []
    import torch
    import torch_npu  # noqa: F401  (registers the "npu" device type)

    if not torch.npu.is_available():
        return []
    devices = []
    for i in range(torch.npu.device_count()):
        name = torch.npu.get_device_name(i)
        arch = name.lower().replace(" ", "") or "ascend"
        devices.append(DeviceInfo(vendor="huawei", arch=arch, family="ascend",
                                  features=frozenset({"bf16", "fp16"}), device_type="npu",
                                  index=i, name=name))
    return devices


backend = Backend(
    name="npu",
    vendors=("huawei",),
    detect=_detect,
    impl_table=lambda: list(IMPLS),
    dist_backend="hccl",
    hardware_status="not run on hardware",
)
