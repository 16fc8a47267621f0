"""NVIDIA impl table: Triton kernels first, then the portable torch kernels (priority 5) for ops
that have no Triton kernel yet, then the deliberate reference choices."""
from hwinfer.backend import Impl, min_sm, vendor
from hwinfer.backend.portable import portable_impls

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm", when=min_sm(80),
         priority=10, check="hwinfer.kernels.triton.norm:rms_norm_supported",
         requires=("triton",), interpretable=True),
    Impl("gdn_recurrent", "triton", "hwinfer.kernels.triton.delta_rule:gdn_recurrent",
         when=min_sm(80), priority=10,
         check="hwinfer.kernels.triton.delta_rule:delta_rule_supported",
         requires=("triton",), interpretable=True),
    Impl("kda_recurrent", "triton", "hwinfer.kernels.triton.delta_rule:kda_recurrent",
         when=min_sm(80), priority=10,
         check="hwinfer.kernels.triton.delta_rule:delta_rule_supported",
         requires=("triton",), interpretable=True),
    Impl("sparse_mla_decode", "triton", "hwinfer.kernels.triton.sparse_mla:sparse_mla_decode",
         when=min_sm(80), priority=10,
         check="hwinfer.kernels.triton.sparse_mla:sparse_mla_decode_supported",
         requires=("triton",), interpretable=True),
    *portable_impls(vendor("nvidia"), priority=5),
]
