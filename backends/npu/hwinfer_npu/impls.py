"""Ascend impl table: torch_npu fused ops where they fit our contracts, then the portable torch
kernels on the npu device."""
from hwinfer.backend import Impl, vendor
from hwinfer.backend.portable import portable_impls

IMPLS = [
    Impl("rms_norm", "torch_npu", "hwinfer_npu.ops:rms_norm", when=vendor("huawei"), priority=10,
         requires=("torch_npu",),
         note="weight multiplies in x.dtype inside the fused op (contract: fp32)"),
    *portable_impls(vendor("huawei"), priority=5),
]
