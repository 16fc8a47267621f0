"""Device words that a kernel leaves as it found them: per-row tickets and running maxima that
the programs of one launch meet on through atomics, where the last program to arrive finishes
the row and puts the words back to their start values (``last_arrival``: the ticket, shared by
greedy_tokens, the sampler and paged attention's merge).

So no fill runs before each call and the kernel replays inside a CUDA graph. The words are held
per (kernel, device) and grow by replacement: a replaced set stays alive, because captured
graphs keep its addresses. Growing during a capture raises (the engine's uncaptured warm-up
runs every size first). Calls of one kernel on one device must not run concurrently (one
stream, as the engine runs): they share the words.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# (kernel, device) -> every set of words handed out, the current one last
_HELD: dict[tuple[str, torch.device], list[tuple[torch.Tensor, ...]]] = {}


def resting_words(kernel: str, rows: int, device: torch.device,
                  starts: tuple[tuple[torch.dtype, int], ...]) -> tuple[torch.Tensor, ...]:
    """At least ``rows`` words for each (dtype, start value) of ``starts``, all at their start
    values, for ``kernel`` on ``device``: the same tensors on every call that fits them."""
    held = _HELD.setdefault((kernel, torch.device(device)), [])
    if held and held[-1][0].numel() >= rows:
        return held[-1]
    if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{kernel}: {rows} rows first seen during CUDA graph capture; run the "
                           "same size once before capturing it")
    size = max(256, triton.next_power_of_2(rows))
    held.append(tuple(torch.full((size,), start, dtype=dtype, device=device)
                      for dtype, start in starts))
    return held[-1]


def held_words(kernel: str, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Every set of words ``kernel`` holds on ``device``, the current one last (for tests)."""
    return _HELD.get((kernel, torch.device(device)), [])


@triton.jit
def last_arrival(ticket_ptr, count):
    """Take this program's ticket at ``ticket_ptr``; True for the ``count``-th (last) program to
    arrive, which puts the ticket back to 0. A barrier first: Triton runs the atomic on one
    thread, and its acq_rel order must cover every thread's writes before it, so that the last
    program sees all of them."""
    tl.debug_barrier()
    last = tl.atomic_add(ticket_ptr, 1) == count - 1
    if last:
        tl.atomic_xchg(ticket_ptr, 0)
    return last
