"""The CPU backend's impl table: every portable torch kernel, and the reference where it is
already the best plain torch can do. Timings behind these choices: docs/cpu-backend.md."""
from hwinfer.backend import Impl, vendor
from hwinfer.backend.portable import portable_impls


def all_impls() -> list[Impl]:
    return portable_impls(vendor("cpu"), priority=10)
