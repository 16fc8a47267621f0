"""Intel XPU impl table: the portable Triton kernels (hwinfer.kernels.triton.catalog) where
Intel's Triton backend is present, then the portable torch kernels on torch.xpu.

A new portable Triton kernel reaches this table by its line in the catalog; list an XPU-only
kernel or tuning here."""
from hwinfer.backend import Impl, has, vendor
from hwinfer.backend.portable import portable_impls, triton_impls

INTEL = vendor("intel")


def all_impls() -> list[Impl]:
    return [*triton_impls(INTEL & has("triton_xpu"), priority=10),
            *portable_impls(INTEL, priority=5)]
