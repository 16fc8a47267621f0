"""Triton token sampling split over the vocabulary (contract: :func:`hwinfer.ops.sampling.sample`).

One program per row made ~20 passes over ~250k logits on one SM: 2 ms a call for top-k + top-p
at batch 1 on the H200 (docs/kernels.md, second session), more than the decode step it follows.
Here every pass is a launch of ``_sample_kernel`` on grid (rows, chunks of BLOCK logits), so it
runs on every SM; the programs of a row meet in per-row words (:mod:`.resting`) through atomics,
and the program that draws the row's last ticket of a launch takes the row's decision for the
next launch (then puts the words it read back to rest). Ten launches, a fixed number, so the
call needs no host sync and could be captured in a CUDA graph:

* FIRST: the greedy winner of the raw logits (ties to the lowest id, NaN largest), folded into
  an int64 ``(order key, 2^32 - 1 - id)`` by ``atomic_max`` as in ``greedy_tokens``; greedy rows
  (temperature <= 0) end here. It also holds the row maximum, hence ``smax`` = max l / t.
* K1..K3 (and FIRST's histogram, level 0): top-k's k-th largest scaled value, exactly, by radix
  select over the 32-bit order key of ``l = logits / t``: each level counts the keys under the
  prefix chosen so far into 256 bins of the next 8 bits; the last program picks the bin holding
  the k-th largest and what is left of k.
* P0..P3: top-p's cut, the smallest kept key ``v`` whose strictly-greater mass ``E_gt(v)`` is
  below ``p Z`` (Z: the kept mass), by the same radix walk over bins weighted by exp(l - smax);
  the lowest non-empty bin whose mass above is below the target holds it. Masses are summed per
  program in fp32, then across programs in int64 fixed point (2^40 a unit): integer atomics,
  so the sums do not depend on the order programs arrive in.
* TIES: when only some tokens tied at the cut are kept (the reference keeps them in id order
  while the mass before them is below ``p Z``), the id of the last kept one, from per-chunk tie
  counts.
* FINAL: Gumbel-max over the kept set with the contract's counter-based noise (mix32 in uint32),
  the winner folded by ``atomic_max`` as FIRST's; the last program writes the token and puts
  every word of the row back to its start value.

Each program histograms its chunk by comparing sub-blocks of SUB keys against the 256 bins (no
shared-memory atomics in Triton), then adds its non-empty bins with one atomic each.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.resting import last_arrival, resting_words
from hwinfer.kernels.triton.sampling import (_INT32_MAX, _INT32_MIN, _INT64_MIN, _fold, _key, _mix32,
                                           _take, _unkey, greedy_tokens_supported)
from hwinfer.ops.sampling import check_sample

STAGES = 10   # launches a call: FIRST, K1-K3, P0-P3, TIES, FINAL
FIRST, K3, P0, P3, TIES = (tl.constexpr(i) for i in (0, 3, 4, 7, 8))
_UNIT = tl.constexpr(1099511627776.0)   # 2^40: fixed-point unit of the top-p masses
# A row's 8 int64 state words
_K_PREFIX, _K_REM, _P_PREFIX, _E_ABOVE, _TARGET, _N_KEEP, _TIE_MAX, _N_TIES = (
    tl.constexpr(i) for i in range(8))


@triton.jit
def _row_keys(logits_ptr, row, stride, offs, V, t):
    """(in range, scaled values l = x / t, their order keys as uint32 held in int64)."""
    m = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=m, other=float("-inf"))
    sv = tl.math.div_rn(x.to(tl.float32), t)
    return m, sv, _key(sv).to(tl.int64) + 2147483648


@triton.jit
def _histogram(logits_ptr, row, stride, c, V, t, smax, prefix, thr_k, use_k,
               LEVEL: tl.constexpr, KEPT: tl.constexpr, MASS: tl.constexpr,
               BLOCK: tl.constexpr, SUB: tl.constexpr):
    """Counts [256] (and fp32 masses exp(l - smax)) of this chunk's keys whose top 8 * LEVEL
    bits equal ``prefix``, by their next 8 bits; KEPT: only keys >= thr_k where top-k is on."""
    bins = tl.arange(0, 256)
    cnt = tl.zeros([256], tl.int32)
    mass = tl.zeros([256], tl.float32)
    for s in range(0, BLOCK, SUB):
        offs = c * BLOCK + s + tl.arange(0, SUB)
        m, sv, u = _row_keys(logits_ptr, row, stride, offs, V, t)
        sel = m & ((u >> (32 - 8 * LEVEL)) == prefix)
        if KEPT:
            sel = sel & (~use_k | (u >= thr_k))
        if tl.max(sel.to(tl.int32), axis=0) > 0:   # below level 0 most sub-blocks have none
            hit = (((u >> (24 - 8 * LEVEL)) & 255)[:, None] == bins[None, :]) & sel[:, None]
            cnt += tl.sum(hit.to(tl.int32), axis=0)
            if MASS:
                mass += tl.sum(tl.where(hit, tl.exp(sv - smax)[:, None], 0.0), axis=0)
    return cnt, mass


@triton.jit
def _sample_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, step_ptr, out_ptr,
                   best_ptr, state_ptr, ticket_ptr, hn_ptr, hm_ptr, ties_ptr, V, stride, CHUNKS,
                   STAGE: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr,
                   CMAX: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    temp = tl.load(temp_ptr + row).to(tl.float32)
    sampled = temp > 0
    t = tl.maximum(temp, 1e-6)
    k = tl.minimum(tl.maximum(tl.load(topk_ptr + row).to(tl.int64), 0), V)
    use_k = k > 0
    p = tl.load(topp_ptr + row).to(tl.float32)
    use_p = p < 1.0
    st = state_ptr + row.to(tl.int64) * 8
    hn = hn_ptr + row.to(tl.int64) * 256
    hm = hm_ptr + row.to(tl.int64) * 256
    bins = tl.arange(0, 256)
    gb = tl.load(best_ptr + 2 * row)                 # the greedy winner (after FIRST)
    smax = tl.math.div_rn(_unkey(gb >> 32), t)       # max of l = the max logit / t
    thr_k = tl.load(st + _K_PREFIX)                  # after K3: the k-th largest key
    if STAGE == FIRST:
        offs = c * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=offs < V, other=0.0)
        key = tl.where(x != x, _INT32_MAX, _key(x.to(tl.float32)))
        key = tl.where(offs < V, key, _INT32_MIN)
        _fold(best_ptr + 2 * row, key, offs)
        if sampled & use_k:
            cnt, _m = _histogram(logits_ptr, row, stride, c, V, t, smax, 0, 0, use_k,
                                 0, False, False, BLOCK, SUB)
            tl.atomic_add(hn + bins, cnt, mask=cnt > 0)
        if last_arrival(ticket_ptr + row, tl.num_programs(1)):
            if sampled:
                if use_k:
                    _select_k(hn, st, k, k * 0, bins)
            else:
                tl.store(out_ptr + row, _take(best_ptr + 2 * row))
    elif STAGE <= K3:
        if sampled & use_k:
            prefix = tl.load(st + _K_PREFIX)
            cnt, _m = _histogram(logits_ptr, row, stride, c, V, t, smax, prefix, 0, use_k,
                                 STAGE, False, False, BLOCK, SUB)
            tl.atomic_add(hn + bins, cnt, mask=cnt > 0)
            if last_arrival(ticket_ptr + row, tl.num_programs(1)):
                _select_k(hn, st, tl.load(st + _K_REM), prefix, bins)
    elif STAGE <= P3:
        if sampled & use_p:
            prefix = tl.load(st + _P_PREFIX)
            cnt, mass = _histogram(logits_ptr, row, stride, c, V, t, smax, prefix, thr_k, use_k,
                                   STAGE - P0, True, True, BLOCK, SUB)
            tl.atomic_add(hn + bins, cnt, mask=cnt > 0)
            tl.atomic_add(hm + bins, (mass * _UNIT).to(tl.int64), mask=cnt > 0)
            if last_arrival(ticket_ptr + row, tl.num_programs(1)):
                _select_p(hn, hm, st, p, prefix, smax, bins, STAGE == P0, STAGE == P3)
    elif STAGE == TIES:
        n_keep = tl.load(st + _N_KEEP)
        if sampled & use_p & (n_keep < tl.load(st + _N_TIES)):
            thr_p = tl.load(st + _P_PREFIX)
            offs = c * BLOCK + tl.arange(0, BLOCK)
            m, sv, u = _row_keys(logits_ptr, row, stride, offs, V, t)
            tie = m & (~use_k | (u >= thr_k)) & (u == thr_p)
            tl.store(ties_ptr + row.to(tl.int64) * CMAX + c, tl.sum(tie.to(tl.int32), axis=0))
            if last_arrival(ticket_ptr + row, tl.num_programs(1)):
                # The chunk holding the n_keep-th tie (ties kept in id order), then its id.
                ci = tl.arange(0, CMAX)
                per = tl.load(ties_ptr + row.to(tl.int64) * CMAX + ci, mask=ci < CHUNKS, other=0,
                              cache_modifier=".cg")
                cs = tl.cumsum(per, axis=0)
                cstar = tl.min(tl.where(cs >= n_keep, ci, CMAX), axis=0)
                need = n_keep - tl.sum(tl.where(ci == cstar, cs - per, 0), axis=0)
                offs = cstar * BLOCK + tl.arange(0, BLOCK)
                m, sv, u = _row_keys(logits_ptr, row, stride, offs, V, t)
                tie = m & (~use_k | (u >= thr_k)) & (u == thr_p)
                rank = tl.cumsum(tie.to(tl.int64), axis=0)
                tl.store(st + _TIE_MAX, tl.min(tl.where(tie & (rank == need), offs, _INT32_MAX), axis=0))
    else:
        if sampled:
            offs = c * BLOCK + tl.arange(0, BLOCK)
            m, sv, u = _row_keys(logits_ptr, row, stride, offs, V, t)
            kept = m & (~use_k | (u >= thr_k))
            if use_p:
                thr_p = tl.load(st + _P_PREFIX)
                all_ties = tl.load(st + _N_KEEP) >= tl.load(st + _N_TIES)
                tie_kept = all_ties | (offs <= tl.load(st + _TIE_MAX))
                kept = kept & ((u > thr_p) | ((u == thr_p) & tie_kept))
            seed = tl.load(seed_ptr + row).to(tl.int64)
            step = tl.load(step_ptr + row).to(tl.int64)
            hrow = _mix32(step.to(tl.uint32)
                          ^ _mix32(seed.to(tl.uint32) ^ _mix32((seed >> 32).to(tl.uint32))))
            noise = ((_mix32(offs.to(tl.uint32) ^ hrow) >> 8).to(tl.float32) + 0.5) / 16777216.0
            _fold(best_ptr + 2 * row + 1,
                  tl.where(kept, _key(sv - tl.log(-tl.log(noise))), _INT32_MIN), offs)
            if last_arrival(ticket_ptr + row, tl.num_programs(1)):
                tl.store(out_ptr + row, _take(best_ptr + 2 * row + 1))
                tl.atomic_xchg(best_ptr + 2 * row, _INT64_MIN)
                tl.store(st + tl.arange(0, 8), tl.zeros([8], tl.int64))


@triton.jit
def _select_k(hn, st, krem, prefix, bins):
    """The bin (from the top) holding the krem-th largest key under ``prefix``: the prefix grows
    by it, krem drops by the keys in the bins above; the counts go back to 0."""
    cnt = tl.load(hn + 255 - bins, cache_modifier=".cg")     # bins from the top
    cs = tl.cumsum(cnt, axis=0)
    i = tl.min(tl.where(cs >= krem, bins, 256), axis=0)
    above = tl.sum(tl.where(bins == i, cs - cnt, 0), axis=0).to(tl.int64)
    tl.store(st + _K_PREFIX, prefix * 256 + (255 - i).to(tl.int64))
    tl.store(st + _K_REM, krem - above)
    tl.store(hn + bins, tl.zeros([256], tl.int32))


@triton.jit
def _select_p(hn, hm, st, p, prefix, smax, bins, FIRST_LEVEL: tl.constexpr, LAST: tl.constexpr):
    """The lowest non-empty bin whose kept mass above (plus the mass above the prefix) is below
    the target p Z: it holds the cut. At level 0 Z is the sum of every bin. At the last level
    the bin is one key: the ties there, and how many of them (in id order) stay kept."""
    cnt = tl.load(hn + 255 - bins, cache_modifier=".cg")
    mass = tl.load(hm + 255 - bins, cache_modifier=".cg")
    if FIRST_LEVEL:
        z = tl.sum(mass, axis=0).to(tl.float64) * p.to(tl.float64)
        target = z.to(tl.int64)
        target += (target.to(tl.float64) < z).to(tl.int64)      # ceil(p Z): E < pZ <=> E < ceil
        target = tl.maximum(target, 1)   # p <= 0: the top token alone, as the reference keeps
        tl.store(st + _TARGET, target)
        e_above = target * 0
    else:
        target = tl.load(st + _TARGET)
        e_above = tl.load(st + _E_ABOVE)
    excl = tl.cumsum(mass, axis=0) - mass
    i = tl.max(tl.where((cnt > 0) & (e_above + excl < target), bins, -1), axis=0)
    e_above += tl.sum(tl.where(bins == i, excl, 0), axis=0)
    cut = prefix * 256 + (255 - i).to(tl.int64)
    tl.store(st + _P_PREFIX, cut)
    tl.store(st + _E_ABOVE, e_above)
    if LAST:
        ties = tl.sum(tl.where(bins == i, cnt, 0), axis=0).to(tl.int64)
        one = (tl.exp(_unkey(cut - 2147483648) - smax) * _UNIT).to(tl.int64)
        keep = tl.where(one > 0, (target - e_above + one - 1) // tl.maximum(one, 1), ties)
        tl.store(st + _N_TIES, ties)
        tl.store(st + _N_KEEP, tl.minimum(tl.maximum(keep, 1), ties))
    tl.store(hn + bins, tl.zeros([256], tl.int32))
    tl.store(hm + bins, tl.zeros([256], tl.int64))


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
           block: int = 2048, sub: int = 32, num_warps: int = 4) -> torch.Tensor:
    """logits [B, V]; temperature, top_p [B] float; top_k, seeds, steps [B] int -> ids [B] int32."""
    check_sample(logits, temperature, top_k, top_p, seeds, steps)
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.int32, device=logits.device)
    if b == 0:
        return out
    if v == 0:
        raise ValueError("sample: empty vocabulary")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    block = min(block, max(sub, triton.next_power_of_2(v)))
    chunks = triton.cdiv(v, block)
    cmax = max(16, triton.next_power_of_2(chunks))
    (best,) = resting_words("sample:best", 2 * b, dev, ((torch.int64, -2**63),))
    (state,) = resting_words("sample:state", 8 * b, dev, ((torch.int64, 0),))
    (ticket,) = resting_words("sample:ticket", b, dev, ((torch.int32, 0),))
    hn, hm = resting_words("sample:hist", 256 * b, dev, ((torch.int32, 0), (torch.int64, 0)))
    (ties,) = resting_words("sample:ties", cmax * b, dev, ((torch.int32, 0),))
    args = (logits, temperature.contiguous(), top_k.contiguous(), top_p.contiguous(),
            seeds.contiguous(), steps.contiguous(), out, best, state, ticket, hn, hm, ties, v,
            logits.stride(0), chunks)
    for stage in range(STAGES):
        _sample_kernel[(b, chunks)](*args, STAGE=stage, BLOCK=block, SUB=sub, CMAX=cmax,
                                    num_warps=num_warps)
    return out


def sample_supported(logits: torch.Tensor, top_k: torch.Tensor, seeds: torch.Tensor,
                     steps: torch.Tensor, **_: object) -> str | None:
    """Per-call check: float logits [B, V] with int32 ids, integer top_k / seeds / steps."""
    reason = greedy_tokens_supported(logits)
    for name, tt in (("top_k", top_k), ("seeds", seeds), ("steps", steps)):
        if reason is None and tt.is_floating_point():
            reason = f"{name} must be an integer tensor"
    return reason


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        sig = {"logits_ptr": f"*{dtype}", "temp_ptr": "*fp32", "topk_ptr": "*i32",
               "topp_ptr": "*fp32", "seed_ptr": "*i64", "step_ptr": "*i64", "out_ptr": "*i32",
               "best_ptr": "*i64", "state_ptr": "*i64", "ticket_ptr": "*i32", "hn_ptr": "*i32",
               "hm_ptr": "*i64", "ties_ptr": "*i32", "V": "i32", "stride": "i32", "CHUNKS": "i32",
               "STAGE": "constexpr", "BLOCK": "constexpr", "SUB": "constexpr", "CMAX": "constexpr"}
        for stage in range(STAGES):
            specs.append(AotSpec(f"sample[{dtype},stage {stage}]", _sample_kernel, sig,
                                 {"STAGE": stage, "BLOCK": 2048, "SUB": 32, "CMAX": 128},
                                 {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
