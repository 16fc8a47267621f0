"""Every Triton kernel compiles ahead of time for sm_90, sm_100, gfx942 and gfx950 (no GPU)."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from hwinfer.kernels.triton.aot import SHARED_BYTES, TARGETS, all_specs, compile_spec  # noqa: E402

SPECS = all_specs()


def test_there_are_kernels_to_compile():
    assert SPECS, "no AOT_SPECS found in hwinfer.kernels.triton"


# Every spec for every target it is built for (PDL variants: the NVIDIA targets only).
CASES = [(s, t) for s in SPECS for t in TARGETS if s.targets is None or t in s.targets]


@pytest.mark.parametrize("spec,target", CASES, ids=[f"{s.name}-{t}" for s, t in CASES])
def test_compiles(spec, target, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a cold cache: really compile
    info = compile_spec(spec, target)
    assert info["magic"] == b"\x7fELF", f"{info['binary']} is not an ELF object"
    assert info["bytes"] > 1000
    if spec.check_shared:   # a launch that would fail with "out of resource: shared memory"
        assert info["shared"] <= SHARED_BYTES[target], (info["shared"], SHARED_BYTES[target])
