"""Vectorised torch RoPE application (contract: :func:`hwinfer.ops.rope.apply_rope`).

* Interleaved pairs are rotated as one complex multiply (``view_as_complex`` of the rotary
  slice times ``cos + i sin``). torch's vectorised CPU complex multiply evaluates ``a c - b s`` /
  ``a s + b c`` with plain multiplies and adds (bit-identical to the reference); its scalar
  tail may fuse a multiply-add, an fp32 ulp away.
* Rotate-half writes ``a c`` then ``addcmul_``s ``-b s`` in place (likewise ``b c + a s``), with
  no temporaries.
* One output allocation: pass-through channels are copied into it once and fp32 results are
  written straight into its rotary slice (the reference clones the head, then builds the
  rotated slice from several temporaries and assigns it).

``rope_tables`` has no impl here: the reference is already a handful of vector ops per step.
"""
from __future__ import annotations

import torch


def _complex_viewable(t: torch.Tensor) -> bool:
    """view_as_complex needs a unit last stride and even offset and other strides."""
    return (t.stride(-1) == 1 and t.storage_offset() % 2 == 0
            and all(st % 2 == 0 for st in t.stride()[:-1]))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, start: int = 0,
               interleaved: bool = False, inverse: bool = False) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.rope.apply_rope`."""
    if x.dim() not in (2, 3):
        raise ValueError(f"apply_rope: x must be [T, H, D] or [T, D], got shape {tuple(x.shape)}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"apply_rope: cos and sin must both be [T, R/2], got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    t, d = x.shape[0], x.shape[-1]
    half = cos.shape[1]
    end = start + 2 * half
    if cos.shape[0] != t:
        raise ValueError(f"apply_rope: tables have {cos.shape[0]} rows, x has {t} tokens")
    if start < 0 or end > d:
        raise ValueError(f"apply_rope: rotary slice [{start}, {end}) does not fit in head dim {d}")
    c, s = cos.float(), sin.float()
    if inverse:
        s = -s
    if x.dim() == 3:
        c, s = c[:, None, :], s[:, None, :]

    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if start > 0:
        out[..., :start] = x[..., :start]
    if end < d:
        out[..., end:] = x[..., end:]
    dst = out[..., start:end]
    # fp32 results go straight into the output; other dtypes through one fp32 buffer.
    work = dst if x.dtype == torch.float32 else torch.empty(dst.shape, dtype=torch.float32,
                                                            device=x.device)
    rot = x[..., start:end].float()
    if interleaved:
        if not _complex_viewable(rot):
            rot = rot.clone(memory_format=torch.contiguous_format)
        buf = work if _complex_viewable(work) else torch.empty(work.shape, dtype=torch.float32,
                                                               device=x.device)
        torch.mul(torch.view_as_complex(rot.view(*rot.shape[:-1], half, 2)), torch.complex(c, s),
                  out=torch.view_as_complex(buf.view(*buf.shape[:-1], half, 2)))
        if buf is not work:
            work.copy_(buf)
    else:
        a, b = rot[..., :half], rot[..., half:]
        out_a, out_b = work[..., :half], work[..., half:]
        torch.mul(a, c, out=out_a).addcmul_(b, s, value=-1.0)
        torch.mul(b, c, out=out_b).addcmul_(a, s)
    if work is not dst:
        dst.copy_(work)
    return out
