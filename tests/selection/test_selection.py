"""Selection without hardware: fake DeviceInfo for sm_90, sm_100, gfx942, gfx950, an Intel XPU,
an Ascend NPU and the CPU, against the installed backends and against synthetic tables."""
from __future__ import annotations

import pytest
import torch

from hwinfer.backend import (
    ANY, Backend, Impl, SelectionError, backends, fake_device, family, has, min_sm, select, vendor,
)
from hwinfer.ops import all_ops

FAKES = ["sm_90", "sm_100", "gfx942", "gfx950", "xpu", "npu", "cpu"]

# What the installed backends must choose for rms_norm on each fake device, without binding.
EXPECTED_RMS_NORM = {
    "sm_90": "nvidia.triton",
    "sm_100": "nvidia.triton",
    "gfx942": "amd.triton",
    "gfx950": "amd.triton",
    "xpu": "xpu.triton",
    "npu": "npu.torch",  # torch_npu is not installed here: refused with that reason
    "cpu": "cpu.torch",
}


@pytest.mark.parametrize("name", FAKES)
def test_every_op_resolves_on_every_fake_device(name):
    table = select(fake_device(name), bind=False)
    assert set(table.choices) == set(all_ops())
    for row in table.report():
        refused = [c for c in row["candidates"] if c["status"] == "refused"]
        assert all(c["reason"] for c in refused), f"{row['op']}: a refusal without a reason"


@pytest.mark.parametrize("name", FAKES)
def test_installed_backends_choose_expected_rms_norm(name):
    table = select(fake_device(name), bind=False, ops=["rms_norm"])
    assert table.chosen("rms_norm") == EXPECTED_RMS_NORM[name]


def test_refusal_reasons_name_the_cause():
    table = select(fake_device("sm_90"), bind=False, ops=["rms_norm"])
    reasons = {c["impl"]: c["reason"] for c in table.report()[0]["candidates"]}
    assert reasons["amd.triton"] == "backend amd does not serve vendor nvidia"
    assert reasons["cpu.torch"] == "backend cpu does not serve vendor nvidia"
    npu = select(fake_device("npu"), bind=False, ops=["rms_norm"])
    npu_reasons = {c["impl"]: c["reason"] for c in npu.report()[0]["candidates"]}
    assert npu_reasons["npu.torch_npu"] == "package torch_npu not installed"


@pytest.mark.parametrize("name", FAKES)
def test_every_vendor_resolves_every_op_without_fallback(name):
    """Each vendor lists a kernel or a deliberate reference choice for every op (strict passes)."""
    table = select(fake_device(name), strict=True, bind=False)
    # the Triton tables wherever Triton serves the vendor (the npu fake has no triton-ascend)
    triton_served = name not in ("npu", "cpu")
    backend = table.choices["attention"].chosen.backend
    assert table.chosen("attention") == f"{backend}.{'triton' if triton_served else 'torch'}"
    assert table.chosen("rope_tables").endswith(".triton" if triton_served else ".reference")


def test_cpu_binds_every_op_without_fallback():
    """With only what CI installs, every op resolves on the CPU to a deliberate choice."""
    table = select(fake_device("cpu"), strict=True)
    for name in all_ops():
        assert callable(getattr(table, name))


# ---------------------------------------------------------------------------------------------
# Synthetic tables: priorities, predicates, per-call checks, strict mode, overrides, import errors.

def _ops_module_target(name: str) -> str:
    return f"{all_ops()[name].reference.__module__}:{all_ops()[name].reference.__name__}"


REF = _ops_module_target("rms_norm")


def _toy_backends() -> list[Backend]:
    gpu = Backend("toygpu", ("nvidia", "amd"), detect=lambda: [], impl_table=lambda: [
        Impl("rms_norm", "blackwell_fp4", REF, when=min_sm(100), priority=30),
        Impl("rms_norm", "hopper", REF, when=min_sm(90) & has("tma"), priority=20),
        Impl("rms_norm", "cdna4", REF, when=family("cdna4"), priority=20),
        Impl("rms_norm", "portable", REF, when=vendor("nvidia", "amd"), priority=10,
             check="tests.selection.checks:only_small_rows"),
        Impl("rms_norm", "broken", "no_such_module_xyz:fn", when=ANY, priority=40),
    ])
    return [gpu]


@pytest.mark.parametrize("name,expected", [
    ("sm_90", "toygpu.hopper"), ("sm_100", "toygpu.blackwell_fp4"),
    ("gfx942", "toygpu.portable"), ("gfx950", "toygpu.cdna4"),
    ("xpu", "reference"), ("npu", "reference"), ("cpu", "reference"),
])
def test_priorities_and_predicates(name, expected):
    table = select(fake_device(name), backends=_toy_backends(), ops=["rms_norm"])
    assert table.chosen("rms_norm") == expected


def test_import_failure_is_a_refusal_with_reason():
    table = select(fake_device("sm_90"), backends=_toy_backends(), ops=["rms_norm"])
    reasons = {c["impl"]: c["reason"] for c in table.report()[0]["candidates"]}
    assert "import of no_such_module_xyz:fn failed" in reasons["toygpu.broken"]
    assert reasons["toygpu.blackwell_fp4"] == "needs sm>=100, device has sm=90"


def test_predicate_text_is_printable():
    pred = vendor("nvidia") & min_sm(90) & has("fp8")
    assert str(pred) == "vendor=nvidia & sm>=90 & has(fp8)"
    assert pred.why_not(fake_device("gfx942")) == "needs vendor=nvidia, device has vendor=amd"
    assert str(family("cdna3") | family("cdna4")) == "family=cdna3 | family=cdna4"


def test_strict_refuses_reference_fallback():
    with pytest.raises(SelectionError, match="strict mode: op 'rms_norm' would fall back"):
        select(fake_device("xpu"), backends=_toy_backends(), ops=["rms_norm"], strict=True)


def test_per_call_check_falls_through_to_reference_and_strict_raises():
    table = select(fake_device("gfx942"), backends=_toy_backends(), ops=["rms_norm"])
    small, wide = torch.randn(2, 8), torch.randn(2, 64)
    torch.testing.assert_close(table.rms_norm(small), all_ops()["rms_norm"].reference(small))
    torch.testing.assert_close(table.rms_norm(wide), all_ops()["rms_norm"].reference(wide))
    strict = select(fake_device("gfx942"), backends=_toy_backends(), ops=["rms_norm"], strict=True)
    strict.rms_norm(small)
    with pytest.raises(SelectionError, match="every impl refused this call"):
        strict.rms_norm(wide)


def test_explicit_override_wins_or_fails_loudly(monkeypatch):
    table = select(fake_device("sm_100"), backends=_toy_backends(), ops=["rms_norm"],
                   impl={"rms_norm": "hopper"})
    assert table.chosen("rms_norm") == "toygpu.hopper"
    with pytest.raises(SelectionError, match="cannot run: needs family=cdna4"):
        select(fake_device("sm_90"), backends=_toy_backends(), ops=["rms_norm"],
               impl={"rms_norm": "cdna4"})
    with pytest.raises(SelectionError, match="has no such impl"):
        select(fake_device("sm_90"), backends=_toy_backends(), ops=["rms_norm"],
               impl={"rms_norm": "nonexistent"})
    with pytest.raises(SelectionError, match="unknown op"):
        select(fake_device("sm_90"), backends=_toy_backends(), impl={"no_such_op": "x"})
    # a short name that several backends' impls carry: the one that can run on this device
    real = select(fake_device("sm_90"), ops=["rms_norm"], impl={"rms_norm": "torch"})
    assert real.chosen("rms_norm") == "nvidia.torch"
    monkeypatch.setenv("HWINFER_IMPL", "rms_norm=reference")
    assert select(fake_device("sm_90"), backends=_toy_backends(), ops=["rms_norm"]).chosen("rms_norm") == "reference"
    monkeypatch.setenv("HWINFER_IMPL", "rms_norm")
    with pytest.raises(SelectionError, match="must look like op=impl"):
        select(fake_device("sm_90"), backends=_toy_backends(), ops=["rms_norm"])


def test_unknown_op_in_a_backend_table_is_an_error():
    bad = Backend("bad", ("cpu",), detect=lambda: [], impl_table=lambda: [Impl("no_such_op", "x", REF)])
    with pytest.raises(SelectionError, match="unknown op 'no_such_op'"):
        select(fake_device("cpu"), backends=[bad])


def test_all_five_vendor_backends_are_installed():
    assert {b.name for b in backends()} >= {"cpu", "nvidia", "amd", "xpu", "npu"}


def test_shadow_check_names_the_drifting_kernel(monkeypatch, caplog):
    """HWINFER_SHADOW runs the reference beside each call: a wrong impl is named on its first call."""
    from hwinfer.backend.shadow import ShadowMismatch
    drift = [Backend("toygpu", ("nvidia",), detect=lambda: [], impl_table=lambda: [
        Impl("rms_norm", "drifting", "tests.selection.checks:drifting_rms_norm", priority=5),
        Impl("rms_norm", "exact", REF, when=has("tma"), priority=9),
    ])]
    x = torch.randn(3, 16)
    table = select(fake_device("sm_90"), backends=drift, ops=["rms_norm"], shadow="raise")
    assert table.chosen("rms_norm") == "toygpu.exact"
    torch.testing.assert_close(table.rms_norm(x), all_ops()["rms_norm"].reference(x))
    monkeypatch.setenv("HWINFER_SHADOW", "raise")
    table = select(fake_device("sm_90"), backends=drift, ops=["rms_norm"], impl={"rms_norm": "drifting"})
    with pytest.raises(ShadowMismatch, match=r"rms_norm: toygpu.drifting differs from the reference \(x=\[3, 16\]:float32\)"):
        table.rms_norm(x)
    monkeypatch.setenv("HWINFER_SHADOW", "warn")
    table = select(fake_device("sm_90"), backends=drift, ops=["rms_norm"], impl={"rms_norm": "drifting"})
    with caplog.at_level("WARNING", logger="hwinfer.shadow"):
        out = table.rms_norm(x)
        table.rms_norm(x)
    assert torch.equal(out, all_ops()["rms_norm"].reference(x) * 1.01)  # warn mode returns the impl's output
    assert len([r for r in caplog.records if "toygpu.drifting differs" in r.getMessage()]) == 1
    monkeypatch.setenv("HWINFER_SHADOW", "loud")
    with pytest.raises(SelectionError, match="HWINFER_SHADOW must be one of off, warn, raise"):
        select(fake_device("sm_90"), backends=drift, ops=["rms_norm"])


def test_per_call_checks_get_the_arguments_by_name_as_bind_partial_gives_them():
    import inspect

    from hwinfer.backend.select import _arguments_by_name

    def ref(x, w=None, /, bias=None, *, eps=1e-6):
        """doc"""

    def loose(x, *rest, **extra):
        """doc"""
    for fn, calls in ((ref, (((1,), {}), ((1, 2), {"eps": 3}), ((1, 2, 4), {}), ((1,), {"bias": 5}))),
                      (loose, (((1, 2, 3), {"eps": 3}), ((1,), {})))):
        by_name, sig = _arguments_by_name(fn), inspect.signature(fn)
        for args, kwargs in calls:
            assert by_name(args, kwargs) == dict(sig.bind_partial(*args, **kwargs).arguments)
    with pytest.raises(TypeError, match="3 positional arguments but 4"):
        _arguments_by_name(ref)((1, 2, 3, 4), {})
