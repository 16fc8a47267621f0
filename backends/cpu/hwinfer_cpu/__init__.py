"""hwinfer's CPU backend: the host CPU, vectorised torch implementations, gloo for parallelism.

Its impls are the portable torch kernels of ``hwinfer.kernels.torch``, listed
with CPU priorities. With nothing else installed, every op resolves on the CPU:
to one of these impls where it beats the reference, else to the reference itself.
"""
from hwinfer.backend import Backend, cpu_info

from hwinfer_cpu.impls import all_impls


def _detect():
    return [cpu_info()]


backend = Backend(
    name="cpu",
    vendors=("cpu",),
    detect=_detect,
    impl_table=all_impls,
    dist_backend="gloo",
    hardware_status="validated on this machine's CPU by the conformance suite in CI",
)
