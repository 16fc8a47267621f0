"""Benchmark output -> results-CSV rows.

Benchmark scripts print one CSV line per measurement (the form new scripts should use):

    op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak      e.g.  rms_norm,triton,8192x4096 bf16,39.2,3428,GB/s,80.3

Older scripts (scripts/bench_rms_norm.py, bench_delta_rule.py, bench_sparse_mla.py) print
tables; their lines ``<shape> <impl> <t> us <rate> GB/s [(<p>% of peak)] ...`` are parsed too.
Lines that are neither (headers, errors, notes) are ignored. A ``device: ...`` line names the
card.

    python -m hwinfer.ci.bench --script bench_rms_norm.py --backend nvidia --arch sm_90 \\
        --device "NVIDIA H200" < output.txt >> results.csv
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from pathlib import Path

from hwinfer.ci import results

# First word of an impl name as the benchmark scripts spell it; the impl is that word and what
# follows it up to the time (a tiling such as "triton bv16w1" or "triton bh16 w4 s1").
IMPL_WORDS = ("reference", "torch", "triton", "fla", "flashinfer", "flashmla", "aiter",
              "torch_npu", "compiled", "cudnn", "sdpa", "vllm", "sglang", "deepgemm", "cutlass")
RATE_UNITS = ("GB/s", "TFLOP/s")
_TABLE = re.compile(
    r"^(?P<head>.+?)\s+(?P<us>\d[\d,]*(?:\.\d+)?)\s*us\s+(?P<rate>\d[\d,]*(?:\.\d+)?)\s*"
    r"(?P<unit>GB/s|TFLOP/s)(?:\s*\(\s*(?P<pct>\d+(?:\.\d+)?)\s*% of peak\))?")
_DEVICE = re.compile(r"^device:\s*\S+:\s*(?P<name>[^\[;]+?)\s*\[")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _split_head(head: str, ops: set[str], default_op: str) -> tuple[str, str, str]:
    """(op, impl, shape) from the text before the time column of a table line."""
    words = head.split()
    at = max((i for i, w in enumerate(words) if w in IMPL_WORDS), default=len(words) - 1)
    impl = " ".join(words[at:])
    shape = " ".join(words[:at])
    first = shape.split()[0] if shape else ""
    op = first if first in ops else default_op
    if op == first:
        shape = shape[len(first):].strip()
    return op, impl, shape


# Scripts whose name is not an op and whose lines do not start with one.
SCRIPT_OPS = {"sparse_mla": "sparse_mla_decode"}


def default_op(script: str, ops: set[str]) -> str:
    """bench_rms_norm.py -> rms_norm; bench_sparse_mla.py -> sparse_mla_decode; else the one op
    that starts with the script's name, else the script's name."""
    stem = Path(script).stem.removeprefix("bench_")
    if stem in SCRIPT_OPS:
        return SCRIPT_OPS[stem]
    if stem in ops:
        return stem
    starts = sorted(op for op in ops if op.startswith(stem))
    return starts[0] if len(starts) == 1 else stem


def parse(text: str, *, script: str, backend: str, arch: str, device: str = "",
          ops: set[str] | None = None, commit: str = "", date: str = "") -> list[dict[str, str]]:
    """Rows for every measurement line in ``text`` (see module docstring)."""
    if ops is None:
        from hwinfer.ops.contract import all_ops
        ops = set(all_ops())
    fallback_op = default_op(script, ops)
    out: list[dict[str, str]] = []

    def emit(op: str, impl: str, shape: str, us: float, rate: float | None, unit: str,
             pct: float | None) -> None:
        shape = " ".join(shape.split())
        tag = f"@{shape}" if shape else ""
        out.append(results.row(op, impl, backend, arch, device, f"us{tag}", us, "us", commit, date))
        if rate is not None and unit:
            out.append(results.row(op, impl, backend, arch, device, f"{unit}{tag}", rate, unit, commit, date))
        if pct is not None:
            out.append(results.row(op, impl, backend, arch, device, f"pct_of_peak{tag}", pct, "%", commit, date))

    for line in text.splitlines():
        line = line.strip()
        m = _DEVICE.match(line)
        if m and not device:
            device = m.group("name").strip()
            continue
        fields = next(csv.reader(io.StringIO(line))) if line.count(",") >= 6 else []
        if len(fields) >= 7:
            # a shape with commas in it arrives unquoted: everything between impl and the numbers
            op, impl, us, rate, unit, pct = (f.strip() for f in fields[:2] + fields[-4:])
            shape = ",".join(fields[2:-4]).strip()
            try:
                emit(op, impl, shape, _num(us), _num(rate) if rate else None, unit,
                     _num(pct) if pct else None)
            except ValueError:
                pass  # a header line "op,impl,shape,..."
            continue
        m = _TABLE.match(line)
        if m:
            op, impl, shape = _split_head(m.group("head"), ops, fallback_op)
            pct = m.group("pct")
            emit(op, impl, shape, _num(m.group("us")), _num(m.group("rate")), m.group("unit"),
                 float(pct) if pct else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", required=True, help="the benchmark script's file name")
    p.add_argument("--backend", required=True)
    p.add_argument("--arch", required=True)
    p.add_argument("--device", default="")
    p.add_argument("--input", default="-", help="benchmark output (default: stdin)")
    p.add_argument("--csv", required=True, help="results CSV to append to")
    args = p.parse_args(argv)
    text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text()
    rows = parse(text, script=args.script, backend=args.backend, arch=args.arch, device=args.device,
                 commit=results.commit_id(), date=results.today())
    n = results.append_rows(args.csv, rows)
    print(f"{args.script}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
