"""Paged-cache bookkeeping contracts: which cache rows hold a request's entries.

A decode step of the compressed / indexed attention models (DeepSeek-V4's C4 and C128 layers,
GLM-5 / HY4 DSA, MiniMax-M3's sparse layers) reads every completed entry of each request through
its block table. Building those rows with torch ops took ~17 small kernels per ratio and step,
replayed by every CUDA graph (no PDL across them); the op makes it one launch.
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import EXACT, Case, define_op


def paged_rows(block_table: torch.Tensor, seq_lens: torch.Tensor, *, block_size: int,
               ratio: int = 1, width: int) -> torch.Tensor:
    """Global rows of every request's entries 0 .. width-1 in a paged ``per="token"`` tensor
    that keeps one entry per ``ratio`` positions.

    Request n's entry w is position ``p = w * ratio``; its row is
    ``block_table[n, p // block_size] * (block_size // ratio) + (p % block_size) // ratio``
    (block b holds ``block_size // ratio`` entries), or -1 when the entry is not complete yet:
    ``w >= seq_lens[n] // ratio``. Table columns past a request's last complete entry are never
    read (they may hold anything).

    Shapes / dtypes: block_table [N, max_blocks] int32 (int64 accepted); seq_lens [N] int32
    (cached + new tokens); block_size a multiple of ratio; width a host-side bound of every
    request's entry count (the engine: its length bound // ratio, under CUDA graphs the block
    table's capacity). Returns [N, width] int64 (cache rows, the engine's row dtype).

    Uses: ``ForwardBatch.entry_rows`` / ``pick_rows`` in decode: DeepSeek-V4's compressed entries
    (ratio 4 and 128), GLM-5 / HY4 indexer keys and MiniMax-M3's block-sparse keys (ratio 1).
    """
    check_paged_rows(block_table, seq_lens, block_size, ratio, width)
    counts = seq_lens.to(block_table.device).long() // ratio
    w = torch.arange(width, device=block_table.device)
    valid = w[None] < counts[:, None]
    pos = torch.where(valid, w[None] * ratio, 0)
    block = block_table.long().gather(1, pos // block_size) if width else pos
    rows = block * (block_size // ratio) + (pos % block_size) // ratio
    return torch.where(valid, rows, -1)


def check_paged_rows(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                     ratio: int, width: int) -> None:
    """Validate :func:`paged_rows`'s arguments (shapes and options; no value is read)."""
    if block_table.dim() != 2 or block_table.is_floating_point():
        raise ValueError(f"paged_rows: block_table must be an integer [N, max_blocks] tensor, got "
                         f"{block_table.dtype} {list(block_table.shape)}")
    if tuple(seq_lens.shape) != (block_table.shape[0],) or seq_lens.is_floating_point():
        raise ValueError(f"paged_rows: seq_lens must be an integer [N={block_table.shape[0]}] "
                         f"tensor, got {seq_lens.dtype} {list(seq_lens.shape)}")
    if ratio < 1 or block_size < 1 or block_size % ratio or width < 0:
        raise ValueError(f"paged_rows: need ratio >= 1 dividing block_size and width >= 0, got "
                         f"ratio={ratio}, block_size={block_size}, width={width}")


def _case(lens: list[int], max_blocks: int, block_size: int, ratio: int, width: int):
    def make(gen, dtype, device):
        n = len(lens)
        table = torch.randperm(4 * n * max_blocks, generator=gen)[: n * max_blocks]
        return {"block_table": table.view(n, max_blocks).to(device=device, dtype=torch.int32),
                "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
                "block_size": block_size, "ratio": ratio, "width": width}
    return make


PAGED_ROWS = define_op(
    paged_rows,
    cases=[
        # M3 / GLM-5 keys (ratio 1), a request with nothing cached yet.
        Case("ratio1_blocks16", _case([1, 40, 0, 33], 4, 16, 1, 64)),
        # DeepSeek-V4 C4 entries: block_size 8 tokens = 2 entries a block, partial entries.
        Case("v4_c4", _case([5, 3, 31, 17], 4, 8, 4, 8)),
        # C128: one entry per block; width past every request's count.
        Case("v4_c128", _case([127, 128, 600], 6, 128, 128, 6)),
    ],
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT},
    family="paging",
)
