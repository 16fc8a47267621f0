"""AMD impl table. Same portable Triton kernels as NVIDIA, listed (and tuned) separately so an
AMD change never alters NVIDIA selection; portable torch kernels behind them."""
from hwinfer.backend import Impl, family, vendor
from hwinfer.backend.portable import portable_impls

IMPLS = [
    Impl("rms_norm", "triton", "hwinfer.kernels.triton.norm:rms_norm",
         when=family("cdna3", "cdna4", "rdna3", "rdna4"), priority=10,
         check="hwinfer.kernels.triton.norm:rms_norm_supported", requires=("triton",),
         interpretable=True),
    Impl("gdn_recurrent", "triton", "hwinfer.kernels.triton.delta_rule:gdn_recurrent",
         when=family("cdna3", "cdna4", "rdna3", "rdna4"), priority=10,
         check="hwinfer.kernels.triton.delta_rule:delta_rule_supported",
         requires=("triton",), interpretable=True),
    Impl("kda_recurrent", "triton", "hwinfer.kernels.triton.delta_rule:kda_recurrent",
         when=family("cdna3", "cdna4", "rdna3", "rdna4"), priority=10,
         check="hwinfer.kernels.triton.delta_rule:delta_rule_supported",
         requires=("triton",), interpretable=True),
    Impl("sparse_mla_decode", "triton", "hwinfer.kernels.triton.sparse_mla:sparse_mla_decode",
         when=family("cdna3", "cdna4", "rdna3", "rdna4"), priority=10,
         check="hwinfer.kernels.triton.sparse_mla:sparse_mla_decode_supported",
         requires=("triton",), interpretable=True),
    *portable_impls(vendor("amd"), priority=5),
]
