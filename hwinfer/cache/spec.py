"""Cache layouts as data: what each layer keeps per token, per window row and per request.

Every cache-owning layer declares a list of :class:`CacheTensor`. ``per``:

* ``"token"``: one row per token (``ratio`` > 1: one row per ``ratio`` tokens, e.g. DeepSeek-V4's
  compressed KV), paged: rows live in blocks of ``block_size`` tokens, found through the
  request's block table.
* ``"ring"``: ``rows`` rows per request, row = position % rows (a sliding window, a compressor's
  partial windows); old rows are overwritten, so speculative rollback needs no undo as long as
  ``rows`` leaves room for the draft tokens.
* ``"request"``: one fixed-size tensor per request (linear-attention and conv state).

The memory ledger (bytes per token, fixed bytes per request) is computed from this data alone
(:mod:`hwinfer.engine.ledger`). Three optional fields describe the layout engines deploy, which
the ledger reports beside what this pool allocates:

* ``fp8_row_bytes``: bytes of one row in the FP8 layout the architecture's kernels use (e.g.
  DeepSeek-V4's 584-byte ``fp8_ds_mla`` row: 448 e4m3 + 64 bf16 RoPE + 8 UE8M0 scale bytes);
* ``window``: a per-token tensor of a sliding-window layer, of which only the last ``window``
  rows are ever read (a deployed cache keeps just those, like a ring);
* ``shared_with``: rows an engine need not store because they are derived from another tensor's
  (Gemma 4 ``attention_k_eq_v``: V and K both come from one normalised key projection).

One field changes what the pool allocates: ``packed_bytes`` says the tensor is *stored* packed,
each row as ``packed_bytes`` uint8 bytes (a layer's own format, e.g. DeepSeek-V4's 584-byte
``fp8_ds_mla`` rows). ``shape`` and ``dtype`` stay the logical row the layer computes with; the
layer packs on every write and unpacks on every read (it tells the two storages apart by the
tensor's dtype). A model declares packed tensors only when asked to through its ``kv_format``
(:data:`KV_FORMATS`, :meth:`hwinfer.models.base.CausalLM.set_kv_format`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Names of the stored KV formats, shared by the memory ledger (what a format would cost) and
# the models' allocation (what the pool stores); see hwinfer.engine.ledger and CausalLM.set_kv_format.
KV_FORMATS = ("auto", "bf16", "fp8")
# The ledger's row formats: these and ``deployed``, each architecture's deployed format (the
# ledger's default). ``auto`` means the model dtype in both places, as load_model allocates.
LEDGER_FORMATS = ("deployed",) + KV_FORMATS


def check_kv_format(kv_format: str, allowed: tuple[str, ...] = KV_FORMATS) -> str:
    """``kv_format`` itself if it is one of ``allowed`` (:data:`KV_FORMATS`; the ledger passes
    :data:`LEDGER_FORMATS`), else a ValueError naming the option."""
    if kv_format not in allowed:
        raise ValueError(f"kv_format must be one of {', '.join(allowed)}, got {kv_format!r}")
    return kv_format


@dataclass(frozen=True)
class CacheTensor:
    name: str
    per: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    ratio: int = 1
    rows: int = 0
    fp8_row_bytes: int | None = None
    window: int | None = None
    shared_with: str | None = None
    packed_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.per not in ("token", "ring", "request"):
            raise ValueError(f"cache tensor {self.name}: per must be token, ring or request")
        if self.per == "ring" and self.rows <= 0:
            raise ValueError(f"cache tensor {self.name}: a ring needs rows > 0")
        if self.packed_bytes is not None and self.packed_bytes <= 0:
            raise ValueError(f"cache tensor {self.name}: packed_bytes must be > 0")

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """Shape of one stored row: ``(packed_bytes,)`` when packed, else ``shape``."""
        return (self.packed_bytes,) if self.packed_bytes is not None else self.shape

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype of the stored tensor: uint8 when packed, else ``dtype``."""
        return torch.uint8 if self.packed_bytes is not None else self.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row (the packed row when packed)."""
        return math.prod(self.storage_shape) * self.storage_dtype.itemsize

    def bytes_per_token(self) -> float:
        return self.row_bytes / self.ratio if self.per == "token" else 0.0

    def fixed_bytes(self) -> int:
        if self.per == "ring":
            return self.rows * self.row_bytes
        if self.per == "request":
            return self.row_bytes
        return 0


def fp8_v4_row_bytes(dim: int, rope_dim: int) -> int:
    """DeepSeek-V4 ``fp8_ds_mla`` row: e4m3 NoPE channels, bf16 RoPE channels, one UE8M0 scale
    byte per 64 NoPE channels padded to 8 bytes (dim 512, rope 64: 448 + 128 + 8 = 584)."""
    nope = dim - rope_dim
    return nope + 2 * rope_dim + 8 * math.ceil(nope / 64 / 8)


def fp8_mla_row_bytes(kv_lora_rank: int, rope_dim: int) -> int:
    """DeepSeek-V3.2 / GLM-5 DSA ``fp8_ds_mla`` row: e4m3 latent, one fp32 scale per 128 latent
    channels, bf16 RoPE channels (512 + 16 + 128 = 656)."""
    return kv_lora_rank + 4 * math.ceil(kv_lora_rank / 128) + 2 * rope_dim


def fp8_indexer_row_bytes(dim: int) -> int:
    """FP8 lightning-indexer key: e4m3 channels and one fp32 scale per 128 (128 -> 132)."""
    return dim + 4 * math.ceil(dim / 128)
