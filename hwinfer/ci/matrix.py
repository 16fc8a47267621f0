"""Support matrix: lane CSVs (ci/results/*.csv) + the impl tables -> docs/support-matrix.md and
PNG plots of the benchmark numbers.

    python ci/matrix.py [--results ci/results] [--out docs/support-matrix.md] [--plots docs/plots]

Each cell (op x lane column) gets the best status the evidence supports:

* ``failing``: a conformance case failed in some lane (listed first: it needs attention);
* ``validated on hardware``: the conformance suite passed on a real device of that column;
* ``validated on hardware, fewer cases``: so, but that run had fewer case x dtype items for the
  op than its contract has now (cases added since: those never ran on the hardware);
* ``validated on hardware, not its default impl``: only impls the backend would not choose first
  on that arch passed there (a newer, higher-priority kernel has not run on the hardware);
* ``compiled and interpreted`` / ``interpreted`` / ``compiled``: Triton kernels checked without
  the hardware (TRITON_INTERPRET=1 on the host, AOT compile for the arch);
* ``reference (by choice)``: the backend deliberately runs the reference for this op;
* ``not run``: impls exist, no lane has run them;
* ``missing impl``: the backend lists nothing for the op (it falls back to the reference).

Only rows whose ``device`` names real hardware can validate (see hwinfer.ci.results): nothing
interpreted, compiled-only or run on a fake device counts. Plots need matplotlib (the ``[ci]``
extra); without it they are skipped with a note.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from hwinfer.ci import results


@dataclass(frozen=True)
class Column:
    """One lane's column: a backend, optionally one arch of it."""

    title: str
    backend: str
    arch: str | None = None

    def takes(self, r: dict[str, str]) -> bool:
        return r["backend"] == self.backend and (self.arch is None or r["arch"] == self.arch)


# Mirrors the lanes of ci/matrix.yaml (tests/ci checks they agree).
COLUMNS = (
    Column("cpu", "cpu"),
    Column("nvidia sm_90", "nvidia", "sm_90"),
    Column("nvidia sm_100", "nvidia", "sm_100"),
    Column("amd gfx942", "amd", "gfx942"),
    Column("amd gfx950", "amd", "gfx950"),
    Column("xpu", "xpu"),
    Column("npu", "npu"),
)
LANE_OF = {"cpu": "cpu", "nvidia sm_90": "nvidia-sm90", "nvidia sm_100": "nvidia-sm100",
           "amd gfx942": "amd-gfx942", "amd gfx950": "amd-gfx950", "xpu": "xpu", "npu": "npu"}

FAILING, VALIDATED = "failing", "validated on hardware"
VALIDATED_FEWER = "validated on hardware, fewer cases"
VALIDATED_OTHER = "validated on hardware, not its default impl"
COMPILED_INTERPRETED, INTERPRETED, COMPILED = "compiled and interpreted", "interpreted", "compiled"
REFERENCE, NOT_RUN, MISSING = "reference (by choice)", "not run", "missing impl"
MARK = {FAILING: "❌", VALIDATED: "✅", VALIDATED_FEWER: "☑️", VALIDATED_OTHER: "🔶",
        COMPILED_INTERPRETED: "🟡", INTERPRETED: "🟡",
        COMPILED: "🟡", REFERENCE: "🔵", NOT_RUN: "⚪", MISSING: "—"}


def impl_tables() -> dict[str, dict[str, list]]:
    """backend -> op -> its Impl records (from the installed backends)."""
    from hwinfer.backend import backends

    out: dict[str, dict[str, list]] = {}
    for b in backends():
        table: dict[str, list] = defaultdict(list)
        for i in b.impls():
            table[i.op].append(i)
        out[b.name] = table
    return out


def _items_run(rows: list[dict[str, str]], impl: str) -> int:
    """Case x dtype items one impl's conformance run had (passed + failed + skipped)."""
    most: dict[str, int] = {}
    for r in rows:
        if r["impl"] == impl and r["metric"] in ("cases_passed", "cases_failed", "cases_skipped"):
            most[r["metric"]] = max(most.get(r["metric"], 0), int(float(r["value"])))
    return sum(most.values())


def _default_impl(impls: list, col: Column) -> str | None:
    """The impl the backend chooses first for a device of the column's arch (selection's order:
    priority, then backend and name; predicates checked on a stand-in device), or None when that
    is the reference or the arch has no stand-in."""
    from hwinfer.backend.device import fake_device

    try:
        dev = fake_device(col.arch or col.backend)
    except KeyError:
        return None
    ok = sorted((i for i in impls if i.when.why_not(dev) is None),
                key=lambda i: (-i.priority, i.backend, i.name))
    return None if not ok or ok[0].is_reference else ok[0].name


def cell(op: str, col: Column, rows: list[dict[str, str]], impls: list,
         items: int | None = None) -> tuple[str, list[str]]:
    """(status, impl names behind it) for one op in one column; ``items``: the op's case x dtype
    count now (None: not checked)."""
    if not impls:
        return MISSING, []
    mine = [r for r in rows if r["op"] == op and col.takes(r)]
    conf = [r for r in mine if r["metric"] == "conformance"]
    failed = sorted({r["impl"] for r in conf if r["unit"] == "failed"})
    if failed:
        return FAILING, failed
    hw = sorted({r["impl"] for r in conf if r["unit"] == "passed" and results.on_hardware(r["device"])})
    if hw:
        default = _default_impl(impls, col)
        if default is not None and default not in hw:
            return VALIDATED_OTHER, hw
        on_hw = [r for r in mine if results.on_hardware(r["device"])]
        if items is not None and all(0 < _items_run(on_hw, i) < items for i in hw):
            return VALIDATED_FEWER, hw
        return VALIDATED, hw
    interp = sorted({r["impl"] for r in conf if r["unit"] == "passed" and r["device"] == results.INTERPRETER})
    aot = sorted({r["impl"] for r in mine if r["metric"] == "aot_compile" and r["unit"] == "passed"})
    if interp and aot:
        return COMPILED_INTERPRETED, sorted(set(interp) | set(aot))
    if interp:
        return INTERPRETED, interp
    if aot:
        return COMPILED, aot
    if all(i.is_reference for i in impls):
        return REFERENCE, []
    return NOT_RUN, sorted({i.name for i in impls if not i.is_reference})


def build(rows: list[dict[str, str]], ops: list[str], tables: dict[str, dict[str, list]],
          columns: tuple[Column, ...] = COLUMNS, items: dict[str, int] | None = None
          ) -> dict[tuple[str, str], tuple[str, list[str]]]:
    return {(op, col.title): cell(op, col, rows, tables.get(col.backend, {}).get(op, []),
                                  (items or {}).get(op))
            for op in ops for col in columns}


def case_items() -> dict[str, int]:
    """op -> its contract's case x dtype count (what a full conformance run has per impl)."""
    from hwinfer.ops.contract import all_ops

    return {name: len(spec.cases) * len(spec.dtypes) for name, spec in all_ops().items()}


def _sources(rows: list[dict[str, str]]) -> list[str]:
    seen: dict[tuple, int] = defaultdict(int)
    for r in rows:
        seen[(r["backend"], r["arch"], r["device"], r["commit"], r["date"])] += 1
    return [f"| {b} | {a or '-'} | {d or '-'} | {c or '-'} | {dt or '-'} | {n} |"
            for (b, a, d, c, dt), n in sorted(seen.items())]


def render(rows: list[dict[str, str]], ops: list[str], tables: dict[str, dict[str, list]],
           hardware_status: dict[str, str], columns: tuple[Column, ...] = COLUMNS,
           plots: list[str] | None = None, items: dict[str, int] | None = None) -> str:
    grid = build(rows, ops, tables, columns, items)
    lines = [
        "# Support matrix",
        "",
        "Generated by `python ci/matrix.py` from the lane results in `ci/results/*.csv` (schema:",
        "`ci/README.md`) and the backends' impl tables. Do not edit by hand.",
        "",
        "Legend: " + "; ".join(f"{MARK[s]} {s}" for s in
                               (VALIDATED, VALIDATED_FEWER, VALIDATED_OTHER, COMPILED_INTERPRETED,
                                REFERENCE, NOT_RUN, MISSING, FAILING)),
        "",
        "Only a lane that ran on the hardware can validate. Interpreted means the Triton kernel ran",
        "under `TRITON_INTERPRET=1` on the host CPU against the reference; compiled means it built",
        "ahead of time for that arch. Nothing mocked or run on a fake device counts. \"Fewer",
        "cases\": the hardware run had fewer case x dtype items than the op's contract has now;",
        "\"not its default impl\": the impls named passed on the hardware, the one the backend",
        "chooses first there has not run on it. The commit and date of each lane's rows are under",
        "Sources.",
        "",
        "| op | " + " | ".join(c.title for c in columns) + " |",
        "| --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for op in ops:
        cells = []
        for col in columns:
            status, impls = grid[(op, col.title)]
            names = f" ({', '.join(impls)})" if impls and status != NOT_RUN else ""
            cells.append(f"{MARK[status]} {status}{names}")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines += ["", "## Per lane", "", "| lane | backend status | " +
              " | ".join(s for s in (VALIDATED, VALIDATED_FEWER, VALIDATED_OTHER,
                                     COMPILED_INTERPRETED, INTERPRETED, COMPILED, REFERENCE,
                                     NOT_RUN, MISSING, FAILING)) + " |",
              "| --- | --- |" + " --- |" * 10]
    for col in columns:
        counts: dict[str, int] = defaultdict(int)
        for op in ops:
            counts[grid[(op, col.title)][0]] += 1
        status = hardware_status.get(col.backend, "not installed")
        lines.append(f"| {LANE_OF.get(col.title, col.title)} | {status} | " + " | ".join(
            str(counts[s]) for s in (VALIDATED, VALIDATED_FEWER, VALIDATED_OTHER,
                                     COMPILED_INTERPRETED, INTERPRETED, COMPILED, REFERENCE,
                                     NOT_RUN, MISSING, FAILING)) + " |")
    lines += ["", "## Sources", "", "| backend | arch | device | commit | date | rows |",
              "| --- | --- | --- | --- | --- | --- |"]
    lines += _sources(rows) or ["| (no results yet) | | | | | |"]
    if plots:
        lines += ["", "## Benchmarks", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def bench_series(rows: list[dict[str, str]]) -> dict[tuple[str, str, str, str], list[tuple[str, str, float]]]:
    """(op, backend, arch, unit) -> [(shape, impl, value)], the rate (GB/s, TFLOP/s) where a
    row has one, else the time in us."""
    series: dict[tuple[str, str, str, str], list[tuple[str, str, float]]] = defaultdict(list)
    rated = {(r["op"], r["backend"], r["arch"], r["impl"], r["metric"].partition("@")[2])
             for r in rows if r["unit"] in ("GB/s", "TFLOP/s")}
    for r in rows:
        kind, _, shape = r["metric"].partition("@")
        if r["unit"] in ("GB/s", "TFLOP/s") or (
                kind == "us" and (r["op"], r["backend"], r["arch"], r["impl"], shape) not in rated):
            try:
                value = float(r["value"])
            except ValueError:
                continue
            series[(r["op"], r["backend"], r["arch"], r["unit"])].append((shape, r["impl"], value))
    return series


def plot(rows: list[dict[str, str]], out_dir: Path, link_base: Path) -> list[str]:
    """One PNG per (op, backend, arch, unit); returns the paths relative to ``link_base``."""
    series = bench_series(rows)
    if not series:
        return []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[ci]'): benchmark plots skipped")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for (op, backend, arch, unit), points in sorted(series.items()):
        shapes = list(dict.fromkeys(s for s, _, _ in points))
        impls = list(dict.fromkeys(i for _, i, _ in points))
        value = {(s, i): v for s, i, v in points}
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(shapes) * max(1, len(impls)) / 2 + 1.5))
        height = 0.8 / len(impls)
        for k, impl in enumerate(impls):
            ys = [n + k * height for n in range(len(shapes))]
            ax.barh(ys, [value.get((s, impl), 0.0) for s in shapes], height=height, label=impl)
        ax.set_yticks([n + 0.4 - height / 2 for n in range(len(shapes))], shapes, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.set_title(f"{op} on {backend} {arch}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{op}-{backend}-{arch}-{unit.replace('/', 'per')}.png".replace(" ", "_")
        fig.savefig(out_dir / name, dpi=90)
        plt.close(fig)
        made.append(str((out_dir / name).relative_to(link_base)) if (out_dir / name).is_relative_to(link_base)
                    else str(out_dir / name))
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="lane CSVs -> support matrix (markdown) and plots")
    p.add_argument("--results", nargs="+", default=["ci/results"], help="CSV files or folders")
    p.add_argument("--out", default="docs/support-matrix.md")
    p.add_argument("--plots", default="docs/plots", help="folder for PNGs ('' to skip)")
    args = p.parse_args(argv)
    from hwinfer.backend import backends
    from hwinfer.ops.contract import all_ops

    existing = [r for r in args.results if Path(r).exists()]
    rows = results.read_rows(*existing) if existing else []
    out = Path(args.out)
    pngs = plot(rows, Path(args.plots), out.parent) if args.plots else []
    text = render(rows, sorted(all_ops()), impl_tables(),
                  {b.name: b.hardware_status for b in backends()}, plots=pngs, items=case_items())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({len(rows)} result rows, {len(pngs)} plots)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
