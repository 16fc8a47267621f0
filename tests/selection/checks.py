"""Per-call checks used by the synthetic selection tables."""


def only_small_rows(x, *args, **kwargs):
    return None if x.shape[-1] <= 32 else f"row width {x.shape[-1]} > 32"


def drifting_rms_norm(x, weight=None, *, eps=1e-6, weight_offset=0.0):
    """rms_norm off by 1% (a stand-in for a wrong kernel, found by the shadow check)."""
    from hwinfer.ops.norm import rms_norm
    return rms_norm(x, weight, eps=eps, weight_offset=weight_offset) * 1.01
