"""DeepSeek-V4 KV compressor contracts (CSA and HCA layers, and the CSA indexer's own keys).

Two forms of one computation (MODELS.md §2.6, ENGINES.md §2.2):

* :func:`kv_compress`: a whole sequence starting at position 0 (prefill without a prefix).
* :func:`kv_compress_step`: one token per request against a per-request ring of fp32 state
  (decode, chunk continuation, speculative decoding). Feeding a sequence token by token through
  it reproduces :func:`kv_compress`.

Window slots (``m = ratio``, ``c = 2`` with overlap else 1, ``D`` = entry width): token ``t`` sits
in window ``t // m`` at slot ``t % m``; its gate logit is ``score[t] + ape[t % m]``. Entry ``w``
is, per channel independently, a softmax over its slots of those logits applied to ``kv``:

* HCA (no overlap, c = 1): the ``m`` tokens of window ``w``.
* CSA (overlap, c = 2): ``2m`` slots, first the "Ca" halves (channels ``[:D]``) of window
  ``w - 1``, then the "Cb" halves (channels ``[D:]``) of window ``w``. Entry 0 has no Ca slots.

Then a weighted RMSNorm over ``D`` and interleaved RoPE on the last ``rope_dim`` channels at
position ``w * m`` (the window's first token; the caller builds the tables).
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randint, randn, slot_rows
from hwinfer.ops.rope import DSV4_COMPRESS_YARN, rope_tables

RopeTables = tuple[torch.Tensor, torch.Tensor]

# fp32 ops only reorder a softmax, a sum over <= 256 slots and a norm; bf16 outputs are cast once.
_TOL = {torch.float32: Tol(1e-5, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)}


def check_compress_args(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                        norm_weight: torch.Tensor, ratio: int, overlap: bool, rope: RopeTables | None,
                        rope_dim: int, rows: int, op: str) -> tuple[int, int]:
    """Validate the arguments both forms share; return ``(c, D)``. ``rows`` = rope table rows."""
    if not isinstance(ratio, int) or ratio < 1:
        raise ValueError(f"{op}: ratio must be a positive int, not {ratio!r}")
    if kv.dim() != 2 or not kv.is_floating_point():
        raise ValueError(f"{op}: kv must be a float [rows, c*D] tensor, got {kv.dtype} {tuple(kv.shape)}")
    if tuple(score.shape) != tuple(kv.shape):
        raise ValueError(f"{op}: score shape {tuple(score.shape)} != kv shape {tuple(kv.shape)}")
    c = 2 if overlap else 1
    width = kv.shape[1]
    if width % c:
        raise ValueError(f"{op}: overlap needs an even kv width (Ca | Cb halves), got {width}")
    d = width // c
    if tuple(ape.shape) != (ratio, width):
        raise ValueError(f"{op}: ape shape {tuple(ape.shape)} != (ratio, c*D) = {(ratio, width)}")
    if tuple(norm_weight.shape) != (d,):
        raise ValueError(f"{op}: norm_weight shape {tuple(norm_weight.shape)} != (D,) = ({d},), "
                         f"D = kv width {width} / c = {c}")
    if rope is not None:
        if rope_dim <= 0 or rope_dim % 2 or rope_dim > d:
            raise ValueError(f"{op}: rope_dim must be even and in (0, D={d}], got {rope_dim}")
        cos, sin = rope
        want = (rows, rope_dim // 2)
        if tuple(cos.shape) != want or tuple(sin.shape) != want:
            raise ValueError(f"{op}: rope cos/sin shapes {tuple(cos.shape)}/{tuple(sin.shape)} != {want} "
                             f"(one row per entry, rope_dim/2 columns)")
    return c, d


def norm_and_rope(pooled: torch.Tensor, norm_weight: torch.Tensor, eps: float, rope: RopeTables | None,
                  rope_dim: int) -> torch.Tensor:
    """fp32 weighted RMSNorm over the last dim, then interleaved RoPE on its last ``rope_dim``."""
    y = pooled * torch.rsqrt(pooled.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.float()
    if rope is None:
        return y
    cos, sin = rope[0].float(), rope[1].float()
    d = y.shape[-1]
    x0, x1 = y[..., d - rope_dim::2], y[..., d - rope_dim + 1::2]
    rotated = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    return torch.cat((y[..., :d - rope_dim], rotated), dim=-1)


def _pool(values: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[slots, D] values and logits (fp32) -> [D]: per-channel softmax over the slots."""
    return (torch.softmax(logits, dim=0) * values).sum(dim=0)


def kv_compress(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor, *,
                ratio: int, overlap: bool, eps: float, rope: RopeTables | None = None,
                rope_dim: int = 64) -> torch.Tensor:
    """Compress one whole sequence (positions ``0 .. T-1``) into ``T // ratio`` KV entries.

    Math (fp32 throughout, one cast at the end), with ``m = ratio`` and ``L[t] = score[t] +
    ape[t % m]``:

    * no overlap (HCA): ``e_w[c] = sum_{j<m} softmax_j(L[wm+j, c]) * kv[wm+j, c]``.
    * overlap (CSA): ``e_w[c] = sum over 2m slots``: slot ``j < m`` is token ``(w-1)m + j`` with
      value ``kv[., c]`` and logit ``L[., c]`` (its "Ca" half), slot ``m + j`` is token ``wm + j``
      with ``kv[., D + c]`` and ``L[., D + c]`` ("Cb" half). For ``w = 0`` the Ca slots are absent
      (weight exactly 0), so entry 0 pools only window 0's Cb halves.
    * ``y_w = e_w / sqrt(mean(e_w^2) + eps) * norm_weight``, then if ``rope`` is given, interleaved
      RoPE on channels ``D - rope_dim .. D-1``: pair ``(2i, 2i+1)`` of that slice becomes
      ``(x0 cos - x1 sin, x1 cos + x0 sin)`` with ``cos/sin[w, i]`` the angle at position ``w*m``.

    Only complete windows produce entries; the trailing ``T % m`` tokens produce nothing (an engine
    keeps them in the :func:`kv_compress_step` state).

    Args:
        kv: [T, c*D] float, ``wkv · x`` (the compressor's kv projection of the normed block input).
        score: [T, c*D] same dtype, ``wgate · x`` (gate logits before ``ape``).
        ape: [m, c*D] (fp32 in checkpoints), learned per-slot bias on the gate logits.
        norm_weight: [D], the compressor's RMSNorm weight.
        ratio: window length m. overlap: CSA two-series layout (c = 2) or HCA (c = 1).
        eps: RMSNorm epsilon (``rms_norm_eps``, 1e-6).
        rope: (cos, sin) fp32 [T // m, rope_dim / 2] (row w at position ``w*m``) or None.
        rope_dim: rotary width (``qk_rope_head_dim`` = 64).

    Returns: [T // m, D] in kv.dtype.

    DeepSeek-V4 use (MODELS.md §2.6-2.7): CSA layers ``ratio=4, overlap=True, D=head_dim=512``
    (checkpoint ``attn.compressor.{wkv,wgate,ape,norm}``); HCA layers ``ratio=128, overlap=False,
    D=512``; the CSA indexer's keys ``ratio=4, overlap=True, D=index_head_dim=128``
    (``attn.indexer.compressor.*``). All use the "compress" rope (``compress_rope_theta`` 160000
    + YaRN, no mscale). Easy to get wrong: the Ca slots of entry w come from window w-1 and carry
    *their own* slot's ape (``ape[j, :D]``); RoPE goes on the *last* channels, at ``w*m`` (not the
    window's last token); transformers sums the softmax-weighted kv in the activation dtype, this
    contract sums in fp32.
    """
    n = kv.shape[0] // ratio if kv.dim() == 2 and isinstance(ratio, int) and ratio > 0 else 0
    c, d = check_compress_args(kv, score, ape, norm_weight, ratio, overlap, rope, rope_dim, n, "kv_compress")
    kv32 = kv.float()
    logits = score.float() + ape.float().repeat(n + 1, 1)[:kv.shape[0]]
    pooled = kv32.new_zeros(n, d)
    for w in range(n):
        cur = slice(w * ratio, (w + 1) * ratio)
        if not overlap:
            pooled[w] = _pool(kv32[cur], logits[cur])
            continue
        values, gates = kv32[cur, d:], logits[cur, d:]
        if w > 0:
            prev = slice((w - 1) * ratio, w * ratio)
            values = torch.cat((kv32[prev, :d], values))
            gates = torch.cat((logits[prev, :d], gates))
        pooled[w] = _pool(values, gates)
    return norm_and_rope(pooled, norm_weight, eps, rope, rope_dim).to(kv.dtype)


def kv_compress_step(kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor,
                     state_kv: torch.Tensor, state_score: torch.Tensor, ape: torch.Tensor,
                     norm_weight: torch.Tensor, *, ratio: int, overlap: bool, eps: float,
                     rope: RopeTables | None = None, rope_dim: int = 64,
                     state_slots: torch.Tensor | None = None, entry_store: torch.Tensor | None = None,
                     entry_rows: torch.Tensor | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per request: store it in the request's state ring, emit an entry on window close.

    For request b at position ``p = positions[b]`` (``m = ratio``, ring rows ``R``):

    1. Row ``p % R`` of the state is overwritten with ``kv[b]`` (as fp32) and ``score[b] +
       ape[p % m]`` (fp32). **ape is added when stored**: ``state_score`` holds final gate logits,
       as in vLLM's ``save_partial_states``, so the pooling step needs no ape and a state written
       by one backend can be pooled by another.
    2. If ``(p + 1) % m == 0``, window ``w = p // m`` just closed: entry ``w`` is pooled exactly as
       in :func:`kv_compress` from rows ``(wm + j) % R`` (and, with overlap and ``w > 0``, the Ca
       halves of rows ``((w-1)m + j) % R``), normed, and roped with ``rope[b]`` (position ``w*m``).
       Otherwise ``emitted[b]`` is False and ``entries[b]`` is 0 (rope rows there are ignored).

    Rows are indexed by position, so rolling back rejected speculative tokens needs no undo: the
    next accepted token overwrites them. The ring must hold every row an emission reads: ``R >=
    c*m`` and ``R % m == 0``; an engine doing speculative decoding allocates more (e.g. ``c*m +
    num_draft`` rounded up to m) so draft writes never clobber the previous window's Ca rows.
    The state's initial content is irrelevant: every row read was written first (entry 0's Ca
    slots are never read). To continue after a :func:`kv_compress` prefill of T tokens, write
    rows ``p % R`` for the last ``min(T, R)`` positions by the same rule (kv; score + ape[p % m]).

    Args:
        kv, score: [B, c*D] float, this step's projections (one token per request).
        positions: [B] integer (int64), each token's absolute position, >= 0.
        state_kv, state_score: [B, R, c*D] fp32 rings (not modified).
        ape [m, c*D], norm_weight [D], ratio, overlap, eps, rope_dim: as in :func:`kv_compress`.
        rope: (cos, sin) fp32 [B, rope_dim/2] at each request's entry position ``(p // m) * m``,
            or None.

        state_slots: None, or [B] integer: the in-place form of the rings. ``state_kv`` /
            ``state_score`` are then the engine's pools [S, R, c*D] fp32 (contiguous), request b
            uses ring ``state_slots[b]``, its one new row is written there in place and the
            returned states are the pools themselves. A repeated slot (padding rows of a
            fixed-size batch) gets one of the results.
        entry_store, entry_rows: None, or the cache write fused in: a contiguous-row store
            [E, D] (any float dtype) and [B] integer rows; an emitted entry is written to row
            ``entry_rows[b]`` (cast to the store's dtype) in place, the rows of requests that
            emit nothing are left as they are. Rows of different requests must differ (padding
            rows nobody reads excepted).

    Returns: ``(entries [B, D] kv.dtype, emitted [B] bool, new_state_kv, new_state_score)``, the
    states fp32 [B, R, c*D] copies with the one row per request replaced (the pools with
    ``state_slots``).

    DeepSeek-V4 use: the decode / chunked-prefill path of every compressor in :func:`kv_compress`
    (transformers keeps ``buffer_kv``/``buffer_gate`` and ``overlap_kv``/``overlap_gate`` in
    ``DeepseekV4HCACache``/``DeepseekV4CSACache`` instead; vLLM and SGLang keep position-indexed
    rings of 8/128 rows, doubled for speculative decoding; ENGINES.md §2.2).
    """
    if state_slots is not None or entry_store is not None:
        return step_in_place(kv_compress_step, kv, score, positions, state_kv, state_score, ape,
                             norm_weight, state_slots, entry_store, entry_rows, ratio=ratio,
                             overlap=overlap, eps=eps, rope=rope, rope_dim=rope_dim)
    c, d = check_compress_args(kv, score, ape, norm_weight, ratio, overlap, rope, rope_dim,
                               kv.shape[0] if kv.dim() == 2 else -1, "kv_compress_step")
    check_step_state(kv, positions, state_kv, state_score, ratio, c, "kv_compress_step")
    new_kv, new_score = state_kv.clone(), state_score.clone()
    rows = state_kv.shape[1]
    pooled = kv.new_zeros(kv.shape[0], d, dtype=torch.float32)
    emitted = torch.zeros(kv.shape[0], dtype=torch.bool, device=kv.device)
    for b, p in enumerate(positions.tolist()):
        new_kv[b, p % rows] = kv[b].float()
        new_score[b, p % rows] = score[b].float() + ape[p % ratio].float()
        if (p + 1) % ratio:
            continue
        w = p // ratio
        cur = [(w * ratio + j) % rows for j in range(ratio)]
        if not overlap:
            pooled[b] = _pool(new_kv[b, cur], new_score[b, cur])
        else:
            values, gates = new_kv[b, cur, d:], new_score[b, cur, d:]
            if w > 0:
                prev = [((w - 1) * ratio + j) % rows for j in range(ratio)]
                values = torch.cat((new_kv[b, prev, :d], values))
                gates = torch.cat((new_score[b, prev, :d], gates))
            pooled[b] = _pool(values, gates)
        emitted[b] = True
    entries = norm_and_rope(pooled, norm_weight, eps, rope, rope_dim)
    entries = torch.where(emitted[:, None], entries, torch.zeros_like(entries))
    return entries.to(kv.dtype), emitted, new_kv, new_score


def check_in_place(kv: torch.Tensor, state_kv: torch.Tensor, state_score: torch.Tensor,
                   state_slots: torch.Tensor | None, entry_store: torch.Tensor | None,
                   entry_rows: torch.Tensor | None, d: int, op: str = "kv_compress_step") -> None:
    """Validate the in-place forms' pools, slots, store and rows (shapes only: no host read)."""
    b = kv.shape[0]
    if state_slots is not None:
        if state_slots.dim() != 1 or state_slots.shape[0] != b or state_slots.is_floating_point():
            raise ValueError(f"{op}: state_slots must be an integer [B={b}] tensor, got "
                             f"{state_slots.dtype} {tuple(state_slots.shape)}")
        for name, pool in (("state_kv", state_kv), ("state_score", state_score)):
            if pool.dim() != 3 or pool.dtype != torch.float32 or not pool.is_contiguous():
                raise ValueError(f"{op}: with state_slots, {name} must be a contiguous fp32 pool "
                                 f"[S, R, c*D], got {pool.dtype} {tuple(pool.shape)}")
        if state_score.shape != state_kv.shape or state_kv.shape[2] != kv.shape[1]:
            raise ValueError(f"{op}: pools {tuple(state_kv.shape)} / {tuple(state_score.shape)} do not "
                             f"match each other or c*D = {kv.shape[1]}")
    if (entry_store is None) != (entry_rows is None):
        raise ValueError(f"{op}: entry_store and entry_rows go together")
    if entry_store is not None:
        if entry_store.dim() != 2 or entry_store.shape[1] != d or entry_store.stride(1) != 1 \
                or not entry_store.is_floating_point():
            raise ValueError(f"{op}: entry_store must be a float [E, D={d}] tensor with contiguous "
                             f"rows, got {entry_store.dtype} {tuple(entry_store.shape)}")
        if entry_rows.dim() != 1 or entry_rows.shape[0] != b or entry_rows.is_floating_point():
            raise ValueError(f"{op}: entry_rows must be an integer [B={b}] tensor, got "
                             f"{entry_rows.dtype} {tuple(entry_rows.shape)}")


def step_in_place(fn, kv, score, positions, state_kv, state_score, ape, norm_weight, state_slots,
                  entry_store, entry_rows, **kw):
    """The in-place forms of ``kv_compress_step`` through its plain form ``fn``: gather the
    requests' rings from the pools, run, write the rings back; write each emitted entry into
    the store by a device-side choice (a request that emits nothing writes its row's own
    content back), so nothing here reads the device."""
    d = kv.shape[1] // (2 if kw["overlap"] else 1)
    check_in_place(kv, state_kv, state_score, state_slots, entry_store, entry_rows, d)
    if state_slots is not None:
        rows = slot_rows("kv_compress_step", state_slots, state_kv)
        entries, emitted, new_kv, new_score = fn(kv, score, positions, state_kv.index_select(0, rows),
                                                 state_score.index_select(0, rows), ape, norm_weight, **kw)
        state_kv.index_copy_(0, rows, new_kv)
        state_score.index_copy_(0, rows, new_score)
        new_kv, new_score = state_kv, state_score
    else:
        entries, emitted, new_kv, new_score = fn(kv, score, positions, state_kv, state_score, ape,
                                                 norm_weight, **kw)
    if entry_store is not None:
        dest = entry_rows.to(device=entry_store.device, dtype=torch.int64)
        entry_store[dest] = torch.where(emitted[:, None], entries.to(entry_store.dtype), entry_store[dest])
    return entries, emitted, new_kv, new_score


def check_ring_rows(rows: int, c: int, ratio: int, op: str = "kv_compress_step") -> None:
    """A ring must hold every row an emission reads (>= c*m) and align with windows (% m)."""
    if rows < c * ratio or rows % ratio:
        raise ValueError(f"{op}: state ring of {rows} rows is too small or misaligned: it needs >= c*m = "
                         f"{c * ratio} rows and a multiple of m = {ratio}")


def check_step_state(kv: torch.Tensor, positions: torch.Tensor, state_kv: torch.Tensor,
                     state_score: torch.Tensor, ratio: int, c: int, op: str) -> None:
    """Validate the step form's positions and state ring (shapes, dtype, ring size)."""
    b, width = kv.shape
    if positions.dim() != 1 or positions.shape[0] != b or positions.is_floating_point():
        raise ValueError(f"{op}: positions must be an integer [B={b}] tensor, got {positions.dtype} "
                         f"{tuple(positions.shape)}")
    for name, s in (("state_kv", state_kv), ("state_score", state_score)):
        if s.dim() != 3 or s.shape[0] != b or s.shape[2] != width:
            raise ValueError(f"{op}: {name} shape {tuple(s.shape)} != [B={b}, R, c*D={width}]")
        if s.dtype != torch.float32:
            raise ValueError(f"{op}: {name} must be fp32, got {s.dtype}")
    if state_score.shape != state_kv.shape:
        raise ValueError(f"{op}: state_score shape {tuple(state_score.shape)} != state_kv {tuple(state_kv.shape)}")
    check_ring_rows(state_kv.shape[1], c, ratio, op)
    if b and int(positions.min()) < 0:
        raise ValueError(f"{op}: positions must be >= 0")


# ----------------------------------------------------------------------------------------------
# Cases: DeepSeek-V4 shapes scaled down in length (head widths kept: 512 and the indexer's 128).


def compress_rope(positions: torch.Tensor, rope_dim: int, device: torch.device | None = None) -> RopeTables:
    """Compress-rope tables for the cases: DeepSeek-V4's theta 160000 with its YaRN (factor 16,
    attention_factor 1), through the rope family's :func:`hwinfer.ops.rope.rope_tables`."""
    cos, sin = rope_tables(positions.to(torch.int64).cpu(), rotary_dim=rope_dim, base=160000.0,
                           scaling=DSV4_COMPRESS_YARN)
    return cos.to(device), sin.to(device)


def _params(gen, ratio: int, d: int, c: int, device) -> dict:
    return {"ape": randn(gen, ratio, c * d, dtype=torch.float32, device=device, scale=0.5),
            "norm_weight": randn(gen, d, dtype=torch.float32, device=device, scale=0.2) + 1.0}


def _whole_case(t: int, d: int, ratio: int, overlap: bool, rope_dim: int | None):
    def make(gen, dtype, device):
        c = 2 if overlap else 1
        inputs = {"kv": randn(gen, t, c * d, dtype=dtype, device=device),
                  "score": randn(gen, t, c * d, dtype=dtype, device=device, scale=2.0),
                  **_params(gen, ratio, d, c, device), "ratio": ratio, "overlap": overlap, "eps": 1e-6}
        if rope_dim:
            inputs["rope"] = compress_rope(torch.arange(t // ratio) * ratio, rope_dim, device=device)
            inputs["rope_dim"] = rope_dim
        return inputs
    return make


def _step_case(b: int, d: int, ratio: int, overlap: bool, rows: int, rope_dim: int | None,
               in_place: bool = False):
    """``in_place``: the engine's form, rings in a pool with spare slots (a scattered subset in
    use) and the emitted entries written into a store at scattered rows."""
    def make(gen, dtype, device):
        c = 2 if overlap else 1
        # Half the requests sit on a window's last slot (they emit), one of them in window 0.
        pos = randint(gen, 0, 40 * ratio, b, device=torch.device("cpu"))
        pos[: b // 2] = (pos[: b // 2] // ratio) * ratio + ratio - 1
        pos[0] = ratio - 1
        inputs = {"kv": randn(gen, b, c * d, dtype=dtype, device=device),
                  "score": randn(gen, b, c * d, dtype=dtype, device=device, scale=2.0),
                  "positions": pos.to(device),
                  "state_kv": randn(gen, b, rows, c * d, dtype=torch.float32, device=device),
                  "state_score": randn(gen, b, rows, c * d, dtype=torch.float32, device=device, scale=2.0),
                  **_params(gen, ratio, d, c, device), "ratio": ratio, "overlap": overlap, "eps": 1e-6}
        if rope_dim:
            inputs["rope"] = compress_rope((pos // ratio) * ratio, rope_dim, device=device)
            inputs["rope_dim"] = rope_dim
        if in_place:
            spare = 3
            for name in ("state_kv", "state_score"):
                inputs[name] = randn(gen, b + spare, rows, c * d, dtype=torch.float32, device=device)
            inputs["state_slots"] = torch.randperm(b + spare, generator=gen)[:b].to(device)
            inputs["entry_store"] = randn(gen, 4 * b, d, dtype=dtype, device=device)
            inputs["entry_rows"] = torch.randperm(4 * b, generator=gen)[:b].to(device)
        return inputs
    return make


KV_COMPRESS = define_op(
    kv_compress,
    cases=[
        # 70 windows: enough that chunked implementations cross a chunk boundary (Ca carry).
        Case("csa_m4_d512_rope", _whole_case(283, 512, 4, True, 64)),
        Case("csa_indexer_m4_d128_rope", _whole_case(37, 128, 4, True, 64)),
        Case("hca_m128_d512_rope", _whole_case(700, 512, 128, False, 64)),
        Case("hca_m8_d64_norope", _whole_case(43, 64, 8, False, None)),
        Case("short_no_entries", _whole_case(3, 128, 4, True, 64)),
    ],
    tolerance=_TOL,
)

KV_COMPRESS_STEP = define_op(
    kv_compress_step,
    cases=[
        Case("csa_m4_d512_ring8", _step_case(6, 512, 4, True, 8, 64)),
        Case("csa_indexer_d128_ring16", _step_case(5, 128, 4, True, 16, 64)),
        Case("hca_m128_d128_ring256", _step_case(4, 128, 128, False, 256, 64)),
        Case("hca_m8_d64_norope", _step_case(5, 64, 8, False, 8, None)),
        # The engine's decode: rings updated in the pool, entries written into the cache store.
        Case("csa_m4_d512_in_place", _step_case(6, 512, 4, True, 8, 64, in_place=True)),
        Case("hca_m8_d64_in_place", _step_case(5, 64, 8, False, 16, None, in_place=True)),
    ],
    tolerance=_TOL,
    mutates=("state_kv", "state_score", "entry_store"),
)

__all__ = ["kv_compress", "kv_compress_step", "check_compress_args", "check_step_state", "check_in_place",
           "check_ring_rows", "step_in_place", "norm_and_rope", "compress_rope"]
