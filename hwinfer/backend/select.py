"""Selection: one OpTable per device, built once, recording why each candidate was refused.

For each op the candidates are every installed backend's impls of it, best priority first. A
candidate is refused if its backend does not serve the device's vendor, its predicate fails,
a package it requires is missing, or (when binding) its target fails to import. The first
survivor is chosen; the other survivors stay behind it as a per-call fallback chain (for impls
with a per-call check); the op's reference closes every chain.

``strict=True`` (CI lanes, benchmarks) turns any fallback to the reference into an error, at
selection time and at call time. An explicit choice (``impl={"op": "name"}`` or
``HWINFER_IMPL="op=name,..."``) fails loudly when that impl cannot run.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from hwinfer.backend.device import DeviceInfo
from hwinfer.backend.discovery import backends as installed_backends
from hwinfer.backend.registry import Backend, Impl
from hwinfer.backend.shadow import MODES as SHADOW_MODES, shadowed
from hwinfer.ops.contract import OpSpec, all_ops

REFERENCE = "reference"


class SelectionError(RuntimeError):
    """Strict mode found a fallback, or an explicit impl choice cannot run."""


@dataclass(frozen=True)
class Verdict:
    impl: Impl
    reason: str | None  # None: eligible

    @property
    def eligible(self) -> bool:
        return self.reason is None


@dataclass
class OpChoice:
    """The outcome of selection for one op."""

    op: OpSpec
    verdicts: list[Verdict]
    chosen: Impl | None  # None means the reference
    chain: list[tuple[Impl, Callable[..., Any], Callable[..., str | None] | None]] = field(
        default_factory=list)
    fn: Callable[..., Any] | None = None

    @property
    def chosen_name(self) -> str:
        return self.chosen.qualname if self.chosen else REFERENCE

    @property
    def is_fallback(self) -> bool:
        return self.chosen is None


def parse_impl_env(text: str | None) -> dict[str, str]:
    """``"rms_norm=cpu.compiled,sample=reference"`` -> {op: impl}."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        op, sep, name = item.partition("=")
        if not sep or not op.strip() or not name.strip():
            raise SelectionError(f"HWINFER_IMPL entry {item!r} must look like op=impl")
        out[op.strip()] = name.strip()
    return out


def _matches(impl: Impl, wanted: str) -> bool:
    return wanted in (impl.name, impl.qualname)


def _judge(impl: Impl, dev: DeviceInfo, serving: Backend | None, bind: bool
           ) -> tuple[str | None, Callable[..., Any] | None, Callable[..., str | None] | None]:
    if serving is None:
        return f"backend {impl.backend} does not serve vendor {dev.vendor}", None, None
    reason = impl.when.why_not(dev)
    if reason:
        return reason, None, None
    missing = impl.missing_packages()
    if missing:
        return f"package {', '.join(missing)} not installed", None, None
    if not bind:
        return None, None, None
    try:
        return None, impl.load(), impl.load_check()
    except Exception as exc:
        return f"import of {impl.target} failed: {type(exc).__name__}: {exc}", None, None


def _arguments_by_name(reference: Callable[..., Any]) -> Callable[[tuple, dict], dict]:
    """(args, kwargs) -> the arguments by parameter name, as ``Signature.bind_partial`` gives
    them (no defaults) but by a zip with the positional names: bind_partial costs ~5 us a call
    on a desktop CPU and several times that on the H200's host, where a short prefill is
    host-bound (docs/engine.md, fifteenth session); this is ~0.5 us."""
    signature = inspect.signature(reference)
    params = signature.parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return lambda args, kwargs: signature.bind_partial(*args, **kwargs).arguments
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def by_name(args: tuple, kwargs: dict) -> dict:
        if len(args) > len(positional):
            raise TypeError(f"{reference.__name__}() takes {len(positional)} positional "
                            f"arguments but {len(args)} were given")
        named = dict(zip(positional, args))
        named.update(kwargs)
        return named
    return by_name


def _dispatcher(op: OpSpec, chain, strict: bool) -> Callable[..., Any]:
    """Bound callable: the first impl in ``chain`` whose per-call check passes, else reference."""
    if chain and chain[0][2] is None:
        return chain[0][1]  # no per-call check: bind the function itself, no wrapper cost
    reference = op.reference
    named_args = _arguments_by_name(reference)

    def call(*args: Any, **kwargs: Any) -> Any:
        reasons = []
        # Checks take the op's arguments by name, whatever way the caller passed them.
        named = named_args(args, kwargs)
        for impl, fn, check in chain:
            reason = check(**named) if check is not None else None
            if reason is None:
                return fn(*args, **kwargs)
            reasons.append(f"{impl.qualname}: {reason}")
        if strict and chain:
            raise SelectionError(f"{op.name}: strict mode, every impl refused this call ({'; '.join(reasons)})")
        return reference(*args, **kwargs)

    call.__name__ = f"{op.name}_dispatch"
    call.__doc__ = op.doc
    return call


class OpTable:
    """Bound implementations for one device; ``table.rms_norm(x, w)`` calls the chosen impl."""

    def __init__(self, device: DeviceInfo, choices: dict[str, OpChoice], strict: bool) -> None:
        self.device = device
        self.choices = choices
        self.strict = strict
        for name, choice in choices.items():
            if choice.fn is not None:
                setattr(self, name, choice.fn)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not bound in __init__.
        if name in self.__dict__.get("choices", {}):
            raise AttributeError(f"op {name!r} was selected without binding (bind=False)")
        raise AttributeError(f"no op named {name!r}")

    def chosen(self, op: str) -> str:
        return self.choices[op].chosen_name

    def report(self) -> list[dict[str, Any]]:
        """One row per op: chosen impl and every candidate with its refusal reason."""
        rows = []
        for name, choice in self.choices.items():
            rows.append({
                "op": name,
                "chosen": choice.chosen_name,
                "candidates": [
                    {"impl": v.impl.qualname, "priority": v.impl.priority,
                     "status": ("chosen" if choice.chosen is v.impl else
                                "eligible (lower priority)" if v.eligible else "refused"),
                     "reason": v.reason}
                    for v in choice.verdicts
                ],
            })
        return rows


def select(
    device: DeviceInfo,
    *,
    impl: Mapping[str, str] | None = None,
    strict: bool = False,
    bind: bool = True,
    backends: Iterable[Backend] | None = None,
    ops: Iterable[str] | None = None,
    shadow: str | None = None,
) -> OpTable:
    """Build the OpTable for ``device`` (see module docstring). ``shadow`` ("warn" / "raise",
    default ``$HWINFER_SHADOW``) compares every impl call with the reference (backend/shadow.py)."""
    shadow_mode = shadow or os.environ.get("HWINFER_SHADOW") or "off"
    if shadow_mode not in SHADOW_MODES:
        raise SelectionError(f"HWINFER_SHADOW must be one of {', '.join(SHADOW_MODES)}, not {shadow_mode!r}")
    specs = all_ops()
    pool = list(installed_backends() if backends is None else backends)
    overrides = {**parse_impl_env(os.environ.get("HWINFER_IMPL")), **dict(impl or {})}
    unknown = sorted(set(overrides) - set(specs))
    if unknown:
        raise SelectionError(f"impl override names unknown op(s): {', '.join(unknown)}")
    wanted_ops = list(ops) if ops is not None else list(specs)
    by_op: dict[str, list[tuple[Impl, Backend]]] = {name: [] for name in specs}
    for b in pool:
        for i in b.impls():
            if i.op not in specs:
                raise SelectionError(f"backend {b.name} lists impl {i.name} for unknown op {i.op!r}")
            by_op[i.op].append((i, b))

    choices: dict[str, OpChoice] = {}
    for name in wanted_ops:
        spec = specs[name]
        candidates = sorted(by_op[name], key=lambda ib: (-ib[0].priority, ib[0].backend, ib[0].name))
        verdicts: list[Verdict] = []
        chain = []
        for i, b in candidates:
            reason, fn, check = _judge(i, device, b if b.serves(device) else None, bind)
            verdicts.append(Verdict(i, reason))
            if reason is None:
                chain.append((i, fn, check))
        wanted = overrides.get(name)
        if wanted is not None:
            chain = _apply_override(name, wanted, verdicts, chain)
        chosen = chain[0][0] if chain else None
        if strict and chosen is None:
            why = "; ".join(f"{v.impl.qualname}: {v.reason}" for v in verdicts) or "no impl is registered"
            raise SelectionError(
                f"strict mode: op {name!r} would fall back to the reference on {device.describe()} ({why})")
        choice = OpChoice(spec, verdicts, chosen, chain)
        if bind:
            choice.fn = _dispatcher(spec, chain, strict) if chain else spec.reference
            if chain:
                choice.fn = shadowed(spec, choice.fn, chain[0][0].qualname, shadow_mode)
        choices[name] = choice
    return OpTable(device, choices, strict)


def _apply_override(op: str, wanted: str, verdicts: list[Verdict], chain: list) -> list:
    if wanted == REFERENCE:
        return []
    # A short name ("torch") can match one impl per backend: the first that can run here wins.
    matching = [v for v in verdicts if _matches(v.impl, wanted)]
    for v in matching:
        if v.reason is None:
            return [entry for entry in chain if entry[0] is v.impl]
    if matching:
        raise SelectionError(f"impl {wanted!r} was requested for op {op!r} but cannot run: "
                             f"{matching[0].reason}")
    names = ", ".join(v.impl.qualname for v in verdicts) or "none"
    raise SelectionError(f"impl {wanted!r} was requested for op {op!r}, which has no such impl "
                         f"(impls: {names}, or 'reference')")
