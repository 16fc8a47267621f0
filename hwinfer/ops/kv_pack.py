"""Packed latent-cache entries: DeepSeek-V4's FP8 layout, as plain functions (pack / unpack) and
one op that writes packed rows into a cache (:func:`kv_store_fp8_ds_mla`).

``fp8_ds_mla`` (vLLM's name; ENGINES.md "Cache layouts and bytes per token"): one 512-channel
latent entry (448 NoPE channels, then the 64 RoPE channels) in 584 bytes instead of 1,024:

* bytes 0-447: the NoPE channels as e4m3, channel c divided by the scale of its group c // 64;
* bytes 448-575: the RoPE channels as bf16 (little-endian, two bytes each);
* bytes 576-582: the 7 group scales as UE8M0 exponents (scale = 2^(byte - 127)); byte 583: 0.

Scales follow :mod:`hwinfer.ops.quant_pack`: ``2^ceil(log2(amax / 448))`` per group (nothing
saturates; an all-zero group gets scale 1). ``unpack`` is exact: every e4m3 value times a power
of two, and every bf16 value, is representable in bf16 and fp32.
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randint, randn
from hwinfer.ops.quant_pack import E4M3_MAX, _pow2_scale

FP8_DS_DIM, FP8_DS_NOPE, FP8_DS_BYTES = 512, 448, 584
_GROUP = 64


def pack_fp8_ds_mla(x: torch.Tensor) -> torch.Tensor:
    """x [..., 512] float (finite) -> [..., 584] uint8 (see the module docstring)."""
    if x.shape[-1] != FP8_DS_DIM or not x.is_floating_point():
        raise ValueError(f"pack_fp8_ds_mla: x must be a float [..., {FP8_DS_DIM}] tensor, got "
                         f"{x.dtype} {tuple(x.shape)}")
    lead = x.shape[:-1]
    x32 = x.float()
    nope = x32[..., :FP8_DS_NOPE].reshape(*lead, FP8_DS_NOPE // _GROUP, _GROUP)
    scale, byte = _pow2_scale(nope.abs().amax(dim=-1), E4M3_MAX)
    q = (nope / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    rope = x32[..., FP8_DS_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    pad = torch.zeros(*lead, 1, dtype=torch.uint8, device=x.device)
    return torch.cat((q.view(torch.uint8).reshape(*lead, FP8_DS_NOPE), rope, byte, pad), dim=-1)


def unpack_fp8_ds_mla(packed: torch.Tensor) -> torch.Tensor:
    """[..., 584] uint8 -> [..., 512] fp32, exact (see the module docstring)."""
    if packed.dtype != torch.uint8 or packed.shape[-1] != FP8_DS_BYTES:
        raise ValueError(f"unpack_fp8_ds_mla: expected uint8 [..., {FP8_DS_BYTES}], got "
                         f"{packed.dtype} {tuple(packed.shape)}")
    lead = packed.shape[:-1]
    groups = FP8_DS_NOPE // _GROUP
    q = packed[..., :FP8_DS_NOPE].contiguous().view(torch.float8_e4m3fn).float()
    exp = packed[..., FP8_DS_BYTES - 8:FP8_DS_BYTES - 8 + groups].int() - 127
    scale = torch.ldexp(torch.ones(exp.shape, device=packed.device), exp)
    nope = (q.reshape(*lead, groups, _GROUP) * scale[..., None]).reshape(*lead, FP8_DS_NOPE)
    rope = packed[..., FP8_DS_NOPE:FP8_DS_BYTES - 8].contiguous().view(torch.bfloat16).float()
    return torch.cat((nope, rope), dim=-1)


def kv_store_fp8_ds_mla(x: torch.Tensor, store: torch.Tensor, rows: torch.Tensor,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """Write rows into a packed (``fp8_ds_mla``) cache: ``store[rows[i]] = pack_fp8_ds_mla(x[i])``
    for every i (with ``mask``: only where ``mask[i]``; the other rows keep their bytes), in
    place. The decode step's cache writes of DeepSeek-V4 (the window ring row of each request and
    the compressed entry of each request whose window closed), as one op so that a kernel packs
    and scatters in one launch and no host value decides which rows change (CUDA graphs).

    Shapes: x [N, 512] float (finite); store uint8 [..., 584] (rows addressed in its flattened
    [R, 584] view, which must exist without a copy); rows [N] integer in [0, R); mask [N] bool or
    None. Rows named twice get one of the values. Returns ``store``.
    """
    flat = _flat_store("kv_store_fp8_ds_mla", x, store, rows, mask)
    packed = pack_fp8_ds_mla(x)
    dest = rows.long()
    if mask is not None:
        packed = torch.where(mask[:, None], packed, flat[dest])
    flat[dest] = packed
    return store


def _flat_store(op: str, x, store, rows, mask) -> torch.Tensor:
    """The checks of :func:`kv_store_fp8_ds_mla`; returns the store's [R, 584] view."""
    if x.dim() != 2 or x.shape[1] != FP8_DS_DIM or not x.is_floating_point():
        raise ValueError(f"{op}: x must be float [N, {FP8_DS_DIM}], got {x.dtype} {list(x.shape)}")
    if store.dtype != torch.uint8 or store.shape[-1] != FP8_DS_BYTES:
        raise ValueError(f"{op}: store must be uint8 [..., {FP8_DS_BYTES}], got {store.dtype} "
                         f"{list(store.shape)}")
    if rows.shape != (x.shape[0],) or rows.is_floating_point() or rows.dtype == torch.bool:
        raise ValueError(f"{op}: rows must be integer [{x.shape[0]}], got {rows.dtype} {list(rows.shape)}")
    if mask is not None and (mask.shape != (x.shape[0],) or mask.dtype != torch.bool):
        raise ValueError(f"{op}: mask must be bool [{x.shape[0]}], got {mask.dtype} {list(mask.shape)}")
    flat = store.view(-1, FP8_DS_BYTES)  # raises if the rows are not one strided dimension
    return flat


def _store_case(n: int, capacity: int, masked: bool, edges: bool = False):
    def make(gen, dtype, device):
        x = randn(gen, n, FP8_DS_DIM, dtype=torch.float32, device="cpu", scale=4.0)
        # group magnitudes from 1e-6 to 1e4 (the scale exponents spread), a zero group, values on
        # e4m3 rounding midpoints and exact powers of two times 448 (ceil(log2) at 2^k)
        x[:, :448] *= torch.logspace(-6, 4, 7).repeat_interleave(64)[None]
        if edges:
            x[0, :64] = 0.0
            x[1, :64] = torch.tensor([448.0, -448.0, 224.0, 0.5 * 2 ** -9, 1.5 * 2 ** -9, 17.0, -18.0, 2 ** -7] * 8)
            x[2, 64:128] = 3.0 * 2.0 ** torch.arange(-32, 32).float()
            # amax / 448 below fp32's normal range: exponents -126 (above 2^-127) and -127 (clamped);
            # the values themselves stay normal numbers
            signs = torch.tensor([1.0, -1.0]).repeat(32)
            x[3, 128:192] = 448 * 1.5 * 2.0 ** -127 * torch.linspace(0.5, 1, 64) * signs
            x[3, 192:256] = 448 * 2.0 ** -133 * torch.linspace(0.5, 1, 64) * signs
        store = randint(gen, 0, 256, capacity, FP8_DS_BYTES, device=device).to(torch.uint8)
        inputs = {"x": x.to(device=device, dtype=dtype), "store": store,
                  "rows": torch.randperm(capacity, generator=gen)[:n].to(device=device, dtype=torch.int32)}
        if masked:
            inputs["mask"] = (torch.rand(n, generator=gen) < 0.5).to(device)
        return inputs
    return make


KV_STORE_FP8_DS_MLA = define_op(
    kv_store_fp8_ds_mla,
    cases=[Case("decode_ring_B5", _store_case(5, 40, False, edges=True)),
           Case("entries_masked_B9", _store_case(9, 64, True)),
           Case("empty", _store_case(0, 8, True))],
    # packing is exact integer work: every byte must match
    tolerance={torch.float32: Tol(atol=0.0, rtol=0.0, metric="exact"),
               torch.bfloat16: Tol(atol=0.0, rtol=0.0, metric="exact")},
    mutates=("store",),
    family="kv_pack",
)
