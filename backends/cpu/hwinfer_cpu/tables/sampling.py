"""CPU impls for sampling: the reference is already one vectorised sort per row."""
from hwinfer.backend import Impl, vendor

IMPLS = [
    Impl("sample", "reference", "hwinfer.ops.sampling:sample", when=vendor("cpu"), priority=0,
         is_reference=True),
]
