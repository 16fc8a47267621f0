"""Ascend impl table: torch_npu fused ops where they fit our contracts (each with a per-call
check that refuses what the fused op cannot serve), the portable Triton kernels through
Triton-Ascend where it is installed (the device then carries ``triton_npu``), then the portable
torch kernels on the npu device. Not run on hardware."""
from hwinfer.backend import Impl, has, vendor
from hwinfer.backend.portable import portable_impls, triton_impls

HUAWEI = vendor("huawei")
_OPS = "hwinfer_npu.ops"


def _fused(op: str, check: bool, note: str) -> Impl:
    return Impl(op, "torch_npu", f"{_OPS}:{op}", when=HUAWEI, priority=20,
                check=f"{_OPS}:{op}_supported" if check else None, requires=("torch_npu",),
                note=note)


FUSED = [
    _fused("rms_norm", False, "npu_rms_norm; weight multiplies in x.dtype (contract: fp32)"),
    _fused("apply_rope", True, "npu_rotary_mul on the rotary slice, upcast to fp32"),
    _fused("attention", True, "npu_fused_infer_attention_score TND; no sinks, no window"),
    _fused("paged_attention", True,
           "npu_fused_infer_attention_score with block_table; no sinks, no window"),
    _fused("route_topk", True,
           "npu_moe_gating_top_k_softmax / npu_moe_gating_top_k within documented limits"),
    _fused("moe_experts", True,
           "npu_grouped_matmul x2; projections rounded to x.dtype between the matmuls, so "
           "clamped / SiTU / swiglu_oai activations are refused"),
]


def all_impls() -> list[Impl]:
    return [*FUSED,
            *triton_impls(HUAWEI & has("triton_npu"), priority=10),
            *portable_impls(HUAWEI, priority=5)]
