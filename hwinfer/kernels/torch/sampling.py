"""Token sampling in plain torch without full sorts (contract: :func:`hwinfer.ops.sampling.sample`).

The reference sorts every row twice (top-k's k-th value, top-p's order): over a 248,320-token
vocabulary that is ~100 ms a sampled token on a 2-core CPU, more than a small model's decode
step. Here, row by row:

* top-k's k-th largest value comes from ``torch.topk`` (the same value the sort gives);
* top-p's order is needed only up to the cut. The candidates are every token whose probability
  is at least the m-th largest (m = 1,024, then 16,384 unless that mass is below p / 2, then the
  row): all tokens tied at the boundary are in, so sorting them (probability descending, id
  ascending, as the reference's stable sort) gives exactly the first entries of the reference's
  order, and the cumulative sum (sequential, as torch's) the same prefix. Once that prefix
  reaches ``p``, no later token can be kept;
* the noise is drawn at the kept tokens only (:func:`~hwinfer.ops.sampling.uniforms_at`).

Same probabilities (one softmax over the row), same sums, same noise: the same token as the
reference. The row loop reads values on the host (``tolist``, ``nonzero``), which is fine on a
CPU and costs a sync per row elsewhere, as the reference's ``any()`` checks do.
"""
from __future__ import annotations

import torch

from hwinfer.ops.sampling import check_sample, uniforms_at

FIRST_CANDIDATES = 1024


def _top_p_kept(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Ids (ascending) of the shortest prefix of ``probs`` sorted descending (ties by id) whose
    mass before each entry is below ``p`` (the first always kept)."""
    v = probs.shape[0]
    m = FIRST_CANDIDATES
    while True:
        m = v if m > FIRST_CANDIDATES * 16 else min(m, v)
        if m == v:
            cand = torch.arange(v, device=probs.device)
        else:
            floor = torch.topk(probs, m, sorted=False).values.min()
            cand = (probs >= floor).nonzero()[:, 0]               # every tie at the boundary too
        cand_probs = probs[cand]
        order = torch.sort(cand_probs, descending=True, stable=True).indices
        sorted_probs = cand_probs[order]
        total = sorted_probs.cumsum(0)
        if m == v or bool(total[-1] >= p):   # the next token's mass before is >= p: not kept
            break
        # 16x more, or the whole row at once when this much is far from enough (flat rows)
        m = v if bool(total[-1] < p / 2) else m * 16
    keep = (total - sorted_probs) < p
    keep[0] = True
    kept = torch.zeros(v, dtype=torch.bool, device=probs.device)
    kept[cand[order][keep]] = True
    return kept.nonzero()[:, 0]   # ascending, without another sort


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """logits [B, V]; temperature, top_p [B] float; top_k, seeds, steps [B] int -> ids [B] int32."""
    check_sample(logits, temperature, top_k, top_p, seeds, steps)
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.int32, device=logits.device)
    l32 = logits.float()
    temp = temperature.float().clamp_min(1e-6)
    ks = top_k.to(torch.int64).clamp(0, v).tolist()
    p32 = top_p.float()
    sampled = (temperature > 0).tolist()
    use_p = (p32 < 1.0).tolist()
    for r in range(b):
        if not sampled[r]:
            out[r] = l32[r].argmax()
            continue
        scaled = l32[r] / temp[r]
        keep = scaled >= torch.topk(scaled, ks[r]).values[-1] if ks[r] > 0 else None
        if use_p[r]:
            masked = scaled if keep is None else scaled.masked_fill(~keep, float("-inf"))
            probs = torch.softmax(masked[None], dim=-1)[0]
            if keep is None:
                ids = _top_p_kept(probs, p32[r])
            else:   # top-k's tokens only: the rest have probability 0 and sort after them
                kept = keep.nonzero()[:, 0]
                ids = kept[_top_p_kept(probs[kept], p32[r])]
        elif keep is not None:
            ids = keep.nonzero()[:, 0]
        else:
            ids = torch.arange(v, device=logits.device)
        noise = uniforms_at(seeds[r], steps[r], ids)
        out[r] = ids[torch.argmax(scaled[ids] - torch.log(-torch.log(noise)))]
    return out
