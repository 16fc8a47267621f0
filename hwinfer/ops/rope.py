"""Rotary position embedding contracts: the cos/sin tables and their application.

Tables are ``cos, sin`` [T, R/2] fp32, one column per rotation frequency ``i`` with angle
``pos * inv_freq[i]`` (the convention shared by every op that takes RoPE tables, see
:mod:`hwinfer.ops`). :func:`apply_rope` rotates ``R`` consecutive channels of each head starting
at ``start``, in one of two layouts:

* interleaved (GPT-J): pairs ``(2i, 2i+1)`` of the rotary slice share frequency i —
  DeepSeek-V4 (the *last* 64 of 512 channels of q, kv, compressed entries; indexer: last 64 of
  128), GLM-5's DSA indexer (the *first* 64 of 128);
* rotate-half (NeoX): pairs ``(i, i + R/2)`` — Qwen3.5 (first 64 of 256), MiniMax-M3 (first 64),
  Gemma 4 (whole head), HY4 (the last 64 channels of its MLA q/k and of its indexer).

Per-model table arguments (MODELS.md §2.1, §2.5, §3.1, §5):

* DeepSeek-V4 sliding layers: ``rotary_dim=64, base=rope_theta (1e4)``; CSA/HCA layers,
  compressors and indexer: ``base=compress_rope_theta (1.6e5)`` with
  ``scaling={"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
  "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.0}`` — transformers forces
  ``attention_factor = 1`` for V4 (no YaRN magnitude scaling); leaving it out derives
  ``0.1 ln(16) + 1 ~ 1.277`` and scales cos/sin by it, which is wrong for V4.
* Qwen3.5: ``rotary_dim = int(head_dim * partial_rotary_factor) = 64, base=1e7``.
* Gemma 4 sliding layers: ``rotary_dim=head_dim (256), base=1e4``. Global layers ("proportional"):
  ``rotary_dim=global_head_dim (512), base=1e6, scaling={"rope_type": "proportional",
  "partial_rotary_factor": 0.25}``: the table covers the *whole* head (256 columns), the first
  ``int(0.25 * 512 // 2) = 64`` frequencies are ``base^(-2i/512)`` (denominator = full head dim,
  not 128) and the remaining 192 are zero (cos 1, sin 0), so with rotate-half over all 512
  channels only the pairs ``(i, i + 256)``, i < 64, actually rotate. This is *not* the same as a
  rotate-half RoPE on the first 128 channels.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randint, randn

_SCALING_KEYS = {
    "default": {"rope_type"},
    "linear": {"rope_type", "factor"},
    "proportional": {"rope_type", "partial_rotary_factor", "factor"},
    "yarn": {"rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"},
}


def _yarn(pos_freqs: torch.Tensor, rotary_dim: int, base: float, p: dict[str, Any]
          ) -> tuple[torch.Tensor, float]:
    """YaRN inverse frequencies and cos/sin magnitude, step for step as transformers computes
    them (modeling_rope_utils ``_compute_yarn_parameters``)."""
    factor = float(p["factor"])
    if "original_max_position_embeddings" not in p:
        raise ValueError("rope_tables: yarn scaling needs 'original_max_position_embeddings'")
    orig = p["original_max_position_embeddings"]

    def mscale_of(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        # Both must be truthy; otherwise transformers ignores mscale and uses factor alone.
        if mscale and mscale_all_dim:
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # the ramp would divide by zero
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1 = keep the original frequency (fast dims), 0 = interpolate
    inv_extra = 1.0 / pos_freqs
    inv_inter = 1.0 / (factor * pos_freqs)
    return inv_inter * (1 - extrapolation) + inv_extra * extrapolation, float(attention_factor)


def rope_inv_freq(rotary_dim: int, base: float, scaling: dict[str, Any] | None = None
                  ) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rotary_dim/2] fp32 and the cos/sin magnitude (see :func:`rope_tables`)."""
    if not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rope_tables: rotary_dim must be a positive even int, got {rotary_dim!r}")
    if not base > 0:
        raise ValueError(f"rope_tables: base must be > 0, got {base!r}")
    p = dict(scaling or {})
    legacy = p.pop("type", None)
    kind = p.get("rope_type") or legacy or "default"
    p["rope_type"] = kind
    if kind not in _SCALING_KEYS:
        raise ValueError(f"rope_tables: unknown scaling type {kind!r}; "
                         f"expected one of {sorted(_SCALING_KEYS)}")
    unknown = set(p) - _SCALING_KEYS[kind]
    if unknown:
        raise ValueError(f"rope_tables: unexpected keys {sorted(unknown)} for {kind!r} scaling "
                         f"(the rotated width goes in rotary_dim, the base in base)")
    factor = float(p.get("factor", 1.0))
    if kind in ("linear", "yarn") and "factor" not in p:
        raise ValueError(f"rope_tables: {kind} scaling needs 'factor'")
    if not factor > 0:
        raise ValueError(f"rope_tables: factor must be > 0, got {factor!r}")
    base = float(base)
    # transformers' formula: base ** (arange(0, R, 2) / R) in fp32, then reciprocal.
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    if kind == "default":
        return 1.0 / pos_freqs, 1.0
    if kind == "linear":
        return (1.0 / pos_freqs) / factor, 1.0
    if kind == "proportional":
        fraction = float(p.get("partial_rotary_factor", 1.0))
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"rope_tables: partial_rotary_factor must be in [0, 1], got {fraction}")
        rotated = int(fraction * rotary_dim // 2)
        inv_freq = torch.zeros(rotary_dim // 2, dtype=torch.float32)
        inv_freq[:rotated] = 1.0 / pos_freqs[:rotated]
        return inv_freq / factor, 1.0
    return _yarn(pos_freqs, rotary_dim, base, p)


_INV_FREQ: dict[tuple, tuple[torch.Tensor, float]] = {}


def _device_inv_freq(rotary_dim: int, base: float, scaling: dict[str, Any] | None,
                     device: torch.device) -> tuple[torch.Tensor, float]:
    """rope_inv_freq computed on the CPU (bit-identical to transformers) and kept per device: a
    host-to-device copy on every call would sync the decode step and cannot be graph-captured."""
    key = (rotary_dim, float(base), repr(sorted((scaling or {}).items())), str(device))
    hit = _INV_FREQ.get(key)
    if hit is None:
        inv_freq, magnitude = rope_inv_freq(rotary_dim, base, scaling)
        hit = _INV_FREQ[key] = (inv_freq.to(device), magnitude)
    return hit


def rope_tables(positions: torch.Tensor, *, rotary_dim: int, base: float,
                scaling: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [T, rotary_dim/2] fp32 for integer positions.

    ``angle[t, i] = float32(positions[t]) * inv_freq[i]`` (one fp32 multiply, as transformers),
    ``cos = cos(angle) * m``, ``sin = sin(angle) * m``, with ``inv_freq`` fp32 and magnitude m:

    * default (``scaling=None``): ``inv_freq[i] = 1 / base^(2i/R)`` (R = rotary_dim), m = 1;
    * ``{"rope_type": "linear", "factor": f}``: default / f;
    * ``{"rope_type": "proportional", "partial_rotary_factor": p[, "factor": f]}`` (Gemma 4
      global layers): ``1 / base^(2i/R)`` for ``i < int(p * R // 2)``, 0 for the rest, all / f;
    * ``{"rope_type": "yarn", "factor", "original_max_position_embeddings"[, "beta_fast"=32,
      "beta_slow"=1, "attention_factor", "mscale", "mscale_all_dim", "truncate"=True]}``:
      blend of ``1/base^(2i/R)`` (extrapolation) and ``1/(factor base^(2i/R))`` (interpolation)
      with a linear ramp over the correction range, and ``m = attention_factor`` (derived as in
      transformers when absent: ``0.1 ln(factor) + 1``, or the mscale / mscale_all_dim ratio).

    ``"type"`` is accepted for ``"rope_type"`` (legacy ``rope_scaling`` dicts); ``rope_theta`` and
    ``partial_rotary_factor`` of a transformers ``rope_parameters`` dict go into ``base`` and
    ``rotary_dim`` instead (except proportional, see the module docstring). Matches transformers'
    tables bit for bit on the CPU. Positions are cast to fp32, exact up to 2^24.

    Args: positions [T] integer (int64 or int32); rotary_dim even R; base = ``rope_theta``.
    Returns ``(cos, sin)``, each [T, R/2] fp32 on positions' device.
    """
    if positions.dim() != 1 or positions.is_floating_point() or positions.is_complex():
        raise ValueError(f"rope_tables: positions must be a 1-D integer tensor, got "
                         f"{positions.dtype} of shape {tuple(positions.shape)}")
    inv_freq, magnitude = _device_inv_freq(rotary_dim, base, scaling, positions.device)
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    if magnitude != 1.0:
        cos, sin = cos * magnitude, sin * magnitude
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, start: int = 0,
               interleaved: bool = False, inverse: bool = False) -> torch.Tensor:
    """Rotate channels ``start .. start+R-1`` of every head by the table angles.

    R = 2 * cos.shape[-1]; ``c = cos[t, i]``, ``s = sin[t, i]`` (``-sin`` when ``inverse``).
    With ``(a, b)`` the i-th pair of the rotary slice — ``(2i, 2i+1)`` when ``interleaved``,
    else ``(i, i + R/2)`` (rotate-half) — the output pair is ``(a c - b s, b c + a s)``, computed
    in fp32 and cast to x.dtype. Every channel outside the slice is copied unchanged (bit-exact).
    ``inverse=True`` undoes the rotation (DeepSeek-V4 rotates the attention output back by the
    query position, MODELS.md §2.5).

    Shapes: x [T, H, D] (or [T, D], a single head), any float dtype; cos, sin [T, R/2] (fp32,
    from :func:`rope_tables`; other float dtypes are used in fp32); 0 <= start, start + R <= D.
    Returns x's shape and dtype.

    Layout notes: DeepSeek-V4 interleaved on the last 64 dims (``start = D - 64``), GLM-5 indexer
    interleaved on the first 64 (``start = 0``); transformers' GLM/DeepSeek-V3 helper writes its
    interleaved result de-interleaved (evens then odds), a fixed permutation of ours that leaves
    q.k unchanged because q and k are permuted alike.
    """
    if x.dim() not in (2, 3):
        raise ValueError(f"apply_rope: x must be [T, H, D] or [T, D], got shape {tuple(x.shape)}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"apply_rope: cos and sin must both be [T, R/2], got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    t, d = x.shape[0], x.shape[-1]
    half = cos.shape[1]
    if cos.shape[0] != t:
        raise ValueError(f"apply_rope: tables have {cos.shape[0]} rows, x has {t} tokens")
    if start < 0 or start + 2 * half > d:
        raise ValueError(f"apply_rope: rotary slice [{start}, {start + 2 * half}) does not fit "
                         f"in head dim {d}")
    c, s = cos.float(), sin.float()
    if inverse:
        s = -s
    if x.dim() == 3:  # broadcast the per-token tables over heads
        c, s = c[:, None, :], s[:, None, :]
    rot = x[..., start : start + 2 * half].float()
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
    else:
        a, b = rot[..., :half], rot[..., half:]
    out_a = a * c - b * s
    out_b = b * c + a * s
    if interleaved:
        rotated = torch.stack((out_a, out_b), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((out_a, out_b), dim=-1)
    out = x.clone()
    out[..., start : start + 2 * half] = rotated.to(x.dtype)
    return out


# ----------------------------------------------------------------------------------------------
# Cases. Positions stay below 8192 so a device that derives the same fp32 inv_freq agrees
# closely; the tables are tested against transformers separately (tests/ops/test_rope.py).

DSV4_COMPRESS_YARN = {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
              "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.0}


def _tables_case(t: int, rotary_dim: int, base: float, scaling: dict | None):
    def make(gen, dtype, device):
        return {"positions": randint(gen, 0, 8192, t, device=device), "rotary_dim": rotary_dim,
                "base": base, "scaling": scaling}
    return make


def _apply_case(t: int, heads: int, d: int, rotary_dim: int, start: int, interleaved: bool,
                inverse: bool = False, base: float = 1e4):
    def make(gen, dtype, device):
        cos, sin = rope_tables(randint(gen, 0, 4096, t, device=device), rotary_dim=rotary_dim,
                               base=base)
        shape = (t, heads, d) if heads else (t, d)
        return {"x": randn(gen, *shape, dtype=dtype, device=device), "cos": cos, "sin": sin,
                "start": start, "interleaved": interleaved, "inverse": inverse}
    return make


ROPE_TABLES = define_op(
    rope_tables,
    cases=[
        Case("default_qwen35", _tables_case(33, 64, 1e7, None)),
        Case("yarn_dsv4_compress", _tables_case(33, 64, 160000.0, DSV4_COMPRESS_YARN)),
        Case("yarn_derived_mscale", _tables_case(9, 64, 1e4, {"rope_type": "yarn", "factor": 40,
              "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707})),
        Case("proportional_gemma4", _tables_case(17, 512, 1e6, {"rope_type": "proportional",
                                                             "partial_rotary_factor": 0.25})),
        Case("linear", _tables_case(5, 32, 1e4, {"rope_type": "linear", "factor": 4.0})),
    ],
    # fp32 sin/cos of identical fp32 angles: within a couple of ulps on any device.
    tolerance={torch.float32: Tol(atol=1e-6, rtol=0.0)},
    dtypes=(torch.float32,),
)

APPLY_ROPE = define_op(
    apply_rope,
    cases=[
        Case("dsv4_interleaved_last64", _apply_case(7, 4, 512, 64, 448, True)),
        Case("dsv4_inverse", _apply_case(5, 4, 512, 64, 448, True, inverse=True)),
        Case("glm5_indexer_first64", _apply_case(6, 8, 128, 64, 0, True)),
        Case("qwen35_partial_half", _apply_case(9, 4, 256, 64, 0, False, base=1e7)),
        Case("gemma4_full_head", _apply_case(4, 2, 256, 256, 0, False)),
        Case("single_head_2d", _apply_case(3, 0, 128, 64, 64, False)),
    ],
    tolerance={torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2),
               torch.float16: Tol(2e-3, 2e-3)},
    dtypes=(torch.float32, torch.bfloat16, torch.float16),
)
