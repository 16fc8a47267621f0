"""Impl records and the Backend description every vendor package exports.

A backend package (``backends/<vendor>/hwinfer_<vendor>``) exposes one :class:`Backend` object
through the entry-point group ``hwinfer.backends``; an out-of-tree vendor plugs in the same way.
It says which devices it serves, how to detect them, which implementations it offers (a short
table of :class:`Impl` records) and which torch.distributed backend its devices use.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

from hwinfer.backend.device import DeviceInfo
from hwinfer.backend.predicates import ANY, Pred


def load_target(target: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` and return the function."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"target {target!r} must look like 'module:function'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{module_name} has no attribute {attr!r}") from None


@dataclass(frozen=True)
class Impl:
    """One implementation of one op.

    ``target`` and ``check`` are ``"module:function"`` strings imported only when the impl is
    bound, so listing a Triton or vendor-library impl costs nothing where it cannot run.
    ``check(**inputs)`` (the op's arguments, always by name) is an optional cheap per-call test (shape / dtype limits) returning None
    when the call is supported, else the reason; a refused call goes to the next candidate.
    Higher ``priority`` wins. ``requires`` names Python packages that must be importable.
    ``interpretable`` marks Triton kernels the conformance suite may run under TRITON_INTERPRET=1.
    ``is_reference`` marks a backend's deliberate choice of the reference itself (for ops where
    plain torch is already the best this device can do), so strict mode accepts it.
    """

    op: str
    name: str
    target: str
    when: Pred = ANY
    priority: int = 0
    check: str | None = None
    requires: tuple[str, ...] = ()
    interpretable: bool = False
    is_reference: bool = False
    note: str = ""
    backend: str = ""

    def load(self) -> Callable[..., Any]:
        return load_target(self.target)

    def load_check(self) -> Callable[..., str | None] | None:
        return load_target(self.check) if self.check else None

    def missing_packages(self) -> list[str]:
        return [pkg for pkg in self.requires if importlib.util.find_spec(pkg) is None]

    @property
    def qualname(self) -> str:
        return f"{self.backend}.{self.name}" if self.backend else self.name


@dataclass
class Backend:
    """What a vendor package announces (see module docstring)."""

    name: str
    vendors: tuple[str, ...]
    detect: Callable[[], list[DeviceInfo]]
    impl_table: Callable[[], list[Impl]]
    dist_backend: str = "gloo"
    # Where this backend's implementations have actually been run; printed by `hwinfer info`
    # and the support matrix. Nothing counts as validated unless it ran on that hardware.
    hardware_status: str = "not run on hardware"
    _impls: list[Impl] | None = field(default=None, repr=False)

    def impls(self) -> list[Impl]:
        """The impl table with ``backend`` filled in; built once."""
        if self._impls is None:
            table = []
            for impl in self.impl_table():
                if impl.backend and impl.backend != self.name:
                    raise ValueError(f"impl {impl.name} of op {impl.op} names backend {impl.backend}")
                table.append(Impl(**{**impl.__dict__, "backend": self.name}))
            self._impls = table
        return self._impls

    def serves(self, dev: DeviceInfo) -> bool:
        return dev.vendor in self.vendors
