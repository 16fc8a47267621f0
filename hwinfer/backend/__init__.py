"""Devices, capability predicates, impl records, backend discovery and selection (the OpTable)."""
from hwinfer.backend.device import DeviceInfo, cpu_info, fake_device, FAKE_DEVICES
from hwinfer.backend.discovery import (
    DeviceNotFound, backend_errors, backends, detect_devices, get_backend, register_backend,
    resolve_device, unregister_backend,
)
from hwinfer.backend.predicates import ANY, Pred, arch, device_type, family, has, min_sm, vendor
from hwinfer.backend.registry import Backend, Impl, load_target
from hwinfer.backend.select import REFERENCE, OpTable, SelectionError, select

__all__ = [
    "ANY", "Backend", "DeviceInfo", "DeviceNotFound", "FAKE_DEVICES", "Impl", "OpTable", "Pred",
    "REFERENCE", "SelectionError", "arch", "backend_errors", "backends", "cpu_info",
    "detect_devices", "device_type", "fake_device", "family", "get_backend", "has", "load_target",
    "min_sm", "register_backend", "resolve_device", "select", "unregister_backend", "vendor",
]
