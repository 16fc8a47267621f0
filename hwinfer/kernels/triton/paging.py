"""Triton paged-cache rows (contract: :func:`hwinfer.ops.paging.paged_rows`): one launch,
grid (requests, entry blocks), in place of the ~17 torch kernels of the reference's expression
that every decode step of DeepSeek-V4 (twice: C4 and C128), GLM-5, HY4 and MiniMax-M3 replays."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok
from hwinfer.ops.paging import check_paged_rows


@triton.jit
def _paged_rows_kernel(table_ptr, lens_ptr, out_ptr, WIDTH, stride_t, BS, RATIO,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    n = tl.program_id(0)
    w = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = w < WIDTH
    valid = inside & (w < tl.load(lens_ptr + n) // RATIO)
    pos = w * RATIO
    block = tl.load(table_ptr + n.to(tl.int64) * stride_t + pos // BS, mask=valid, other=0)
    rows = block.to(tl.int64) * (BS // RATIO) + (pos % BS) // RATIO
    tl.store(out_ptr + n.to(tl.int64) * WIDTH + w, tl.where(valid, rows, -1), mask=inside)


def paged_rows(block_table: torch.Tensor, seq_lens: torch.Tensor, *, block_size: int,
               ratio: int = 1, width: int) -> torch.Tensor:
    """block_table [N, max_blocks], seq_lens [N] -> [N, width] int64 rows, -1 past each
    request's complete entries (see the contract)."""
    check_paged_rows(block_table, seq_lens, block_size, ratio, width)
    n = block_table.shape[0]
    out = torch.empty(n, width, dtype=torch.int64, device=block_table.device)
    if n == 0 or width == 0:
        return out
    table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    block = min(1024, triton.next_power_of_2(width))
    _paged_rows_kernel[(n, triton.cdiv(width, block))](
        table, seq_lens.to(block_table.device), out, width, table.stride(0), block_size, ratio,
        BLOCK=block, num_warps=4, PDL=pdl_ok(out.device), **launch_kwargs(out.device))
    return out


def paged_rows_supported(block_table: torch.Tensor, seq_lens: torch.Tensor, **_: object) -> str | None:
    """Per-call check: integer tables and lengths on one device."""
    if block_table.dtype not in (torch.int32, torch.int64) or seq_lens.dtype not in (torch.int32, torch.int64):
        return f"block_table / seq_lens must be int32 or int64, got {block_table.dtype}, {seq_lens.dtype}"
    if seq_lens.device != block_table.device:
        return "seq_lens must be on block_table's device"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    sig = {"table_ptr": "*i32", "lens_ptr": "*i32", "out_ptr": "*i64", "WIDTH": "i32",
           "stride_t": "i32", "BS": "i32", "RATIO": "i32", "BLOCK": "constexpr",
           "PDL": "constexpr"}
    return [AotSpec("paged_rows[i32]", _paged_rows_kernel, sig, {"BLOCK": 1024, "PDL": False})]


AOT_SPECS = _aot_specs()
