"""The Intel XPU and Ascend NPU tables against fake devices: what they choose, why they refuse,
how they detect, and that a broken torch_npu never breaks ``import hwinfer``.

Nothing here runs on an Intel GPU or an Ascend NPU; both backends stay "not run on hardware".
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from hwinfer.backend import fake_device, get_backend, select
from hwinfer.kernels.torch import KERNELS
from hwinfer.kernels.triton.catalog import PORTABLE_TRITON_KERNELS, ops_of_module

TRITON_OPS = [op for op, _, _ in PORTABLE_TRITON_KERNELS]
FUSED_NPU = ["rms_norm", "apply_rope", "attention", "paged_attention", "route_topk", "moe_experts"]


def _reasons(table, op: str) -> dict[str, str | None]:
    row = next(r for r in table.report() if r["op"] == op)
    return {c["impl"]: c["reason"] for c in row["candidates"]}


def _pretend_installed(monkeypatch, *names: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name in names:
            return importlib.util.spec_from_loader(name, loader=None)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# --------------------------------------------------------------------------------------------
# XPU

@pytest.mark.parametrize("op", TRITON_OPS)
def test_xpu_runs_every_catalog_kernel_through_intel_triton(op):
    table = select(fake_device("xpu"), bind=False, ops=[op])
    assert table.chosen(op) == "xpu.triton"


@pytest.mark.parametrize("op", TRITON_OPS)
def test_xpu_without_intel_triton_uses_torch_kernels(op):
    dev = replace(fake_device("xpu"), features=fake_device("xpu").features - {"triton_xpu"})
    table = select(dev, bind=False, ops=[op])
    # The portable torch kernel, or the reference where that is the deliberate torch choice.
    assert table.chosen(op) == ("xpu.torch" if op in KERNELS else "xpu.reference")
    assert _reasons(table, op)["xpu.triton"] == "needs has(triton_xpu), device has no triton_xpu"


def test_xpu_without_triton_package_is_refused_with_reason(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "triton" else real(name, *a, **k))
    table = select(fake_device("xpu"), bind=False, ops=["rms_norm"])
    assert table.chosen("rms_norm") == "xpu.torch"
    assert _reasons(table, "rms_norm")["xpu.triton"] == "package triton not installed"


def test_catalog_is_the_one_place_a_kernel_is_added():
    """Every catalog line becomes one triton impl in the XPU and NPU tables, nothing else."""
    for backend in ("xpu", "npu"):
        triton = [i for i in get_backend(backend).impls() if i.name == "triton"]
        assert [(i.op, i.target, i.check) for i in triton] == list(PORTABLE_TRITON_KERNELS)
        assert all(i.requires == ("triton",) and i.interpretable for i in triton)
    assert ops_of_module("hwinfer.kernels.triton.delta_rule") == ["gdn_recurrent", "gdn_gated_recurrent",
                                                                  "kda_recurrent", "kda_gated_recurrent"]


def test_every_portable_kernel_has_an_nvidia_and_an_amd_impl():
    """The GPU tables list their impls by hand (with per-family predicates): a catalog kernel
    missing there would run as the torch composition on the card (gdn_gated_recurrent once
    did, and its input check's sync turned CUDA graphs off)."""
    import importlib

    for vendor in ("nvidia", "amd"):
        impls = importlib.import_module(f"hwinfer_{vendor}.impls").IMPLS
        triton = {(i.op, i.target) for i in impls if i.name == "triton"}
        missing = [op for op, target, _ in PORTABLE_TRITON_KERNELS if (op, target) not in triton]
        assert not missing, f"{vendor}: no triton impl for {missing}"


@pytest.mark.parametrize("name,arch,family", [
    ("Intel(R) Data Center GPU Max 1550", "xe-hpc", "xe"),
    ("Intel(R) Data Center GPU Flex 170", "xe-hpg", "xe"),
    ("Intel(R) Arc(TM) A770 Graphics", "xe-hpg", "xe"),
    ("Intel(R) Arc(TM) B580 Graphics", "xe2-hpg", "xe2"),
    ("Intel(R) Arc(TM) Pro B60 Graphics", "xe2-hpg", "xe2"),
    ("Intel(R) Arc(TM) 140V GPU (16GB)", "xe2-lpg", "xe2"),
    ("Intel(R) Arc(TM) B390 GPU", "xe3-lpg", "xe3"),
    ("Intel(R) Arc(TM) Graphics", "xe-lpg", "xe"),
    ("Intel(R) Iris(R) Xe Graphics", "xe-lp", "xe"),
    ("something new", "xe", "xe"),
])
def test_xpu_arch_from_device_name(name, arch, family):
    from hwinfer_xpu.detection import arch_from_name
    assert arch_from_name(name) == (arch, family)


def test_xpu_detection_through_torch_xpu(monkeypatch):
    import torch
    import hwinfer_xpu.detection as det

    class Props:
        name = "Intel(R) Data Center GPU Max 1550"
        total_memory = 64 << 30
        has_fp16, has_fp64, has_subgroup_matrix_multiply_accumulate = True, True, True

    class FakeXpu:
        is_available = staticmethod(lambda: True)
        device_count = staticmethod(lambda: 2)
        get_device_properties = staticmethod(lambda i: Props())

    monkeypatch.setattr(torch, "xpu", FakeXpu, raising=False)
    monkeypatch.setattr(det, "intel_triton_present", lambda: False)
    devs = det.detect()
    assert [d.index for d in devs] == [0, 1]
    d = devs[0]
    assert (d.vendor, d.arch, d.family, d.device_type) == ("intel", "xe-hpc", "xe", "xpu")
    assert {"bf16", "fp16", "fp64", "dpas"} <= d.features and "triton_xpu" not in d.features
    assert d.memory_bytes == 64 << 30


def test_xpu_detects_nothing_on_cpu_torch():
    from hwinfer_xpu.detection import detect
    import torch
    if torch.xpu.is_available():
        pytest.skip("an XPU is present")
    assert detect() == []


def test_intel_and_ascend_triton_are_told_by_backend_folder(tmp_path, monkeypatch):
    from hwinfer_npu import ascend_triton_present
    from hwinfer_xpu.detection import intel_triton_present
    pkg = tmp_path / "triton"
    (pkg / "backends" / "nvidia").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    importlib.invalidate_caches()
    assert not intel_triton_present() and not ascend_triton_present()
    (pkg / "backends" / "intel").mkdir()
    (pkg / "backends" / "ascend").mkdir()
    assert intel_triton_present() and ascend_triton_present()


# --------------------------------------------------------------------------------------------
# NPU

@pytest.mark.parametrize("op", FUSED_NPU)
def test_npu_fused_ops_refused_without_torch_npu(op):
    table = select(fake_device("npu"), bind=False, ops=[op])
    assert _reasons(table, op)["npu.torch_npu"] == "package torch_npu not installed"
    assert table.chosen(op) in ("npu.torch", "npu.reference")


@pytest.mark.parametrize("op", FUSED_NPU)
def test_npu_fused_ops_chosen_when_torch_npu_is_installed(op, monkeypatch):
    _pretend_installed(monkeypatch, "torch_npu")
    table = select(fake_device("npu"), bind=False, ops=[op])
    assert table.chosen(op) == "npu.torch_npu"


def test_npu_triton_ascend_only_where_present(monkeypatch):
    plain = select(fake_device("npu"), bind=False, ops=["gdn_recurrent"])
    assert plain.chosen("gdn_recurrent") == "npu.torch"
    assert _reasons(plain, "gdn_recurrent")["npu.triton"] == "needs has(triton_npu), device has no triton_npu"
    with_ascend = fake_device("npu").with_features("triton_npu")
    for op in TRITON_OPS:
        chosen = select(with_ascend, bind=False, ops=[op]).chosen(op)
        assert chosen == "npu.triton", op
    _pretend_installed(monkeypatch, "torch_npu")
    # the fused torch_npu op outranks the Triton kernel where both exist
    assert select(with_ascend, bind=False, ops=["rms_norm"]).chosen("rms_norm") == "npu.torch_npu"


def test_npu_fused_impls_document_their_deviation():
    for impl in get_backend("npu").impls():
        if impl.name == "torch_npu":
            assert impl.note, f"{impl.op}: a fused adapter must say where it deviates"


STUB = "raise OSError('libhccl.so: cannot open shared object file (stub torch_npu without CANN)')\n"

PROBE = textwrap.dedent("""
    import torch, hwinfer, hwinfer_npu
    from hwinfer.backend import detect_devices, fake_device, resolve_device, select
    from hwinfer.cli import main
    devices, errors = detect_devices()
    assert resolve_device("cpu").vendor == "cpu"
    assert any(e.backend == "npu" and "torch_npu" in e.error for e in errors), errors
    table = select(fake_device("npu"), ops=["attention", "rms_norm"])
    reasons = {c["impl"]: c["reason"] for r in table.report() if r["op"] == "attention"
               for c in r["candidates"]}
    assert table.chosen("attention") == "npu.torch", table.chosen("attention")
    assert "import of hwinfer_npu.ops:attention failed" in reasons["npu.torch_npu"], reasons
    assert main(["info", "--device", "cpu"]) == 0
    print("OK")
""")


def test_broken_torch_npu_breaks_nothing(tmp_path):
    """A torch_npu that raises on import (installed without CANN): hwinfer imports, the CPU
    resolves, the npu table refuses the fused ops with the reason, `hwinfer info` works."""
    stub = tmp_path / "torch_npu"
    stub.mkdir()
    (stub / "__init__.py").write_text(STUB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=240, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


# --------------------------------------------------------------------------------------------
# Honesty: neither backend may claim validation.

@pytest.mark.parametrize("name", ["xpu", "npu"])
def test_not_run_on_hardware_is_what_they_say(name):
    status = get_backend(name).hardware_status
    assert status == "not run on hardware"


def test_info_reports_xpu_and_npu_as_not_run_on_hardware():
    from hwinfer.info import gather, render
    text = render(gather(fake="xpu"))
    for name in ("xpu", "npu"):
        line = next(l for l in text.splitlines() if l.strip().startswith(name + " "))
        assert "[not run on hardware]" in line and "validated" not in line
