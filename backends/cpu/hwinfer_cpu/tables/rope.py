"""CPU impls for the rope family.

apply_rope: vectorised torch (complex multiply for interleaved pairs, in-place rotate-half, one
output allocation). rope_tables: the reference itself (a few vector ops per step, computed once
per forward; it already matches transformers' tables bit for bit).
"""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("apply_rope", "torch", "hwinfer.kernels.torch.rope:apply_rope", when=vendor("cpu"),
         priority=10),
    Impl("rope_tables", "reference", "hwinfer.ops.rope:rope_tables", when=vendor("cpu"),
         priority=0, is_reference=True),
]
