"""What an op *is*: a name, a plain-PyTorch reference, test cases and tolerances.

Every op the models need is declared once with :func:`define_op`. The declaration is the
contract every backend implementation is checked against by the conformance suite:

* ``reference``: plain torch, accumulates in fp32, never raises for valid input. It is the
  implementation of last resort, so a device with no kernels still runs every model.
* ``cases``: functions building fresh random inputs (shapes drawn from the real model configs,
  scaled down). Each case is run for every dtype in ``dtypes``.
* ``tolerance``: per dtype, how far an implementation may drift from the reference; ``compare``
  may replace the default elementwise check (e.g. relative RMSE for linear attention, exact
  equality for index outputs).

Inputs a case builds are keyword arguments. Outputs are a tensor or a tuple of tensors; ops are
functional (state goes in and comes out explicitly), so an implementation never mutates inputs
unless the op lists them in ``mutates``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

Inputs = dict[str, Any]
CaseBuilder = Callable[[torch.Generator, torch.dtype, torch.device], Inputs]


@dataclass(frozen=True)
class Tol:
    """Elementwise tolerance: ``|out - ref| <= atol + rtol * |ref|`` everywhere.

    ``metric="rmse"`` instead bounds the relative RMSE ``||out - ref|| / ||ref||`` by ``rtol``
    (fla's metric for linear attention); ``metric="exact"`` demands bit equality.
    """

    atol: float = 0.0
    rtol: float = 0.0
    metric: str = "allclose"

    def __post_init__(self) -> None:
        if self.metric not in ("allclose", "rmse", "exact"):
            raise ValueError(f"unknown tolerance metric {self.metric!r}")


EXACT = Tol(metric="exact")


@dataclass(frozen=True)
class Case:
    """One named input builder; ``make(gen, dtype, device)`` returns the op's keyword inputs."""

    name: str
    make: CaseBuilder


@dataclass(frozen=True)
class OpSpec:
    """The contract of one op (see module docstring)."""

    name: str
    reference: Callable[..., Any]
    doc: str
    cases: tuple[Case, ...]
    dtypes: tuple[torch.dtype, ...]
    tolerance: Mapping[torch.dtype, Tol]
    family: str
    # Optional replacement for the elementwise check: compare(out, ref, inputs, tol) -> None or
    # a message describing the mismatch.
    compare: Callable[[Any, Any, Inputs, Tol], str | None] | None = None
    # Input names an implementation may write into (e.g. an in-place cache update).
    mutates: tuple[str, ...] = ()

    def tol(self, dtype: torch.dtype) -> Tol:
        return self.tolerance.get(dtype, self.tolerance.get(torch.float32, Tol(1e-5, 1e-5)))


_OPS: dict[str, OpSpec] = {}


def define_op(
    reference: Callable[..., Any],
    *,
    cases: Sequence[Case],
    tolerance: Mapping[torch.dtype, Tol],
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16),
    name: str | None = None,
    family: str | None = None,
    compare: Callable[[Any, Any, Inputs, Tol], str | None] | None = None,
    mutates: Sequence[str] = (),
) -> OpSpec:
    """Declare an op whose reference is ``reference``; its docstring is the contract's text."""
    op_name = name or reference.__name__
    if op_name in _OPS:
        raise ValueError(f"op {op_name!r} is declared twice")
    if not (reference.__doc__ or "").strip():
        raise ValueError(f"op {op_name!r}: the reference needs a docstring (math, shapes, dtypes)")
    if not cases:
        raise ValueError(f"op {op_name!r}: at least one test case is required")
    spec = OpSpec(
        name=op_name,
        reference=reference,
        doc=reference.__doc__ or "",
        cases=tuple(cases),
        dtypes=tuple(dtypes),
        tolerance=dict(tolerance),
        family=family or reference.__module__.rsplit(".", 1)[-1],
        compare=compare,
        mutates=tuple(mutates),
    )
    _OPS[op_name] = spec
    return spec


def all_ops() -> dict[str, OpSpec]:
    """Every declared op, by name (importing :mod:`hwinfer.ops` declares them all)."""
    import hwinfer.ops  # noqa: F401  (declares the ops on import)

    return dict(sorted(_OPS.items()))


def get_op(name: str) -> OpSpec:
    ops = all_ops()
    if name not in ops:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(ops)}")
    return ops[name]


# ----------------------------------------------------------------------------------------------
# Comparison helpers (used by the conformance suite and by the op modules' custom compares).


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _flatten(item)]
    return [out]


def compare_outputs(out: Any, ref: Any, tol: Tol) -> str | None:
    """Compare ``out`` with ``ref`` leaf by leaf; return None if they agree, else a message."""
    outs, refs = _flatten(out), _flatten(ref)
    if len(outs) != len(refs):
        return f"returned {len(outs)} outputs, the reference returns {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        msg = compare_tensor(o, r, tol)
        if msg:
            return f"output {i}: {msg}"
    return None


def compare_tensor(o: Any, r: Any, tol: Tol) -> str | None:
    if r is None or not isinstance(r, torch.Tensor):
        return None if o == r else f"got {o!r}, expected {r!r}"
    if not isinstance(o, torch.Tensor):
        return f"got {type(o).__name__}, expected a tensor"
    if tuple(o.shape) != tuple(r.shape):
        return f"shape {tuple(o.shape)} != reference {tuple(r.shape)}"
    if o.dtype != r.dtype:
        return f"dtype {o.dtype} != reference {r.dtype}"
    o_cpu, r_cpu = o.detach().cpu(), r.detach().cpu()
    if r.is_floating_point() and r.dtype.itemsize == 1:
        # fp8 / e8m0 outputs: torch has no CPU comparisons for them; their bytes must match.
        o_cpu, r_cpu = o_cpu.view(torch.uint8), r_cpu.view(torch.uint8)
        r = r_cpu
    if tol.metric == "exact" or not r.is_floating_point():
        if torch.equal(o_cpu, r_cpu) or (
            r.is_floating_point() and torch.equal(o_cpu.isnan(), r_cpu.isnan())
            and torch.equal(o_cpu.nan_to_num(), r_cpu.nan_to_num())
        ):
            return None
        bad = (o_cpu != r_cpu).sum().item()
        return f"not bit-exact: {bad} of {r.numel()} elements differ"
    o32, r32 = o_cpu.float(), r_cpu.float()
    nan_out, nan_ref = o32.isnan(), r32.isnan()
    if not torch.equal(nan_out, nan_ref):
        return f"NaN pattern differs ({int(nan_out.sum())} NaN in output, {int(nan_ref.sum())} in reference)"
    o32, r32 = o32.nan_to_num(), r32.nan_to_num()
    if tol.metric == "rmse":
        denom = r32.norm().item()
        err = (o32 - r32).norm().item()
        ratio = err / denom if denom > 0 else err
        if ratio <= tol.rtol or (o32 - r32).abs().max().item() <= tol.atol:
            return None
        return f"relative RMSE {ratio:.3e} > {tol.rtol:.1e}"
    diff = (o32 - r32).abs()
    limit = tol.atol + tol.rtol * r32.abs()
    bad = diff > limit
    if not bool(bad.any()):
        return None
    idx = int(bad.flatten().nonzero()[0])
    worst = float(diff.max())
    return (
        f"{int(bad.sum())} of {r.numel()} elements outside atol={tol.atol:g} rtol={tol.rtol:g} "
        f"(max |diff| {worst:.3e}; first at flat index {idx}: {float(o32.flatten()[idx]):.6g} "
        f"vs {float(r32.flatten()[idx]):.6g})"
    )


def slot_rows(op: str, state_slots: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """``state_slots`` [N] (any integer dtype) checked and turned into int64 row indices of the
    state ``pool`` on its device: the shared part of the ops' in-place ``state_slots`` forms."""
    if state_slots.dim() != 1 or state_slots.is_floating_point():
        raise ValueError(f"{op}: state_slots must be a 1-D integer tensor [N], got "
                         f"{state_slots.dtype} {list(state_slots.shape)}")
    return state_slots.to(device=pool.device, dtype=torch.int64)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: torch.device,
          scale: float = 1.0) -> torch.Tensor:
    """Gaussian tensor drawn on the CPU from ``gen`` (same values on every device), then moved."""
    t = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
    return t.to(device=device, dtype=dtype)


def uniform(gen: torch.Generator, *shape: int, lo: float, hi: float, dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    t = torch.rand(*shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(device=device, dtype=dtype)


def randint(gen: torch.Generator, lo: int, hi: int, *shape: int, device: torch.device,
            dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=gen).to(device=device, dtype=dtype)


def fan_in_scale(fan_in: int) -> float:
    """Weight scale that keeps activations O(1) through a random linear layer."""
    return 1.0 / math.sqrt(fan_in)


__all__ = [
    "Case", "EXACT", "Inputs", "OpSpec", "Tol", "all_ops", "compare_outputs", "compare_tensor",
    "define_op", "fan_in_scale", "get_op", "randint", "randn", "slot_rows", "uniform",
]
