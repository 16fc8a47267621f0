"""A chain of decode GEMVs in one persistent launch (experimental: benchmarked, not yet used by a
model).

A batch-1 decode step is ~100 dependent GEMVs of a few MB each. As separate kernels, even with
programmatic dependent launch, each boundary drains the weight stream: the next kernel's
programs start only as the previous kernel's retire (H200: the 97 products of a Qwen3.5-0.8B
step at 500 us = 70% of the copy bandwidth, docs/kernels.md). Here one wave of programs walks
the whole chain: product i's row tiles are split over the programs, and between products the
programs meet at a grid barrier (a per-product arrival counter). Weights never depend on the
step, so each program issues its first tile of product i + 1 *before* waiting at the barrier:
the weight stream keeps flowing while the last programs finish product i.

Measured (H100, thirty-third session, docs/kernels.md): the 97 products in 638.5 us against
622.2 us for the PDL chain of separate whole-row GEMVs, with the counter sync as first written
(a barrier costs about what a kernel boundary does). The "data" sync and the counter's later
arrival are untimed; the form stays out of the models until one of them beats the PDL chain.

Chain semantics (as ``scripts/bench_decode_chain.py``'s): y_0 = W_0 x[:K_0], y_i = W_i
y_{i-1}[:K_i], each y rounded to the weights' dtype; the last y is returned.

Correctness needs every program resident at once (a barrier with a program still waiting for
an SM never opens): the grid is at most what the compiled kernel's registers allow on every SM,
and a bounded spin sets an error flag instead of hanging if that is ever wrong. Under the
interpreter (programs run one after another) only a one-program grid can work, which is how
the tests check the math and the bookkeeping on the CPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET, num_sms, programs_per_sm
from hwinfer.kernels.triton.gemv import rows_block_n

TILE_BYTES = 16 << 10   # weight bytes a program holds per tile (whole rows, gemv.rows_block_n)
SPIN_MAX = 1 << 18      # polls of a barrier before giving up (error flag set, no hang)
ALIGN = 64              # elements: where each weight and activation starts in its buffer


@triton.jit
def _wait_for(cnt_ptr, target, spin_max, err_ptr):
    """Block until the counter at cnt_ptr reaches target (acquire), or spin_max polls pass
    (then flag err_ptr); every thread of the program ordered after it."""
    c = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    n = 0
    while (c < target) & (n < spin_max):
        c = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        n += 1
    if c < target:
        tl.atomic_max(err_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _arrive(cnt_ptr):
    """This program's arrival at a barrier, after every thread's stores (release)."""
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _chain_product(w_ptr, x_ptr, y_ptr, N, pid, P, i, cnt_ptr, spin_max, err_ptr,
                   K: tl.constexpr, KP: tl.constexpr, R: tl.constexpr, SYNC: tl.constexpr):
    """Product i: y[rows] = W[rows, :K] . x[:K] over this program's row tiles (pid, pid + P, ...
    of R whole rows), once x is complete. SYNC "counter": this program arrives for product
    i - 1 (after issuing product i's first weights: the release waits for its stores) and waits
    for all P arrivals, then reads x. "data": x (poisoned with NaN before the launch) is polled
    until none of its K values is NaN: one L2 round trip where the counter takes two."""
    rows = tl.arange(0, R)
    rk = tl.arange(0, KP)
    kmask = rk < K
    rn = pid * R + rows
    # the first tile's weights, issued before the barrier (they do not depend on the step)
    w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :],
                mask=(rn < N)[:, None] & kmask[None, :], other=0.0)
    ntiles = tl.cdiv(N, R)
    # (a program with no rows of this product waits for nothing: x is not its concern, and it
    # has no stores of product i - 1 left to publish after its arrival)
    xf = tl.zeros([KP], dtype=tl.float32)
    if SYNC == "counter":
        if i > 0:
            _arrive(cnt_ptr + i - 1)
            if pid < ntiles:
                _wait_for(cnt_ptr + i - 1, P, spin_max, err_ptr)
        if pid < ntiles:
            # x was written by other SMs during this launch: read it from L2 (.cg), not L1
            xf = tl.load(x_ptr + rk, mask=kmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    elif pid < ntiles:
        xf = tl.load(x_ptr + rk, mask=kmask, other=0.0, volatile=True).to(tl.float32)
        n = 0
        while (tl.max((xf != xf).to(tl.int32), axis=0) > 0) & (n < spin_max):
            xf = tl.load(x_ptr + rk, mask=kmask, other=0.0, volatile=True).to(tl.float32)
            n += 1
        if n >= spin_max:
            tl.atomic_max(err_ptr, 1)
    t = pid
    while t < ntiles:
        nxt = rn + P * R
        w_next = tl.load(w_ptr + nxt.to(tl.int64)[:, None] * K + rk[None, :],
                         mask=(nxt < N)[:, None] & kmask[None, :], other=0.0)
        y = tl.sum(w.to(tl.float32) * xf[None, :], axis=1)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)
        w = w_next
        rn = nxt
        t += P


@triton.jit
def _chain_kernel(w_ptr, desc_ptr, act_ptr, cnt_ptr, err_ptr, NPROD, spin_max,
                  KA: tl.constexpr, KB: tl.constexpr, KC: tl.constexpr,
                  KPA: tl.constexpr, KPB: tl.constexpr, KPC: tl.constexpr,
                  RA: tl.constexpr, RB: tl.constexpr, RC: tl.constexpr,
                  ALIGN: tl.constexpr, SYNC: tl.constexpr):
    # desc [NPROD + 1, 4] int64: weight offset (elements of w_ptr), N, which K (0 / 1 / 2: KA /
    # KB / KC), input offset in act_ptr; row NPROD's input offset is where the last output goes
    # (each product writes its output at the next row's input offset).
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    for i in range(0, NPROD):
        # (every offset a multiple of ALIGN elements: 16-byte vector loads of W's rows)
        w_off = tl.multiple_of(tl.load(desc_ptr + 4 * i), ALIGN)
        n = tl.load(desc_ptr + 4 * i + 1).to(tl.int32)
        which = tl.load(desc_ptr + 4 * i + 2)
        x_ptr = act_ptr + tl.multiple_of(tl.load(desc_ptr + 4 * i + 3), ALIGN)
        y_ptr = act_ptr + tl.multiple_of(tl.load(desc_ptr + 4 * i + 7), ALIGN)
        if which == 0:
            _chain_product(w_ptr + w_off, x_ptr, y_ptr, n, pid, P, i, cnt_ptr, spin_max, err_ptr,
                           KA, KPA, RA, SYNC)
        elif which == 1:
            _chain_product(w_ptr + w_off, x_ptr, y_ptr, n, pid, P, i, cnt_ptr, spin_max, err_ptr,
                           KB, KPB, RB, SYNC)
        else:
            _chain_product(w_ptr + w_off, x_ptr, y_ptr, n, pid, P, i, cnt_ptr, spin_max, err_ptr,
                           KC, KPC, RC, SYNC)
    if SYNC == "counter":
        _arrive(cnt_ptr + NPROD - 1)   # (read back by the tests: every count is P)


class GemvChain:
    """The products W_0 ... W_{n-1} (each [N_i, K_i], one dtype, N_{i-1} >= K_i, at most three
    distinct K) packed into one weight buffer, run as one persistent launch by ``__call__``.
    ``programs``: the grid (default: as many as the compiled kernel keeps resident on every SM,
    at most ``per_sm`` an SM; 1 under the interpreter). ``num_warps``: per program. ``sync``:
    how a product waits for its input, "counter" (arrival counters, read back in ``counters``)
    or "data" (the input polled until no value is the NaN it was poisoned with; a product
    whose true output holds a NaN would wait out SPIN_MAX and set ``error``)."""

    def __init__(self, weights: list[torch.Tensor], *, per_sm: int = 4, num_warps: int = 4,
                 programs: int | None = None, sync: str = "counter") -> None:
        if not weights:
            raise ValueError("GemvChain: no weights")
        if sync not in ("counter", "data"):
            raise ValueError(f"GemvChain: sync={sync!r} must be 'counter' or 'data'")
        self.sync = sync
        dtype, dev = weights[0].dtype, weights[0].device
        ks = sorted({int(w.shape[1]) for w in weights})
        if len(ks) > 3:
            raise ValueError(f"GemvChain: at most three distinct K, got {ks}")
        for j, w in enumerate(weights):
            if w.dim() != 2 or w.dtype != dtype or w.device != dev:
                raise ValueError(f"GemvChain: weight {j} must be 2-D {dtype} on {dev}, got "
                                 f"{tuple(w.shape)} {w.dtype} on {w.device}")
            if j and w.shape[1] > weights[j - 1].shape[0]:
                raise ValueError(f"GemvChain: weight {j} takes K={w.shape[1]} inputs but weight "
                                 f"{j - 1} gives only N={weights[j - 1].shape[0]}")
        self.ks = (ks + [ks[-1]] * 3)[:3]
        self.k0 = int(weights[0].shape[1])
        self.n_out = int(weights[-1].shape[0])

        def up(v: int) -> int:
            return -(-v // ALIGN) * ALIGN

        # each weight and activation starting at a multiple of ALIGN elements
        rows, w_off, x_off, a_off = [], 0, 0, up(self.k0)  # activations: x at 0, then outputs
        for w in weights:
            n, k = int(w.shape[0]), int(w.shape[1])
            rows.append([w_off, n, self.ks.index(k), x_off])
            w_off = up(w_off + n * k)
            x_off, a_off = a_off, up(a_off + n)
        rows.append([0, 0, 0, x_off])
        self.out_off = x_off
        self.desc = torch.tensor(rows, dtype=torch.int64, device=dev)
        self.weight = torch.zeros(w_off, dtype=dtype, device=dev)
        for (off, n, _, _), w in zip(rows, weights):
            self.weight[off: off + w.numel()].copy_(w.reshape(-1))
        self.act = torch.zeros(a_off, dtype=dtype, device=dev)
        self.counters = torch.zeros(len(weights), dtype=torch.int32, device=dev)
        self.error = torch.zeros(1, dtype=torch.int32, device=dev)
        self.num_warps = num_warps
        self.programs = programs or (1 if INTERPRET else self._resident(per_sm))

    def _reset(self) -> None:
        """Before a launch: the barrier counters to 0, or ("data") the outputs to NaN."""
        if self.sync == "counter":
            self.counters.zero_()
        else:
            self.act[self.k0:].fill_(float("nan"))

    def _launch(self, programs: int):
        ra, rb, rc = (rows_block_n(1 << 30, k, TILE_BYTES) for k in self.ks)
        pa, pb, pc = (triton.next_power_of_2(k) for k in self.ks)
        return _chain_kernel[(programs,)](
            self.weight, self.desc, self.act, self.counters, self.error, len(self.counters),
            SPIN_MAX, KA=self.ks[0], KB=self.ks[1], KC=self.ks[2], KPA=pa, KPB=pb, KPC=pc,
            RA=ra, RB=rb, RC=rc, ALIGN=ALIGN, SYNC=self.sync, num_warps=self.num_warps)

    def _resident(self, per_sm: int) -> int:
        """Programs that fit on the SMs at once: per_sm an SM, fewer if registers say so (an
        NVIDIA SM's 64K registers; AMD's CUs count differently and are refused)."""
        if torch.version.hip:
            raise RuntimeError("GemvChain: residency is worked out for NVIDIA SMs only; pass "
                               "programs= on AMD (not run on hardware)")
        self._reset()
        kernel = self._launch(1)   # compiles; one program runs the chain alone
        regs = int(kernel.n_regs)
        fit = min(per_sm, programs_per_sm(regs, self.num_warps))
        if fit < 1:
            raise RuntimeError(f"GemvChain: {regs} registers a thread leave no room for a program")
        return fit * num_sms(self.weight.device, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [K_0] or [1, K_0] -> the last product's output [1, N_last] (a view of the chain's
        activation buffer, overwritten by the next call)."""
        x = x.reshape(-1)
        if x.numel() != self.k0 or x.dtype != self.act.dtype:
            raise ValueError(f"GemvChain: x of {self.k0} {self.act.dtype} expected, got "
                             f"{x.numel()} {x.dtype}")
        self._reset()
        self.act[: self.k0].copy_(x)
        self._launch(self.programs)
        return self.act[self.out_off: self.out_off + self.n_out].view(1, -1)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    # Qwen3.5-0.8B's step: K 1,024 (in_proj / qkv, gate_up, lm_head), 2,048 (out_proj / o_proj),
    # 3,584 (down), bf16
    ks = (1024, 2048, 3584)
    sig = {"w_ptr": "*bf16", "desc_ptr": "*i64", "act_ptr": "*bf16", "cnt_ptr": "*i32",
           "err_ptr": "*i32", "NPROD": "i32", "spin_max": "i32",
           **{f"{p}{a}": "constexpr" for p in ("K", "KP", "R") for a in "ABC"},
           "ALIGN": "constexpr", "SYNC": "constexpr"}
    consts = {**{f"K{a}": k for a, k in zip("ABC", ks)},
              **{f"KP{a}": triton.next_power_of_2(k) for a, k in zip("ABC", ks)},
              **{f"R{a}": rows_block_n(1 << 30, k, TILE_BYTES) for a, k in zip("ABC", ks)},
              "ALIGN": ALIGN}
    return [AotSpec(f"gemv_chain[bf16,1024/2048/3584,{sync}]", _chain_kernel, sig,
                    {**consts, "SYNC": sync}, {"num_warps": 4},
                    divisible=("w_ptr", "desc_ptr", "act_ptr"))
            for sync in ("counter", "data")]


AOT_SPECS = _aot_specs()
