"""One cache for a whole model: every layer's tensors, allocated from the layers' declarations.

Storage shapes (``S`` request slots, ``NB`` blocks of ``BS`` tokens):

* ``per="token"`` with ratio r: ``[NB, BS // r, *shape]`` (BS must be a multiple of r);
* ``per="ring"``: ``[S, rows, *shape]``;
* ``per="request"``: ``[S, *shape]``.

A tensor declared packed (``CacheTensor.packed_bytes``) is stored as uint8 with ``(packed_bytes,)``
in place of ``shape``.

Requests own a slot (ring and request tensors) and a row of the block table (token tensors).
:class:`SimpleAllocator` hands out slots and blocks for ``generate``; the engine's scheduler
(issue 4) replaces it with a pool shared by many requests.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hwinfer.cache.spec import CacheTensor


class LayerCache(dict):
    """name -> storage tensor for one layer, plus that layer's declarations."""

    def __init__(self, specs: list[CacheTensor], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(tensors)
        self.specs = {s.name: s for s in specs}


@dataclass
class ModelCache:
    layers: list[LayerCache | None]
    block_size: int
    num_blocks: int
    num_slots: int

    @classmethod
    def allocate(cls, layer_specs: list[list[CacheTensor]], *, num_slots: int, num_blocks: int,
                 block_size: int, device: torch.device) -> "ModelCache":
        layers: list[LayerCache | None] = []
        for specs in layer_specs:
            if not specs:
                layers.append(None)
                continue
            tensors = {}
            for s in specs:
                if s.per == "token":
                    if block_size % s.ratio:
                        raise ValueError(f"block size {block_size} is not a multiple of {s.name}'s ratio {s.ratio}")
                    shape = (num_blocks, block_size // s.ratio, *s.storage_shape)
                elif s.per == "ring":
                    shape = (num_slots, s.rows, *s.storage_shape)
                else:
                    shape = (num_slots, *s.storage_shape)
                tensors[s.name] = torch.zeros(shape, dtype=s.storage_dtype, device=device)
            layers.append(LayerCache(specs, tensors))
        return cls(layers, block_size, num_blocks, num_slots)

    def copy_slots(self, src: int, dst: int) -> None:
        """Copy every ring / per-request state row of slot ``src`` into slot ``dst`` (prefix
        caching's checkpoints of recurrent and sliding-window state)."""
        for layer in self.layers:
            if layer is None:
                continue
            for name, spec in layer.specs.items():
                if spec.per in ("ring", "request"):
                    layer[name][dst].copy_(layer[name][src])

    def reset_slots(self, slots: torch.Tensor) -> None:
        """Zero the per-request state of ``slots`` (a new request must not see old state)."""
        for layer in self.layers:
            if layer is None:
                continue
            for name, spec in layer.specs.items():
                if spec.per in ("ring", "request"):
                    layer[name][slots] = 0


class SimpleAllocator:
    """Slots and contiguous blocks for a fixed batch (``generate``): request i gets slot i and
    blocks ``i * bpr .. (i+1) * bpr - 1`` with ``bpr = ceil(max_len / block_size)``."""

    def __init__(self, batch: int, max_len: int, block_size: int) -> None:
        self.blocks_per_request = -(-max_len // block_size)
        self.num_blocks = batch * self.blocks_per_request
        self.block_size = block_size
        self.batch = batch

    def block_table(self, device: torch.device) -> torch.Tensor:
        bpr = self.blocks_per_request
        return torch.arange(self.batch * bpr, dtype=torch.int32, device=device).view(self.batch, bpr)
