"""hwinfer.ci.ceilings: the peaks a benchmark's % is of (the card's own, or as set)."""
from __future__ import annotations

import importlib


def _fresh(monkeypatch, **env):
    import hwinfer.ci.ceilings as ceilings

    for name in ("HWINFER_PEAK_GBS", "HWINFER_PEAK_TFLOPS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return importlib.reload(ceilings)


def test_env_sets_the_ceilings(monkeypatch):
    c = _fresh(monkeypatch, HWINFER_PEAK_GBS="3024", HWINFER_PEAK_TFLOPS="650.5")
    assert c.peak("GB/s") == 3024.0 and c.peak("TFLOP/s") == 650.5
    line = c.describe()
    assert "3024 GB/s (set)" in line and "TFLOP/s (set)" in line


def test_without_a_gpu_the_h200_figures_are_named_as_such(monkeypatch):
    c = _fresh(monkeypatch)
    monkeypatch.setattr(c, "_on_gpu", lambda: False)
    assert c.copy_gbps() == c.H200_GBPS and c.matmul_tflops() == c.H200_TFLOPS
    line = c.describe(("GB/s",))
    assert "no GPU" in line and "(H200's)" in line and "TFLOP/s" not in line
    # one line, no commas: the results parser takes a line with six commas for a CSV row
    assert "," not in line and "\n" not in line


def test_measured_once_per_process(monkeypatch):
    c = _fresh(monkeypatch)
    calls = []
    monkeypatch.setattr(c, "_on_gpu", lambda: True)

    def bench(fn):
        calls.append(fn)
        return 0.5   # ms for 2 GiB moved
    monkeypatch.setattr(c, "_bench_ms", bench)
    import torch
    monkeypatch.setattr(torch, "empty", lambda *a, **k: torch.zeros(4))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    first = c.copy_gbps()
    assert abs(first - 2 * (1 << 30) / 0.5 / 1e6) < 1e-6
    assert c.copy_gbps() == first and len(calls) == 1
