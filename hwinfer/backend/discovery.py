"""Finding backends (entry points) and devices, and turning a device string into a DeviceInfo.

hwinfer never imports a backend package by name: backends announce themselves through the
entry-point group ``hwinfer.backends``. A backend that fails to import is reported (``hwinfer
info`` shows the error) and skipped; it never breaks ``import hwinfer``.
"""
from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass

from hwinfer.backend.device import DeviceInfo
from hwinfer.backend.registry import Backend

ENTRY_POINT_GROUP = "hwinfer.backends"


@dataclass(frozen=True)
class BackendLoadError:
    name: str
    target: str
    error: str


_EXTRA: dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Add a backend in-process (tests, notebooks); entry points remain the normal route."""
    _EXTRA[backend.name] = backend
    _load_entry_points.cache_clear()
    detect_devices.cache_clear()


def unregister_backend(name: str) -> None:
    _EXTRA.pop(name, None)
    _load_entry_points.cache_clear()
    detect_devices.cache_clear()


@functools.lru_cache(maxsize=1)
def _load_entry_points() -> tuple[tuple[Backend, ...], tuple[BackendLoadError, ...]]:
    found: dict[str, Backend] = {}
    errors: list[BackendLoadError] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if not isinstance(obj, Backend):
                raise TypeError(f"entry point gives {type(obj).__name__}, expected hwinfer Backend")
            found.setdefault(obj.name, obj)
        except Exception as exc:  # a broken vendor package must not break hwinfer
            errors.append(BackendLoadError(ep.name, ep.value, f"{type(exc).__name__}: {exc}"))
    found.update(_EXTRA)
    return tuple(found[name] for name in sorted(found)), tuple(errors)


def backends() -> tuple[Backend, ...]:
    """Every backend installed (announced through entry points or registered in-process)."""
    return _load_entry_points()[0]


def backend_errors() -> tuple[BackendLoadError, ...]:
    """Backends that were announced but failed to load, with the error."""
    return _load_entry_points()[1]


def get_backend(name: str) -> Backend:
    for b in backends():
        if b.name == name:
            return b
    known = ", ".join(b.name for b in backends()) or "none"
    raise KeyError(f"no backend named {name!r} is installed (installed: {known})")


@dataclass(frozen=True)
class DetectError:
    backend: str
    error: str


@functools.lru_cache(maxsize=1)
def detect_devices() -> tuple[tuple[DeviceInfo, ...], tuple[DetectError, ...]]:
    """All devices every installed backend can see (the CPU always among them)."""
    devices: list[DeviceInfo] = []
    errors: list[DetectError] = []
    for b in backends():
        try:
            devices.extend(b.detect())
        except Exception as exc:  # a vendor runtime that is present but broken
            errors.append(DetectError(b.name, f"{type(exc).__name__}: {exc}"))
    return tuple(devices), tuple(errors)


class DeviceNotFound(RuntimeError):
    """The device a user asked for is not there; the message lists what is."""


def resolve_device(spec: str = "auto") -> DeviceInfo:
    """Turn ``cpu``, ``cuda``, ``cuda:N``, ``xpu[:N]``, ``npu[:N]`` or ``auto`` into a DeviceInfo.

    ``cuda`` covers NVIDIA and AMD (PyTorch on ROCm reports "cuda"). ``auto`` picks the first
    accelerator found, else the CPU.
    """
    devices, errors = detect_devices()
    text = spec.strip().lower()
    if text == "auto":
        accel = [d for d in devices if d.device_type != "cpu"]
        if accel:
            return accel[0]
        text = "cpu"
    kind, _, idx = text.partition(":")
    if kind not in ("cpu", "cuda", "xpu", "npu"):
        raise DeviceNotFound(f"unknown device {spec!r}: use cpu, cuda[:N], xpu[:N], npu[:N] or auto")
    if idx and not idx.isdigit():
        raise DeviceNotFound(f"bad device index in {spec!r}: expected e.g. {kind}:0")
    index = int(idx) if idx else None
    for d in devices:
        if d.device_type != kind:
            continue
        if kind == "cpu" or index is None or d.index == index:
            return d
    lines = [f"device {spec!r} is not available."]
    lines.append("Devices found: " + (", ".join(str(d.torch_device) for d in devices) or "none"))
    lines.append("Backends installed: " + (", ".join(b.name for b in backends()) or "none"))
    for e in errors:
        lines.append(f"Backend {e.backend} failed to detect devices: {e.error}")
    for e in backend_errors():
        lines.append(f"Backend {e.name} failed to load: {e.error}")
    raise DeviceNotFound("\n".join(lines))
