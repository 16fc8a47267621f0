"""Impl records for the portable torch kernels, for any backend to list with its own predicate."""
from __future__ import annotations

from hwinfer.backend.predicates import Pred
from hwinfer.backend.registry import Impl
from hwinfer.kernels.torch import KERNELS, REFERENCE_IS_BEST
from hwinfer.ops.contract import all_ops


def portable_impls(when: Pred, priority: int, skip: tuple[str, ...] = ()) -> list[Impl]:
    """Every vectorised torch kernel at ``priority``, plus the deliberate reference choices.

    ``skip`` leaves out ops the backend serves only through its own kernels.
    """
    impls = [Impl(op, "torch", target, when=when, priority=priority, check=check)
             for op, (target, check) in KERNELS.items() if op not in skip]
    ops = all_ops()
    for op, why in REFERENCE_IS_BEST.items():
        ref = ops[op].reference
        impls.append(Impl(op, "reference", f"{ref.__module__}:{ref.__name__}", when=when,
                          priority=0, is_reference=True, note=why))
    return impls


def triton_impls(when: Pred, priority: int, skip: tuple[str, ...] = ()) -> list[Impl]:
    """The portable Triton kernels of ``hwinfer.kernels.triton.catalog`` at ``priority``.

    ``when`` should include the check that a Triton backend for the device is present (e.g.
    ``has("triton_xpu")``); the records also require the ``triton`` module itself.
    """
    from hwinfer.kernels.triton.catalog import PORTABLE_TRITON_KERNELS

    return [Impl(op, "triton", target, when=when, priority=priority, check=check,
                 requires=("triton",), interpretable=True)
            for op, target, check in PORTABLE_TRITON_KERNELS if op not in skip]
