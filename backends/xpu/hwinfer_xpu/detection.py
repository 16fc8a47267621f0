"""Intel GPU detection through upstream ``torch.xpu`` (IPEX is discontinued and not used).

Arch and family come from the device name, because that is the one property every torch.xpu
build reports the same way; capability flags come from the documented boolean properties where
the build has them. Not run on hardware: written against torch.xpu's documented API.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import torch

from hwinfer.backend import DeviceInfo

# (pattern on the device name, arch, family); first match wins. Families are the Xe
# generations (xe: Xe-LP/HPG/HPC/LPG, xe2: Battlemage/Lunar Lake, xe3: Panther Lake).
_NAME_TABLE: tuple[tuple[str, str, str], ...] = (
    (r"data center gpu max", "xe-hpc", "xe"),            # Ponte Vecchio (Max 1100/1550)
    (r"data center gpu flex", "xe-hpg", "xe"),           # Arctic Sound-M (Flex 140/170)
    (r"arc.*\b1[0-9]0v\b", "xe2-lpg", "xe2"),            # Lunar Lake iGPU (Arc 130V/140V)
    (r"arc.*\bb3[0-9]0\b", "xe3-lpg", "xe3"),            # Panther Lake iGPU (Arc B370/B390)
    (r"arc.*\b(pro )?b[5-9][0-9]{1,2}\b", "xe2-hpg", "xe2"),  # Battlemage (B570/B580, Pro B50/B60)
    (r"arc.*\b(pro )?a[0-9]{2,3}m?\b", "xe-hpg", "xe"),  # Alchemist (A380..A770, Pro A60)
    (r"arc", "xe-lpg", "xe"),                            # Meteor/Arrow Lake "Arc Graphics"
    (r"iris|uhd", "xe-lp", "xe"),                        # Tiger Lake and later integrated
)


def arch_from_name(name: str) -> tuple[str, str]:
    """(arch, family) for an Intel GPU name, e.g. "Intel(R) Data Center GPU Max 1550"."""
    text = re.sub(r"\((r|tm)\)", "", name.lower())
    for pattern, arch, family in _NAME_TABLE:
        if re.search(pattern, text):
            return arch, family
    return "xe", "xe"


def intel_triton_present() -> bool:
    """Whether the installed ``triton`` carries Intel's XPU backend (``triton/backends/intel``).

    Looks at the package's files without importing triton: the XPU torch wheel brings Intel's
    Triton as module ``triton``; an upstream triton without that backend cannot target XPU.
    """
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(p) / "backends" / "intel").is_dir() for p in spec.submodule_search_locations)


def features_of(props: object, triton_backend: bool) -> frozenset[str]:
    """Capability flags from torch.xpu device properties (missing properties count as absent)."""
    feats = {"bf16"}
    for prop, flag in (("has_fp16", "fp16"), ("has_fp64", "fp64"),
                       ("has_subgroup_matrix_multiply_accumulate", "dpas"),
                       ("has_subgroup_2d_block_io", "block_io_2d")):
        if getattr(props, prop, False):
            feats.add(flag)
    if triton_backend:
        feats.add("triton_xpu")
    return frozenset(feats)


def detect() -> list[DeviceInfo]:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    triton_backend = intel_triton_present()
    devices = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        name = getattr(props, "name", "") or xpu.get_device_name(i)
        arch, family = arch_from_name(name)
        devices.append(DeviceInfo(vendor="intel", arch=arch, family=family,
                                  features=features_of(props, triton_backend), device_type="xpu",
                                  index=i, name=name,
                                  memory_bytes=int(getattr(props, "total_memory", 0) or 0)))
    return devices
