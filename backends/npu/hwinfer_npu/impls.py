"""Ascend impl table: torch_npu fused ops where they fit our contracts."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("rms_norm", "torch_npu", "hwinfer_npu.ops:rms_norm", when=vendor("huawei"), priority=10,
         requires=("torch_npu",),
         note="weight multiplies in x.dtype inside the fused op (contract: fp32)"),
]
