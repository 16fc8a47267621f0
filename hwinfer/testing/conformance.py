"""The conformance harness: every impl of a backend against its op's reference.

Items are generated from the registry: (op, impl, case, dtype) for every impl the backend lists.
Each run builds fresh random inputs, computes the reference, then calls the impl with every
tensor allocation it makes through ``torch.empty*`` poisoned (NaN for floats, a sentinel for
integers) so an output element a kernel forgets to write cannot pass by luck. Inputs must come
back unchanged (unless the op declares them mutated).

Where a backend's devices are absent, Triton impls still run under ``TRITON_INTERPRET=1`` on
CPU tensors with a fake DeviceInfo of that backend's main architecture (predicates see a real
arch; the interpreter executes the kernel on the host).
"""
from __future__ import annotations

import contextlib
import os
import time
import zlib
from dataclasses import dataclass, replace
from typing import Any, Iterator

import torch

from hwinfer.backend import Impl, SelectionError, fake_device, get_backend
from hwinfer.backend.device import DeviceInfo
from hwinfer.backend.discovery import detect_devices
from hwinfer.ops.contract import Case, OpSpec, Tol, all_ops, compare_outputs

# The architecture a backend's Triton kernels are interpreted as when its hardware is absent.
INTERPRET_AS = {"nvidia": "sm_90", "amd": "gfx942", "xpu": "xpu"}
INT_POISON = -(2**30) + 7


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Triton's interpreter converts fp32 to bf16 / fp16 by truncation, where GPUs round to nearest
# even (Triton 3.7.1: half the elements of a randn vector differ from torch's conversion, twice
# its relative RMSE, 3.3e-3 against 1.65e-3 for bf16; fp_downcast_rounding="rtne" is not
# honoured either). An interpreted kernel's 16-bit outputs so carry up to half an ulp more than
# the same kernel on hardware: interpreted runs add that half-ulp to the relative tolerance of
# 16-bit outputs (GDN's recurrence in bf16 sat at 4.1-5.1e-3 against its 5e-3 RMSE bound,
# failing about one run in 300). Hardware runs keep the contract's tolerance.
INTERPRETER_HALF_ULP = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -12}


def interpreted_tol(tol: Tol, dtype: torch.dtype) -> Tol:
    """``tol`` for an impl run in ``dtype``, widened by the interpreter's rounding (see above)."""
    extra = INTERPRETER_HALF_ULP.get(dtype)
    if extra is None or tol.metric == "exact" or not interpreting():
        return tol
    return replace(tol, rtol=tol.rtol + extra)


@dataclass(frozen=True)
class Target:
    """Where a backend's conformance runs: a device, and whether only interpretable impls run."""

    backend: str
    device: DeviceInfo | None
    interpret_only: bool
    why_absent: str = ""


def target_for(backend_name: str) -> Target:
    backend = get_backend(backend_name)
    devices, _ = detect_devices()
    mine = [d for d in devices if backend.serves(d)]
    if mine:
        return Target(backend_name, mine[0], False)
    if interpreting() and backend_name in INTERPRET_AS:
        dev = fake_device(INTERPRET_AS[backend_name])
        host = DeviceInfo(dev.vendor, dev.arch, dev.family, dev.features, "cpu", None,
                          dev.name + " interpreted on the host CPU", 0, fake=True)
        return Target(backend_name, host, True)
    hint = " (set TRITON_INTERPRET=1 to interpret its Triton kernels)" if backend_name in INTERPRET_AS else ""
    return Target(backend_name, None, False, f"no {backend_name} device on this machine{hint}")


@dataclass(frozen=True)
class Item:
    op: OpSpec
    impl: Impl
    case: Case
    dtype: torch.dtype

    @property
    def id(self) -> str:
        return f"{self.op.name}-{self.impl.name}-{self.case.name}-{str(self.dtype).replace('torch.', '')}"


def items(backend_name: str) -> tuple[list[Item], list[str]]:
    """Every (op, impl, case, dtype) of a backend, plus the ops the backend has no impl for."""
    ops = all_ops()
    impls = get_backend(backend_name).impls()
    out: list[Item] = []
    for impl in impls:
        if impl.op not in ops:
            raise SelectionError(f"backend {backend_name} lists impl {impl.name} for unknown op {impl.op!r}")
        spec = ops[impl.op]
        for case in spec.cases:
            for dtype in spec.dtypes:
                out.append(Item(spec, impl, case, dtype))
    covered = {i.op for i in impls}
    missing = [name for name in ops if name not in covered]
    return out, missing


def shard_of(found: list[Item], missing: list[str], shard: str | None) -> tuple[list[Item], list[str]]:
    """The part ``shard`` ("I/N", 0 <= I < N) of a backend's items: whole ops, the op names in
    sorted order dealt round-robin to the N parts, so every op x impl row of a lane comes from
    one part (a GPU lane too long for one call runs in parts). The missing-impl checks go with
    part 0. None: everything."""
    if shard is None:
        return found, missing
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise ValueError(f"--shard wants I/N with integers, got {shard!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {shard}: need 0 <= I < N")
    names = sorted({item.op.name for item in found} | set(missing))
    mine = {name for k, name in enumerate(names) if k % n == i}
    return [item for item in found if item.op.name in mine], (missing if i == 0 else [])


def case_seed(item_id: str, base_seed: int) -> int:
    return (zlib.crc32(item_id.encode()) ^ base_seed) & 0x7FFFFFFF


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Make ``torch.empty``/``empty_like``/``empty_strided``/``Tensor.new_empty`` return poison."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    original_new_empty = torch.Tensor.new_empty

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == 0:
            return t
        if t.is_floating_point() or t.is_complex():
            if t.dtype.itemsize >= 2:
                return t.fill_(float("nan"))
            return t.fill_(0)  # 1-byte floats (fp8) may have no NaN encoding: at least not stale
        if t.dtype == torch.bool:
            return t.fill_(True)
        return t.fill_(INT_POISON if t.dtype.itemsize >= 4 else -1)

    def wrap(fn):
        def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
            return poison(fn(*args, **kwargs))
        return poisoned

    try:
        for name, fn in originals.items():
            setattr(torch, name, wrap(fn))
        torch.Tensor.new_empty = wrap(original_new_empty)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = original_new_empty


def _tensor_leaves(inputs: dict[str, Any]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(input name, leaf path, tensor) for every tensor, also inside tuples and lists."""
    def walk(name: str, path: str, value: Any):
        if isinstance(value, torch.Tensor):
            yield name, path, value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                yield from walk(name, f"{path}[{i}]", item)
    for name, value in inputs.items():
        yield from walk(name, name, value)


def _snapshot(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {path: t.detach().clone() for _, path, t in _tensor_leaves(inputs)}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN); 1-byte float types compare as their bytes, because
    torch has no CPU comparison kernels for them."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.dtype.itemsize == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    return torch.equal(a, b)


def _changed_inputs(inputs: dict[str, Any], snap: dict[str, torch.Tensor], allowed: tuple[str, ...]) -> list[str]:
    return [path for name, path, t in _tensor_leaves(inputs)
            if name not in allowed and not same_bits(t, snap[path])]


@dataclass
class Outcome:
    status: str  # "pass", "fail", "skip"
    message: str = ""
    seconds: float = 0.0


def run_item(item: Item, device: torch.device, base_seed: int) -> Outcome:
    """Check one impl on one case and dtype against the reference."""
    if item.impl.is_reference:
        return Outcome("skip", "impl is the reference itself (checked by the reference tests)")
    try:
        fn = item.impl.load()
        check = item.impl.load_check()
    except Exception as exc:
        return Outcome("fail", f"cannot import {item.impl.target}: {type(exc).__name__}: {exc}")
    gen = torch.Generator().manual_seed(case_seed(item.id, base_seed))
    inputs = item.case.make(gen, item.dtype, device)
    if check is not None:
        reason = check(**inputs)
        if reason is not None:
            return Outcome("skip", f"per-call check refuses this case: {reason}")
    ref_inputs = _clone_tensors(inputs)
    ref = item.op.reference(**ref_inputs)
    snap = _snapshot(inputs)
    start = time.perf_counter()
    with poisoned_allocations():
        out = fn(**inputs)
    elapsed = time.perf_counter() - start
    changed = _changed_inputs(inputs, snap, item.op.mutates)
    if changed:
        return Outcome("fail", f"impl modified its input(s) {', '.join(changed)}", elapsed)
    tol = interpreted_tol(item.op.tol(item.dtype), item.dtype)
    msg = item.op.compare(out, ref, inputs, tol) if item.op.compare else compare_outputs(out, ref, tol)
    # In-place forms: what the impl left in each input it may mutate must match what the
    # reference left in its own copy (a store written only in place is checked nowhere else).
    mutated = [n for n in item.op.mutates if isinstance(inputs.get(n), torch.Tensor)]
    for name in mutated if not msg else []:
        bad = compare_outputs(inputs[name], ref_inputs[name], tol)
        if bad:
            msg = f"in-place input {name}: {bad}"
            break
    return Outcome("fail" if msg else "pass", msg or "", elapsed)


def _clone_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone_tensors(v) for k, v in value.items()}
    return value


def suite_path() -> str:
    """The conformance tests of a source checkout (lanes run from a clone of the repository)."""
    from pathlib import Path

    import hwinfer

    path = Path(hwinfer.__file__).resolve().parents[1] / "tests" / "conformance"
    if not path.is_dir():
        raise FileNotFoundError(f"{path} not found: run `hwinfer conform` from a source checkout")
    return str(path)
