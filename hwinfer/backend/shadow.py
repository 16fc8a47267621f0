"""Shadow checking: run the op's reference beside every bound impl call and compare.

``HWINFER_SHADOW=raise`` (or ``select(shadow="raise")``) turns the first call whose output leaves
the op's tolerance into a :class:`ShadowMismatch` naming the op, the impl, the argument shapes
and the difference; ``HWINFER_SHADOW=warn`` logs each op's first mismatch and goes on. This finds
the kernel behind a wrong model output in one run: the conformance suite checks random cases,
the shadow checks the exact inputs a model hands the op (shapes, strides, magnitudes, state).

It is a debugging mode: every call clones its inputs, runs the reference and syncs, so it is
slow and refuses CUDA graph capture (the engine falls back to eager decode).
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import torch

from hwinfer.ops.contract import OpSpec, compare_outputs, compare_tensor

MODES = ("off", "warn", "raise")
log = logging.getLogger("hwinfer.shadow")


class ShadowMismatch(AssertionError):
    """An impl's output differed from its op's reference on a real call."""


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


def _first_float_dtype(arguments: dict[str, Any]) -> torch.dtype:
    for value in arguments.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype.itemsize > 1:
            return value.dtype
    return torch.float32


def _describe(arguments: dict[str, Any]) -> str:
    parts = []
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor):
            parts.append(f"{name}={list(value.shape)}:{str(value.dtype).removeprefix('torch.')}")
    return ", ".join(parts)


def shadowed(op: OpSpec, fn: Callable[..., Any], impl_name: str, mode: str) -> Callable[..., Any]:
    """``fn`` wrapped so that each call is compared with ``op.reference`` on cloned inputs."""
    if mode not in MODES:
        raise ValueError(f"HWINFER_SHADOW must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "off":
        return fn
    signature = inspect.signature(op.reference)
    warned: set[str] = set()

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        ref_args = {k: _clone(v) for k, v in bound.arguments.items()}
        out = fn(*args, **kwargs)
        ref = op.reference(**ref_args)
        tol = op.tol(_first_float_dtype(bound.arguments))
        if op.compare is not None:
            msg = op.compare(out, ref, dict(bound.arguments), tol)
        else:
            msg = compare_outputs(out, ref, tol)
        for name in op.mutates:  # an in-place impl must leave the same state as the reference
            if msg is None and isinstance(bound.arguments.get(name), torch.Tensor):
                state_msg = compare_tensor(bound.arguments[name], ref_args[name], tol)
                msg = f"mutated input {name}: {state_msg}" if state_msg else None
        if msg is None:
            return out
        text = f"{op.name}: {impl_name} differs from the reference ({_describe(bound.arguments)}): {msg}"
        if mode == "raise":
            raise ShadowMismatch(text)
        if op.name not in warned:
            warned.add(op.name)
            log.warning(text)
        return out

    call.__name__ = f"{op.name}_shadowed"
    call.__doc__ = op.doc
    return call
