"""ForwardBatch's index helpers (packed_spans, tail_tokens, ring_sources, request_of_token,
context_rows, packed_entry_rows, the host cu_seqlens) against plain Python loops on random batches: they replace
device reads (masks, repeat_interleave without a size, blocking copies) in every prefill."""
from __future__ import annotations

import random

import torch

from hwinfer.runtime.batch import ForwardBatch, host_to_device, packed_spans


class _Cache:
    block_size = 4


def _batch(rng: random.Random) -> ForwardBatch:
    n = rng.randint(1, 5)
    new = [rng.choice([0, 1, 3, 9, 17]) for _ in range(n)]
    ctx = [rng.choice([0, 2, 5, 30]) for _ in range(n)]
    width = max(-(-(c + m) // 4) for c, m in zip(ctx, new)) + 1
    table = torch.randperm(200)[: n * width].view(n, width).to(torch.int32)
    ids = torch.zeros(sum(new), dtype=torch.int64)
    return ForwardBatch.step(ids, new, ctx, _Cache(), torch.arange(n), table)


def test_packed_spans_and_host_copies():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(0, 6)
        starts = [rng.randint(0, 40) for _ in range(n)]
        lengths = [rng.choice([0, 1, 2, 7]) for _ in range(n)]
        req, val = packed_spans(starts, lengths, torch.device("cpu"))
        want = [(i, s + j) for i, (s, m) in enumerate(zip(starts, lengths)) for j in range(m)]
        assert list(zip(req.tolist(), val.tolist())) == want
        assert req.dtype == val.dtype == torch.int64
    t = host_to_device([3, 1], torch.device("cpu"), torch.int32)
    assert t.dtype == torch.int32 and t.tolist() == [3, 1]


def test_batch_index_helpers_match_loops():
    rng = random.Random(1)
    for _ in range(40):
        b = _batch(rng)
        new, ctx = b.new_lens, b.context_lens_host
        requests = [i for i, m in enumerate(new) for _ in range(m)]
        assert b.positions.tolist() == [c + j for c, m in zip(ctx, new) for j in range(m)]
        if not b.is_decode:
            assert b.request_of_token().tolist() == requests
        assert b.cu_seqlens_host.tolist() == b.cu_seqlens.tolist()
        assert b.cu_seqlens_k_host.tolist() == b.cu_seqlens_k.tolist()
        assert b.cu_seqlens_host.device.type == "cpu"
        for keep in (1, 4, 8):
            # the tokens a ring of `keep` rows retains: positions >= seq_len - keep
            seq = [c + m for c, m in zip(ctx, new)]
            want = [t for t, (r, p) in enumerate(zip(requests, b.positions.tolist())) if p >= seq[r] - keep]
            assert b.tail_tokens(keep).tolist() == want
            # ring_sources: each token's row takes the value of its request's last token on
            # that row (same position modulo keep): a kept token is its own source
            if not b.is_decode:
                pos = b.positions.tolist()
                last = {}
                for t, (r, p) in enumerate(zip(requests, pos)):
                    last[(r, p % keep)] = t
                src = b.ring_sources(keep).tolist()
                assert src == [last[(r, p % keep)] for r, p in zip(requests, pos)]
                assert [t for t in range(len(src)) if src[t] == t] == want
        rows = [int(b.block_table[i, p // 4]) * 4 + p % 4
                for i, (c, m) in enumerate(zip(ctx, new)) for p in range(c + m)]
        assert b.context_rows().tolist() == rows
        # packed_entry_rows: each request's completed entries (position e * ratio), packed, the
        # total within the host bound; the rest are never read but must be rows of the table
        for ratio in (1, 2, 4):
            got, starts = b.packed_entry_rows(ratio)
            seq = [c + m for c, m in zip(ctx, new)]
            want = [int(b.block_table[i, e * ratio // 4]) * (4 // ratio) + (e * ratio % 4) // ratio
                    for i, s_ in enumerate(seq) for e in range(s_ // ratio)]
            assert got.shape[0] == sum(seq) // ratio >= len(want)
            assert got.tolist()[:len(want)] == want
            assert starts.tolist() == [sum(s_ // ratio for s_ in seq[:i]) for i in range(len(seq))]
            table_rows = {int(x) * (4 // ratio) + j for x in b.block_table.flatten() for j in range(4 // ratio)}
            assert set(got.tolist()) <= table_rows


def test_batch_from_host_lists_equals_the_device_built_one():
    """ForwardBatch.from_host (the engine's eager steps: positions, each token's request and
    cache row computed on the host, two uploads) gives what ForwardBatch.step + token_rows()
    compute on the device, on random mixed batches (empty, decode-like and prefix-cached
    requests, blocks in random order)."""
    rng = random.Random(2)
    for _ in range(40):
        b = _batch(rng)
        n, width = b.block_table.shape
        blocks = [b.block_table[i, : rng.randint(-(-(c + m) // 4), width)].tolist()
                  for i, (c, m) in enumerate(zip(b.context_lens_host, b.new_lens))]
        ids = [rng.randint(0, 99) for _ in range(sum(b.new_lens))]
        h = ForwardBatch.from_host(ids, b.new_lens, b.context_lens_host, _Cache(),
                                   b.slots.tolist(), blocks, torch.device("cpu"))
        assert h.input_ids.tolist() == ids
        for name in ("positions", "cu_seqlens", "seq_lens", "slots"):
            got, want = getattr(h, name), getattr(b, name)
            assert got.dtype == want.dtype and got.tolist() == want.tolist(), name
        assert h.block_table.dtype == torch.int32
        assert h.token_rows().tolist() == b.token_rows().tolist()
        lens = torch.tensor(b.new_lens)
        assert h.request_of_token().tolist() == torch.repeat_interleave(torch.arange(n), lens).tolist()
        assert (h.new_lens, h.context_lens_host) == (b.new_lens, b.context_lens_host)
