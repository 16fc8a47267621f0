"""The results CSV schema and the benchmark-output parser (CSV lines and the older tables)."""
from __future__ import annotations

import pytest

from hwinfer.ci import results
from hwinfer.ci.bench import default_op, parse

OPS = {"rms_norm", "gdn_recurrent", "kda_recurrent", "sparse_mla_decode", "sparse_mla_prefill",
       "moe_experts"}

OUTPUT = """\
device: cuda:0: NVIDIA H200 [nvidia sm_90 hopper; bf16,fp8,tma,wgmma]; chosen rms_norm: nvidia.triton
op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak
moe_experts,triton,T=256 E=64,120.5,412.3,TFLOP/s,52.9
paged_attention,triton,B=32,L=8k,55.0,2000.0,GB/s,46.8
rms_norm [8192x4096] bfloat16  reference     462.6 us      290 GB/s  max|diff| 1.6e-02
gdn_recurrent B=32 T=1 packed        triton bv16w1        12.3 us    1,234 GB/s (28.9% of peak)  rel-rmse vs ref: o 1e-3
dsv4 CSA K=128+512   B=1           triton bh16 w4 s1             10.0 us      300 GB/s (  7.0% of peak)  max|diff| 1e-2
dsv4 CSA K=128+512   B=1           torch                     failed: OutOfMemoryError
fla not available (ImportError: no fla)
"""


def _by_metric(rows):
    return {(r["op"], r["impl"], r["metric"]): (r["value"], r["unit"]) for r in rows}


def test_parse_csv_and_table_lines():
    rows = parse(OUTPUT, script="bench_sparse_mla.py", backend="nvidia", arch="sm_90", ops=OPS,
                 commit="abc1234", date="2026-12-01")
    got = _by_metric(rows)
    assert got[("moe_experts", "triton", "us@T=256 E=64")] == ("120.5", "us")
    assert got[("moe_experts", "triton", "TFLOP/s@T=256 E=64")] == ("412.3", "TFLOP/s")
    assert got[("moe_experts", "triton", "pct_of_peak@T=256 E=64")] == ("52.9", "%")
    assert got[("rms_norm", "reference", "GB/s@[8192x4096] bfloat16")] == ("290", "GB/s")
    assert ("rms_norm", "reference", "pct_of_peak@[8192x4096] bfloat16") not in got
    assert got[("gdn_recurrent", "triton bv16w1", "GB/s@B=32 T=1 packed")] == ("1234", "GB/s")
    assert got[("sparse_mla_decode", "triton bh16 w4 s1", "us@dsv4 CSA K=128+512 B=1")] == ("10", "us")
    assert got[("paged_attention", "triton", "GB/s@B=32,L=8k")] == ("2000", "GB/s")
    assert len(rows) == 3 + 3 + 2 + 3 + 3  # failed and note lines give nothing
    assert {r["device"] for r in rows} == {"NVIDIA H200"}
    assert {(r["backend"], r["arch"], r["commit"], r["date"]) for r in rows} == {
        ("nvidia", "sm_90", "abc1234", "2026-12-01")}


def test_default_op_from_script_name():
    assert default_op("scripts/bench_rms_norm.py", OPS) == "rms_norm"
    assert default_op("bench_sparse_mla.py", OPS) == "sparse_mla_decode"
    assert default_op("bench_moe.py", OPS) == "moe_experts"
    assert default_op("bench_delta_rule.py", OPS) == "delta_rule"


def test_results_roundtrip_and_append(tmp_path):
    path = tmp_path / "lane.csv"
    first = [results.row("rms_norm", "triton", "nvidia", "sm_90", "NVIDIA H200", "conformance", 1,
                         "passed", "abc1234", "2026-12-01")]
    second = [results.row("rms_norm", "triton", "nvidia", "sm_90", "NVIDIA H200", "us@4096x4096",
                          39.91234567, "us", "abc1234", "2026-12-01")]
    results.append_rows(path, first)
    results.append_rows(path, second)
    text = path.read_text().splitlines()
    assert text[0] == ",".join(results.FIELDS) and len(text) == 3
    rows = results.read_rows(tmp_path)
    assert rows[0]["value"] == "1" and rows[1]["value"] == "39.9123"


def test_read_rejects_other_csv(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a results CSV"):
        results.read_rows(tmp_path / "x.csv")


def test_only_named_devices_count_as_hardware():
    assert results.on_hardware("NVIDIA H200")
    for device in (results.INTERPRETER, results.AOT, results.FAKE, "absent", ""):
        assert not results.on_hardware(device)


def test_commit_and_date_can_be_pinned(monkeypatch):
    monkeypatch.setenv("HWINFER_COMMIT", "deadbee")
    monkeypatch.setenv("HWINFER_RESULTS_DATE", "2026-01-02")
    assert results.commit_id() == "deadbee" and results.today() == "2026-01-02"
