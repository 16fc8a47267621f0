"""DeviceInfo: what a device is, described once, so selection never probes hardware again.

Vendors: ``nvidia``, ``amd``, ``intel``, ``huawei``, ``cpu``. ``arch`` is the compiler's name
(``sm_90``, ``sm_100``, ``gfx942``, ``gfx950``, ``xe-hpc``, ``ascend910b``, ``x86_64``); ``family``
the generation (``hopper``, ``blackwell``, ``cdna3``, ``cdna4``, ``xe``, ``ascend``, ``cpu``);
``features`` capability flags (``fp8``, ``fp4``, ``mxfp4``, ``nvfp4``, ``tma``, ``wgmma``,
``tcgen05``, ``bf16``, ``avx512``, ``amx``, ...), and ``triton_xpu`` / ``triton_npu`` when a Triton
backend for that device (Intel's, Triton-Ascend) is installed.

PyTorch on ROCm reports device type "cuda": AMD is told from NVIDIA by ``torch.version.hip``.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """One accelerator (or the host CPU), as selection sees it."""

    vendor: str
    arch: str
    family: str
    features: frozenset[str] = field(default_factory=frozenset)
    device_type: str = "cpu"  # torch device type: cpu, cuda (NVIDIA and AMD), xpu, npu
    index: int | None = None
    name: str = ""
    memory_bytes: int = 0
    fake: bool = False  # built for tests, no hardware behind it

    @property
    def torch_device(self) -> torch.device:
        if self.device_type == "cpu" or self.index is None:
            return torch.device(self.device_type)
        return torch.device(self.device_type, self.index)

    @property
    def sm(self) -> int | None:
        """NVIDIA compute capability as an integer (``sm_90`` -> 90), else None."""
        if self.vendor == "nvidia" and self.arch.startswith("sm_"):
            digits = "".join(ch for ch in self.arch[3:] if ch.isdigit())
            return int(digits) if digits else None
        return None

    def with_features(self, *extra: str) -> "DeviceInfo":
        return replace(self, features=self.features | frozenset(extra))

    def describe(self) -> str:
        feats = ",".join(sorted(self.features)) or "-"
        where = str(self.torch_device)
        fake = " (fake)" if self.fake else ""
        return f"{where}: {self.name or self.vendor} [{self.vendor} {self.arch} {self.family}; {feats}]{fake}"


# ----------------------------------------------------------------------------------------------
# Architecture tables (shared by detection and by the fake devices used in tests).

def nvidia_family(major: int, minor: int) -> str:
    return {7: "volta" if minor == 0 else "turing", 8: "ampere" if minor in (0, 6) else "ada",
            9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major, "unknown")


def nvidia_features(major: int, minor: int) -> frozenset[str]:
    feats = {"bf16"} if major >= 8 else set()
    if (major, minor) >= (8, 9):
        feats.add("fp8")
    if major == 9:
        feats |= {"tma", "wgmma"}
    if major >= 10:
        feats |= {"tma", "fp4", "mxfp4", "nvfp4"}
        if major == 10:
            feats.add("tcgen05")
    return frozenset(feats)


AMD_ARCHES = {
    "gfx90a": ("cdna2", frozenset({"bf16"})),
    "gfx942": ("cdna3", frozenset({"bf16", "fp8"})),
    "gfx950": ("cdna4", frozenset({"bf16", "fp8", "fp4", "mxfp4"})),
    "gfx1100": ("rdna3", frozenset({"bf16"})),
    "gfx1201": ("rdna4", frozenset({"bf16", "fp8"})),
}


def cpu_info() -> DeviceInfo:
    """The host CPU."""
    machine = platform.machine() or "unknown"
    feats = {"bf16"}
    cap = ""
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch: no capability query
        cap = ""
    if "AVX512" in cap.upper():
        feats.add("avx512")
    if "AVX2" in cap.upper() or "AVX512" in cap.upper():
        feats.add("avx2")
    if cap:
        feats.add(cap.lower())
    return DeviceInfo(vendor="cpu", arch=machine, family="cpu", features=frozenset(feats),
                      device_type="cpu", index=None, name=platform.processor() or machine)


# ----------------------------------------------------------------------------------------------
# Fake devices for selection tests: no hardware is touched.

FAKE_DEVICES: dict[str, DeviceInfo] = {
    "sm_90": DeviceInfo("nvidia", "sm_90", "hopper", nvidia_features(9, 0), "cuda", 0,
                        "NVIDIA H200 (fake)", 141 << 30, fake=True),
    "sm_100": DeviceInfo("nvidia", "sm_100", "blackwell", nvidia_features(10, 0), "cuda", 0,
                         "NVIDIA B200 (fake)", 180 << 30, fake=True),
    "gfx942": DeviceInfo("amd", "gfx942", "cdna3", AMD_ARCHES["gfx942"][1], "cuda", 0,
                         "AMD Instinct MI300X (fake)", 192 << 30, fake=True),
    "gfx950": DeviceInfo("amd", "gfx950", "cdna4", AMD_ARCHES["gfx950"][1], "cuda", 0,
                         "AMD Instinct MI355X (fake)", 288 << 30, fake=True),
    # An XPU torch install as PyTorch's XPU wheels ship it: Intel's Triton backend comes with
    # them (the ``triton_xpu`` feature, set by detection when that backend is installed).
    "xpu": DeviceInfo("intel", "xe-hpc", "xe", frozenset({"bf16", "fp16", "fp64", "dpas",
                                                        "triton_xpu"}), "xpu", 0,
                      "Intel Data Center GPU Max 1550 (fake)", 128 << 30, fake=True),
    "npu": DeviceInfo("huawei", "ascend910b", "ascend", frozenset({"bf16", "fp16"}), "npu", 0,
                      "Ascend 910B (fake)", 64 << 30, fake=True),
    "cpu": DeviceInfo("cpu", "x86_64", "cpu", frozenset({"bf16", "avx2"}), "cpu", None,
                      "x86_64 CPU (fake)", 0, fake=True),
}


def fake_device(name: str) -> DeviceInfo:
    """A DeviceInfo for tests, by arch name: sm_90, sm_100, gfx942, gfx950, xpu, npu, cpu."""
    if name not in FAKE_DEVICES:
        raise KeyError(f"no fake device {name!r}; known: {', '.join(FAKE_DEVICES)}")
    return FAKE_DEVICES[name]
