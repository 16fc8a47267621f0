"""The conformance-to-CSV bridge, on a synthetic suite and on the real conformance suite."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hwinfer.ci import results

ROOT = Path(__file__).resolve().parents[2]

SYNTHETIC = "tests/ci/synthetic_suite.py"  # run by path: its name keeps it out of normal runs



def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HWINFER_COMMIT": "c0ffee1",
           "HWINFER_RESULTS_DATE": "2026-12-01"}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "hwinfer.ci.pytest_plugin", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_bridge_rows_from_a_synthetic_and_the_real_suite(tmp_path):
    """One pytest run (a subprocess costs an import of torch): the synthetic items cover every
    status, the real conformance suite's rms_norm items prove the bridge reads its items."""
    out = tmp_path / "out.csv"
    proc = _pytest([SYNTHETIC, "tests/conformance/test_conformance.py", "--backend", "cpu", "-k",
                    "synthetic_suite or (test_impl_matches_reference and rms_norm-torch)",
                    "--results-csv", str(out)], ROOT)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # two fail on purpose
    assert "2 failed" in proc.stdout, proc.stdout[-2000:]  # bad conformance item, gfx950 AOT
    rows = results.read_rows(out)
    got = {(r["op"], r["impl"], r["backend"], r["metric"]): (r["value"], r["unit"]) for r in rows}
    assert got[("rms_norm", "triton", "cpu", "conformance")] == ("0", "failed")
    assert got[("rms_norm", "triton", "cpu", "cases_passed")] == ("1", "cases")
    assert got[("rms_norm", "triton", "cpu", "cases_failed")] == ("1", "cases")
    assert got[("rms_norm", "triton", "cpu", "cases_skipped")] == ("1", "cases")
    assert got[("attention", "torch", "cpu", "conformance")] == ("0", "skipped")
    assert got[("gdn_gate", "reference", "cpu", "conformance")] == ("0", "reference")
    assert got[("route_hash", "", "cpu", "impl_missing")] == ("1", "")
    assert got[("no_such_kernel", "kernel", "nvidia", "aot_compile")] == ("1", "passed")
    assert got[("no_such_kernel", "kernel", "amd", "aot_compile")] == ("0", "failed")
    # the real suite: the portable torch rms_norm on this CPU
    assert got[("rms_norm", "torch", "cpu", "conformance")] == ("1", "passed")
    assert {(r["commit"], r["date"]) for r in rows} == {("c0ffee1", "2026-12-01")}
    aot = [r for r in rows if r["metric"] == "aot_compile"]
    assert {r["device"] for r in aot} == {results.AOT} and {r["arch"] for r in aot} == {"sm_90", "gfx950"}
    conf = [r for r in rows if r["metric"] == "conformance"]
    assert all(results.on_hardware(r["device"]) for r in conf)  # the host CPU is real hardware
