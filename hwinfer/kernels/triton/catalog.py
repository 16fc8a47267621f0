"""The portable Triton kernels, as (op, target, check) triples, for any backend to list.

One line per kernel. A backend whose devices run upstream-compatible Triton (Intel's XPU
backend, Triton-Ascend) builds its impls from this list with its own predicate and priority
(``hwinfer.backend.portable.triton_impls``), so a new kernel reaches those tables by adding one
line here. Kept free of imports: listing a kernel never imports Triton.
"""
from __future__ import annotations

PORTABLE_TRITON_KERNELS: tuple[tuple[str, str, str | None], ...] = (
    ("rms_norm", "hwinfer.kernels.triton.norm:rms_norm",
     "hwinfer.kernels.triton.norm:rms_norm_supported"),
    ("gdn_recurrent", "hwinfer.kernels.triton.delta_rule:gdn_recurrent",
     "hwinfer.kernels.triton.delta_rule:delta_rule_supported"),
    ("kda_recurrent", "hwinfer.kernels.triton.delta_rule:kda_recurrent",
     "hwinfer.kernels.triton.delta_rule:delta_rule_supported"),
    ("sparse_mla_decode", "hwinfer.kernels.triton.sparse_mla:sparse_mla_decode",
     "hwinfer.kernels.triton.sparse_mla:sparse_mla_decode_supported"),
)


def ops_of_module(module: str) -> list[str]:
    """The ops whose portable kernel lives in ``module`` (e.g. ``hwinfer.kernels.triton.norm``)."""
    return [op for op, target, _ in PORTABLE_TRITON_KERNELS if target.partition(":")[0] == module]
