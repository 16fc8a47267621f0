"""Printable capability predicates over DeviceInfo.

A predicate answers "may this implementation run on that device?" and, when it may not, says
why in words a user can act on (``hwinfer info`` prints them). Predicates compose with ``&``,
``|`` and ``~`` and print as the expression they are: ``vendor=nvidia & sm>=90 & has(fp8)``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from hwinfer.backend.device import DeviceInfo


class Pred(ABC):
    """Base predicate: ``pred(dev)`` -> bool; ``pred.why_not(dev)`` -> reason or None."""

    def __call__(self, dev: DeviceInfo) -> bool:
        return self.why_not(dev) is None

    @abstractmethod
    def why_not(self, dev: DeviceInfo) -> str | None:
        """None when the device qualifies, else the reason it does not."""

    def __and__(self, other: "Pred") -> "Pred":
        return _All((self, other))

    def __or__(self, other: "Pred") -> "Pred":
        return _Any((self, other))

    def __invert__(self) -> "Pred":
        return _Not(self)

    def __repr__(self) -> str:
        return str(self)


@dataclass(frozen=True, repr=False)
class _Test(Pred):
    text: str
    test: Callable[[DeviceInfo], bool]
    describe: Callable[[DeviceInfo], str]

    def why_not(self, dev: DeviceInfo) -> str | None:
        return None if self.test(dev) else f"needs {self.text}, device has {self.describe(dev)}"

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, repr=False)
class _All(Pred):
    parts: tuple[Pred, ...]

    def why_not(self, dev: DeviceInfo) -> str | None:
        for part in self.parts:
            reason = part.why_not(dev)
            if reason:
                return reason
        return None

    def __and__(self, other: Pred) -> Pred:
        return _All(self.parts + (other,))

    def __str__(self) -> str:
        return " & ".join(f"({p})" if isinstance(p, _Any) else str(p) for p in self.parts)


@dataclass(frozen=True, repr=False)
class _Any(Pred):
    parts: tuple[Pred, ...]

    def why_not(self, dev: DeviceInfo) -> str | None:
        reasons = []
        for part in self.parts:
            reason = part.why_not(dev)
            if reason is None:
                return None
            reasons.append(reason)
        return " and ".join(reasons) if len(reasons) == 1 else "none of: " + "; ".join(reasons)

    def __or__(self, other: Pred) -> Pred:
        return _Any(self.parts + (other,))

    def __str__(self) -> str:
        return " | ".join(str(p) for p in self.parts)


@dataclass(frozen=True, repr=False)
class _Not(Pred):
    inner: Pred

    def why_not(self, dev: DeviceInfo) -> str | None:
        return f"must not match ({self.inner})" if self.inner(dev) else None

    def __str__(self) -> str:
        return f"not({self.inner})"


class _Always(Pred):
    def why_not(self, dev: DeviceInfo) -> str | None:
        return None

    def __str__(self) -> str:
        return "any device"


ANY: Pred = _Always()


def vendor(*names: str) -> Pred:
    """Device vendor is one of ``names`` (nvidia, amd, intel, huawei, cpu)."""
    text = f"vendor={'|'.join(names)}"
    return _Test(text, lambda d: d.vendor in names, lambda d: f"vendor={d.vendor}")


def arch(*names: str) -> Pred:
    """Exact architecture name, e.g. ``arch("gfx950")``."""
    return _Test(f"arch={'|'.join(names)}", lambda d: d.arch in names, lambda d: f"arch={d.arch}")


def family(*names: str) -> Pred:
    """Architecture family, e.g. ``family("hopper", "blackwell")``."""
    return _Test(f"family={'|'.join(names)}", lambda d: d.family in names,
                 lambda d: f"family={d.family}")


def min_sm(capability: int) -> Pred:
    """NVIDIA compute capability at least ``capability`` (90 = Hopper, 100 = Blackwell)."""
    return _Test(f"sm>={capability}", lambda d: (d.sm or 0) >= capability,
                 lambda d: f"sm={d.sm}" if d.sm is not None else f"arch={d.arch}")


def has(*features: str) -> Pred:
    """Device has every feature flag in ``features``."""
    text = "has(" + ",".join(features) + ")"

    def missing(d: DeviceInfo) -> str:
        gone = [f for f in features if f not in d.features]
        return "no " + ",".join(gone)
    return _Test(text, lambda d: all(f in d.features for f in features), missing)


def device_type(*names: str) -> Pred:
    """Torch device type is one of ``names`` (cpu, cuda, xpu, npu)."""
    return _Test(f"device_type={'|'.join(names)}", lambda d: d.device_type in names,
                 lambda d: f"device_type={d.device_type}")
