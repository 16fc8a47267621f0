"""The support-matrix generator: statuses from lane rows and impl tables, honesty rules,
markdown, plots, and the lanes of ci/matrix.yaml, ci/lane.sh and the workflows agreeing."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hwinfer.backend import Impl
from hwinfer.ci import matrix, results
from hwinfer.ci.matrix import (
    COLUMNS, COMPILED, COMPILED_INTERPRETED, FAILING, INTERPRETED, MISSING, NOT_RUN, REFERENCE,
    VALIDATED, Column, build, render,
)

ROOT = Path(__file__).resolve().parents[2]
H200 = "NVIDIA H200"


def _r(op, impl, backend, arch, device, metric="conformance", unit="passed", value=None):
    return results.row(op, impl, backend, arch, device, metric,
                       value if value is not None else int(unit == "passed"), unit, "abc1234", "2026-12-01")


def _impl(op, name, ref=False):
    # Triton kernels come first where they are listed, as in the real tables.
    return Impl(op, name, "m:f", is_reference=ref, priority=10 if name == "triton" else 5)


TABLES = {
    "nvidia": {"rms_norm": [_impl("rms_norm", "triton"), _impl("rms_norm", "torch")],
               "attention": [_impl("attention", "torch")],
               "gdn_recurrent": [_impl("gdn_recurrent", "triton")],
               "sample": [_impl("sample", "torch")],
               "gdn_gate": [_impl("gdn_gate", "reference", ref=True)]},
    "xpu": {"rms_norm": [_impl("rms_norm", "triton")]},
}
OPS = ["attention", "gdn_gate", "gdn_recurrent", "rms_norm", "route_hash", "sample"]
COLS = (Column("nvidia sm_90", "nvidia", "sm_90"), Column("nvidia sm_100", "nvidia", "sm_100"),
        Column("xpu", "xpu"))


def test_statuses_follow_the_evidence():
    rows = [
        _r("rms_norm", "triton", "nvidia", "sm_90", H200),
        _r("rms_norm", "triton", "nvidia", "sm_90", results.INTERPRETER),
        _r("rms_norm", "triton", "nvidia", "sm_100", results.AOT, "aot_compile"),
        _r("gdn_recurrent", "triton", "nvidia", "sm_90", results.INTERPRETER),
        _r("gdn_recurrent", "triton", "nvidia", "sm_90", results.AOT, "aot_compile"),
        _r("attention", "torch", "nvidia", "sm_90", H200, unit="failed"),
        _r("sample", "torch", "nvidia", "sm_90", results.INTERPRETER),
        # a fake device and an interpreted xpu kernel can never validate
        _r("rms_norm", "triton", "xpu", "xe-hpc", results.FAKE),
    ]
    grid = build(rows, OPS, TABLES, COLS)
    assert grid[("rms_norm", "nvidia sm_90")] == (VALIDATED, ["triton"])
    assert grid[("rms_norm", "nvidia sm_100")] == (COMPILED, ["triton"])
    assert grid[("gdn_recurrent", "nvidia sm_90")] == (COMPILED_INTERPRETED, ["triton"])
    assert grid[("sample", "nvidia sm_90")] == (INTERPRETED, ["torch"])
    assert grid[("attention", "nvidia sm_90")] == (FAILING, ["torch"])
    assert grid[("gdn_gate", "nvidia sm_90")] == (REFERENCE, [])
    assert grid[("route_hash", "nvidia sm_90")] == (MISSING, [])
    assert grid[("attention", "nvidia sm_100")] == (NOT_RUN, ["torch"])
    assert grid[("rms_norm", "xpu")] == (NOT_RUN, ["triton"])


def test_xpu_and_npu_never_validated_without_their_hardware():
    """Rows from the cpu lane (interpreter, AOT, fake devices) validate nothing on xpu / npu."""
    from hwinfer.ops.contract import all_ops
    rows = [_r(op, "triton", be, "xe-hpc" if be == "xpu" else "ascend910b", dev)
            for op in all_ops() for be in ("xpu", "npu")
            for dev in (results.INTERPRETER, results.FAKE, results.AOT, "")]
    grid = build(rows, sorted(all_ops()), matrix.impl_tables())
    for (op, col), (status, _) in grid.items():
        if col in ("xpu", "npu"):
            assert status != VALIDATED, (op, col)


def test_render_has_every_op_and_column():
    text = render([_r("rms_norm", "triton", "nvidia", "sm_90", H200)], OPS, TABLES,
                  {"nvidia": "hw", "xpu": "not run on hardware"}, COLS)
    assert "| op | nvidia sm_90 | nvidia sm_100 | xpu |" in text
    for op in OPS:
        assert re.search(rf"^\| {op} \|", text, re.M), op
    assert "✅ validated on hardware (triton)" in text
    assert "| nvidia | sm_90 | NVIDIA H200 | abc1234 | 2026-12-01 | 1 |" in text


def test_bench_series_prefers_rates_and_plots(tmp_path):
    rows = [_r("rms_norm", "triton", "nvidia", "sm_90", H200, "us@4096x4096", "us", 39.9),
            _r("rms_norm", "triton", "nvidia", "sm_90", H200, "GB/s@4096x4096", "GB/s", 3368.0),
            _r("rms_norm", "torch", "nvidia", "sm_90", H200, "us@4096x4096", "us", 48.6)]
    series = matrix.bench_series(rows)
    assert series[("rms_norm", "nvidia", "sm_90", "GB/s")] == [("4096x4096", "triton", 3368.0)]
    assert series[("rms_norm", "nvidia", "sm_90", "us")] == [("4096x4096", "torch", 48.6)]
    pytest.importorskip("matplotlib")
    made = matrix.plot(rows, tmp_path / "plots", tmp_path)
    assert len(made) == 2 and all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in made)


def test_main_writes_markdown_from_lane_csvs(tmp_path):
    csv = tmp_path / "results" / "nvidia-sm90.csv"
    results.append_rows(csv, [_r("rms_norm", "triton", "nvidia", "sm_90", H200)])
    out = tmp_path / "support-matrix.md"
    assert matrix.main(["--results", str(csv.parent), "--out", str(out), "--plots", ""]) == 0
    text = out.read_text()
    line = next(l for l in text.splitlines() if l.startswith("| rms_norm |"))
    assert "✅ validated on hardware (triton)" in line.split("|")[3]  # columns: op, cpu, nvidia sm_90
    assert "not run on hardware" in text


def _lane_sh_lanes() -> list[str]:
    text = (ROOT / "ci" / "lane.sh").read_text()
    return re.search(r'^lanes="([^"]+)"', text, re.M).group(1).split()


def test_lanes_agree_everywhere():
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((ROOT / "ci" / "matrix.yaml").read_text())["lanes"]
    lanes = list(spec)
    assert lanes == _lane_sh_lanes()
    assert lanes == [matrix.LANE_OF[c.title] for c in COLUMNS]
    workflows = sorted(p.stem.removeprefix("lane-") for p in (ROOT / ".github" / "workflows").glob("lane-*.yml"))
    assert workflows == sorted(lanes)
    for lane, conf in spec.items():
        flow = (ROOT / ".github" / "workflows" / f"lane-{lane}.yml").read_text()
        labels = "[" + ", ".join(conf["runner"]) + "]"
        assert f"runs-on: {labels}" in flow, lane
        assert conf["backend"] == next(c.backend for c in COLUMNS if matrix.LANE_OF[c.title] == lane)


def test_lane_script_refuses_unknown_lane():
    proc = subprocess.run(["bash", str(ROOT / "ci" / "lane.sh"), "no-such-lane"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_a_hardware_run_with_fewer_cases_than_the_contract_now_says_so():
    def counts(op, impl, passed, skipped=0):
        return [_r(op, impl, "nvidia", "sm_90", H200, "cases_passed", "cases", passed),
                _r(op, impl, "nvidia", "sm_90", H200, "cases_skipped", "cases", skipped),
                _r(op, impl, "nvidia", "sm_90", H200, "cases_failed", "cases", 0)]
    rows = [_r("rms_norm", "triton", "nvidia", "sm_90", H200), *counts("rms_norm", "triton", 10, 2),
            _r("gdn_recurrent", "triton", "nvidia", "sm_90", H200),
            *counts("gdn_recurrent", "triton", 12)]
    grid = build(rows, OPS, TABLES, COLS, items={"rms_norm": 12, "gdn_recurrent": 14})
    assert grid[("rms_norm", "nvidia sm_90")] == (VALIDATED, ["triton"])          # 10 + 2 of 12
    assert grid[("gdn_recurrent", "nvidia sm_90")] == (matrix.VALIDATED_FEWER, ["triton"])
    # without the contract's counts (or without per-case rows) nothing is downgraded
    assert build(rows, OPS, TABLES, COLS)[("gdn_recurrent", "nvidia sm_90")][0] == VALIDATED


def test_a_cell_whose_default_impl_never_ran_on_the_hardware_says_so():
    rows = [_r("rms_norm", "torch", "nvidia", "sm_90", H200),
            _r("rms_norm", "triton", "nvidia", "sm_90", results.INTERPRETER)]
    grid = build(rows, OPS, TABLES, COLS)
    # the torch impl passed on the H200, the Triton kernel the backend picks first did not run
    assert grid[("rms_norm", "nvidia sm_90")] == (matrix.VALIDATED_OTHER, ["torch"])
    rows.append(_r("rms_norm", "triton", "nvidia", "sm_90", H200))
    assert build(rows, OPS, TABLES, COLS)[("rms_norm", "nvidia sm_90")] == (
        VALIDATED, ["torch", "triton"])
