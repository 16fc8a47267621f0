"""hwinfer's Ascend NPU backend: torch_npu fused ops, Triton-Ascend where installed, HCCL.

torch_npu is imported lazily and only when installed: an installed torch_npu without the CANN
toolkit breaks ``import torch`` itself (its autoload hook fails), so nothing here runs at
``import hwinfer`` time and ``import hwinfer_npu`` never imports it. Not run on hardware: no
Ascend device is available to this project, so nothing here counts as validated.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from hwinfer.backend import Backend, DeviceInfo

from hwinfer_npu.impls import all_impls


def ascend_triton_present() -> bool:
    """Whether the installed ``triton`` is Triton-Ascend (it installs as module ``triton`` with
    its own backend folder); looks at the files, imports nothing."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(p) / "backends" / name).is_dir()
               for p in spec.submodule_search_locations for name in ("ascend", "huawei"))


def arch_from_name(name: str) -> str:
    """"Ascend910B3" -> "ascend910b3"; the compiler's SoC name, lower-cased."""
    return name.lower().replace(" ", "") or "ascend"


def _detect() -> list[DeviceInfo]:
    if importlib.util.find_spec("torch_npu") is None:
        return []
    import torch
    try:
        import torch_npu  # noqa: F401  (registers the "npu" device type)
    except Exception as exc:  # no CANN, or a torch_npu built for another torch
        raise RuntimeError(f"torch_npu is installed but does not import: {type(exc).__name__}: {exc}") from exc

    if not torch.npu.is_available():
        return []
    feats = {"bf16", "fp16"} | ({"triton_npu"} if ascend_triton_present() else set())
    devices = []
    for i in range(torch.npu.device_count()):
        name = torch.npu.get_device_name(i)
        devices.append(DeviceInfo(vendor="huawei", arch=arch_from_name(name), family="ascend",
                                  features=frozenset(feats), device_type="npu", index=i, name=name))
    return devices


backend = Backend(
    name="npu",
    vendors=("huawei",),
    detect=_detect,
    impl_table=all_impls,
    dist_backend="hccl",
    hardware_status="not run on hardware",
)
