"""Registers, spills and occupancy of the AOT-compiled Triton kernels on sm_90, without a GPU.

    python scripts/kernel_regs.py gated_norm add_norm     # specs whose name contains a filter
    python scripts/kernel_regs.py --rows 1 --option maxnreg=80 conv   # a register cap's effect
    python scripts/kernel_regs.py --sass kda_diag     # with the SASS: loop bodies, barriers

Compiles each matching spec of ``hwinfer.kernels.triton.aot`` for sm_90 and runs the ptxas that
ships with Triton (``-v``) on its PTX. Programs an SM are counted from the 65,536 registers only
(shared memory not included). An estimate: the kernels a run actually loaded are reported by
``live_registers`` (``bench_ablation.py --regs``); docs/kernels.md, tenth session, has both. ``--set`` and ``--option`` change a module constant or a
spec's compile option (e.g. ``maxnreg=80``) first, to compare variants.

The specs alone under-state what the JIT knows at run time, so by default this compiles them as
the JIT would specialise a contiguous decode call: every pointer 16-byte aligned and every
``stride_*`` argument divisible by 16 (what lets Triton vectorise the weight loads), and with
``--rows 1`` an argument named ``M`` equal to 1 (the JIT turns an integer 1 into a constant, so a
batch-1 call never runs the other rows of a ``static_range(MAX_M)`` loop). ``--as-spec`` compiles
the spec as written (what CI's AOT check builds). ``--sass`` adds what the SASS says: its
instruction count, each loop's body (instructions and barriers; a program's dynamic count is the
rest plus each body times its trip count, which the caller knows) and its spill loads / stores.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import os
import re
import subprocess
import sys
import tempfile


def set_constant(item: str, rebuild: bool = True):
    """Set MODULE:ATTR=VALUE (a Python literal); returns (module, attr, previous value).
    ``rebuild``: rebuild the module's AOT specs and say what was set (False for a benchmark that
    sets constants around every call: the rebuild is host time the GPU would wait for)."""
    where, value = item.split("=", 1)
    module, name = where.split(":")
    mod = importlib.import_module(module)
    if not hasattr(mod, name):
        raise SystemExit(f"{item}: {module} has no {name}")
    old = getattr(mod, name)
    setattr(mod, name, ast.literal_eval(value))
    if rebuild:
        if hasattr(mod, "_aot_specs"):   # specs built at import from the module's constants
            mod.AOT_SPECS = mod._aot_specs()
        print(f"# {module}.{name} = {getattr(mod, name)!r}", file=sys.stderr)
    return mod, name, old


@contextlib.contextmanager
def constants(items: list[str], rebuild: bool = True):
    """Module constants set for the duration (MODULE:ATTR=VALUE each), then restored."""
    undo = [set_constant(item, rebuild) for item in items]
    try:
        yield
    finally:
        for mod, name, old in reversed(undo):
            setattr(mod, name, old)


def ptxas_report(ptx: str, arch: str = "sm_90a") -> dict[str, int]:
    """ptxas -v on ``ptx``: registers a thread and spill bytes."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores", res.stderr)
    return {"registers": int(regs.group(1)) if regs else -1,
            "spill_bytes": int(spill.group(1)) if spill else 0}


def sass_report(ptx: str, arch: str = "sm_90a") -> dict:
    """The SASS of ``ptx`` (ptxas, then cuobjdump -sass, both shipped with Triton): its instruction
    count, its barriers, its loops (found from their backward branches: [instructions, barriers]
    of each body, innermost first as they appear) and its local-memory (spill) loads and stores."""
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        subprocess.run([os.path.join(bindir, "ptxas"), f"--gpu-name={arch}", src, "-o", cubin],
                       capture_output=True, text=True, check=True)
        sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout

    def barriers(instructions):
        return sum("BAR.SYNC" in text for _, text in instructions)

    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;/]*);", sass)]
    at = {addr: i for i, (addr, _) in enumerate(ins)}
    loops = []
    for i, (addr, text) in enumerate(ins):
        target = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr and int(target.group(1), 16) in at:
            body = ins[at[int(target.group(1), 16)]:i + 1]
            loops.append((len(body), barriers(body)))
    return {"instructions": len(ins), "loops": loops, "barriers": barriers(ins),
            "spill_ops": sum(bool(re.search(r"\b(LDL|STL)\b", t)) for _, t in ins)}


def live_registers() -> list[dict]:
    """Registers and spills of every kernel the JIT has compiled and loaded in this process (on a
    GPU, after a run): the ground truth the AOT estimate above approximates."""
    import pkgutil

    import triton
    import hwinfer.kernels.triton as pkg

    rows = []
    for mod in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{mod.name}")
        for name, fn in vars(module).items():
            if not isinstance(fn, triton.runtime.JITFunction):
                continue
            for caches in getattr(fn, "device_caches", {}).values():
                for key, kernel in caches[0].items():
                    if getattr(kernel, "n_regs", None) is None:
                        continue
                    rows.append({"kernel": f"{mod.name}.{name}", "regs": kernel.n_regs,
                                 "spills": kernel.n_spills,
                                 "warps": getattr(kernel.metadata, "num_warps", None),
                                 "key": str(key)[:240]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("filters", nargs="*", help="substrings of spec names (default: all)")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE:NAME=VALUE")
    ap.add_argument("--dump", default="", help="a folder to write each spec's TTGIR and PTX into")
    ap.add_argument("--rows", type=int, default=0, help="1: compile with M = 1, as a batch-1 call")
    ap.add_argument("--as-spec", action="store_true", help="no run-time specialisation")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=INT",
                    help="a compile option for every matching spec, e.g. maxnreg=80")
    ap.add_argument("--sass", action="store_true",
                    help="also the SASS: instructions, loop bodies [instructions, barriers], "
                         "spill loads / stores (ptxas + cuobjdump from Triton's wheel)")
    args = ap.parse_args()
    for item in args.set:
        set_constant(item)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    from hwinfer.kernels.triton import programs_per_sm
    from hwinfer.kernels.triton.aot import TARGETS, all_specs

    options = {k: int(v) for k, v in (o.split("=", 1) for o in args.option)}
    print(f"{'spec':<44} {'warps':>5} {'regs':>5} {'spill B':>7} {'programs/SM':>11}")
    for spec in all_specs():
        if args.filters and not any(f in spec.name for f in args.filters):
            continue
        if spec.targets is not None and "sm_90" not in spec.targets:
            continue
        spec = dataclasses.replace(spec, options={**spec.options, **options})
        signature, constexprs, attrs = dict(spec.signature), dict(spec.constexprs), {}
        if not args.as_spec:
            if args.rows == 1 and "M" in signature:
                signature["M"], constexprs["M"] = "constexpr", 1
            names = spec.kernel.arg_names
            attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
                     if t.startswith("*") or (n.startswith("stride") and t == "i32")}
        source = ASTSource
        if getattr(spec.kernel, "is_gluon", lambda: False)():
            from triton.experimental.gluon._runtime import GluonASTSource as source
        src = source(fn=spec.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget(*TARGETS["sm_90"]), options=dict(spec.options))
        rep = ptxas_report(compiled.asm["ptx"])
        warps = spec.options.get("num_warps", 4)
        per_sm = programs_per_sm(rep["registers"], warps)
        line = f"{spec.name:<44} {warps:>5} {rep['registers']:>5} {rep['spill_bytes']:>7} {per_sm:>11}"
        if args.sass:
            sass = sass_report(compiled.asm["ptx"])
            loops = " ".join(f"[{n}, {b}]" for n, b in sass["loops"])
            line += (f"  sass {sass['instructions']} bar {sass['barriers']} loops {loops or '-'}"
                     f" spill ops {sass['spill_ops']}")
        print(line)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            for kind in ("ttgir", "ptx"):
                with open(os.path.join(args.dump, f"{spec.name}.{kind}"), "w") as f:
                    f.write(compiled.asm[kind])
    return 0


if __name__ == "__main__":
    sys.exit(main())
