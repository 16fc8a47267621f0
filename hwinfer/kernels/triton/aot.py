"""Ahead-of-time compilation of every Triton kernel for GPU targets, without a GPU.

Each kernel module lists ``AOT_SPECS``: the kernel, its argument signature and the constexpr
configurations the wrappers launch. ``compile_spec`` lowers one spec for one target through
``triton.compile(ASTSource(...), target=GPUTarget(...))`` (Triton's own CLI needs a driver);
CI compiles them all for sm_90, sm_100, gfx942 and gfx950, which catches kernels that would not
build on hardware CI cannot reach. Numerics are checked elsewhere (interpreter, H200).
"""
from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from typing import Any

TARGETS = {
    "sm_90": ("cuda", 90, 32),
    "sm_100": ("cuda", 100, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}


@dataclass(frozen=True)
class AotSpec:
    """One compile of one kernel: Triton signature strings ("*fp32", "i32", "fp32", "constexpr")."""

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=lambda: {"num_warps": 4})
    targets: tuple[str, ...] | None = None  # None: every target (PDL variants: NVIDIA only)
    # Whether the compile must fit the target's shared memory (SHARED_BYTES): set for the specs
    # that are the launch configurations of their target (a spec compiled for every target with
    # one vendor's tiles would not fit the other's LDS, and need not).
    check_shared: bool = False
    # Arguments the JIT would see divisible by 16 (pointers from torch, strides of contiguous
    # rows), where a kernel needs to know it (Gluon's cp.async of 16-byte pieces).
    divisible: tuple[str, ...] = ()


# Shared memory (LDS) a program may use: Hopper / Blackwell 227 KB, MI300 64 KB, MI355 160 KB.
SHARED_BYTES = {"sm_90": 232448, "sm_100": 232448, "gfx942": 65536, "gfx950": 163840}


def all_specs() -> list[AotSpec]:
    import hwinfer.kernels.triton as pkg

    specs: list[AotSpec] = []
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name == "aot":
            continue
        module = importlib.import_module(f"{pkg.__name__}.{mod.name}")
        specs.extend(getattr(module, "AOT_SPECS", []))
    return specs


def compile_spec(spec: AotSpec, target: str) -> dict[str, Any]:
    """Compile ``spec`` for ``target``; returns the binary kind, its size and kernel metadata."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend, arch, warp = TARGETS[target]
    if getattr(spec.kernel, "is_gluon", lambda: False)():
        # Gluon kernels need their module's warp count and target set before the body is built
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    names = list(spec.signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in spec.divisible}
    src = ASTSource(fn=spec.kernel, signature=spec.signature, constexprs=spec.constexprs,
                    attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget(backend, arch, warp), options=dict(spec.options))
    binary = "cubin" if backend == "cuda" else "hsaco"
    blob = compiled.asm[binary]
    meta = compiled.metadata
    return {"binary": binary, "bytes": len(blob), "shared": getattr(meta, "shared", None),
            "num_warps": getattr(meta, "num_warps", None), "magic": bytes(blob[:4])}


def main(targets: list[str]) -> int:
    failures = 0
    for spec in all_specs():
        for target in targets:
            if spec.targets is not None and target not in spec.targets:
                continue
            start = time.perf_counter()
            try:
                info = compile_spec(spec, target)
                print(f"ok   {spec.name:<40} {target:<7} {info['binary']} {info['bytes']:>8} B "
                      f"smem={info['shared']} ({time.perf_counter() - start:.1f}s)")
            except Exception as exc:
                failures += 1
                print(f"FAIL {spec.name:<40} {target:<7} {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if failures else 0
