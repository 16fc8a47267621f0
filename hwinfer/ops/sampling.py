"""Token sampling: greedy, temperature, top-k, top-p, reproducible per request seed.

Randomness comes from a counter-based hash of (seed, step, token id) written with 32-bit integer
operations, not from a device RNG: the same request seed gives the same noise on every device and
every backend, a kernel can reproduce it exactly, and a request's draw does not depend on what
else is in the batch.
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import EXACT, Case, define_op, randn

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so a 32-bit value times one of them stays inside int64 (torch has
# no uint32 arithmetic on every device); the low 32 bits are kept after each step.
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing function on int64 tensors holding values in [0, 2**32).

    Three xor-shift / multiply rounds; every step is reproducible in a GPU kernel with uint32
    arithmetic (products taken modulo 2**32).
    """
    x = x & _MASK32
    for mul in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * mul) & _MASK32
    return x ^ (x >> 15)


def sampling_uniforms(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniform noise in (0, 1), fp32, shape [B, V]: u[b, i] = U(hash(seed_b, step_b, i)).

    The 24 high bits of the hash give ``(h + 0.5) / 2**24``, exactly representable in fp32 and
    never 0 or 1, so ``-log(-log(u))`` is always finite.
    """
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    return uniforms_at(seeds[:, None], steps[:, None], ids[None, :])


def uniforms_at(seeds: torch.Tensor, steps: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """:func:`sampling_uniforms` at the given token ids only (broadcast together): the same
    fp32 values, for an implementation that draws over a few kept tokens."""
    seeds = seeds.to(torch.int64)
    steps = steps.to(torch.int64)
    h = mix32(ids.to(torch.int64) ^ mix32(steps ^ mix32((seeds & _MASK32) ^ mix32(seeds >> 32))))
    return ((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)


def check_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> None:
    """The shapes :func:`sample` accepts, with an error naming the argument otherwise."""
    if logits.dim() != 2:
        raise ValueError(f"sample: logits must be [B, V], got shape {tuple(logits.shape)}")
    b = logits.shape[0]
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                    ("seeds", seeds), ("steps", steps)):
        if t.shape != (b,):
            raise ValueError(f"sample: {name} must have shape [{b}], got {tuple(t.shape)}")


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Pick one token per row.

    Per row b (all math in fp32):

    * ``temperature[b] <= 0``: greedy, ``argmax(logits[b])``; ties go to the lowest token id.
    * else ``l = logits[b] / temperature[b]``; **top-k** (``top_k[b] > 0``) keeps tokens whose
      ``l`` is >= the k-th largest value (ties at the boundary are all kept); **top-p**
      (``top_p[b] < 1``) then sorts the kept tokens by probability (descending, ties by id) and
      keeps the shortest prefix whose probability mass reaches ``top_p[b]`` (at least one token);
      the winner is ``argmax(l + gumbel)`` over kept tokens, with gumbel noise
      ``-log(-log(u))``, ``u = sampling_uniforms(seeds, steps, V)`` (Gumbel-max = a draw from
      softmax(l) restricted to the kept set). Same (seed, step, logits) -> same token anywhere.

    Shapes: logits [B, V] any float dtype; temperature [B] fp32; top_k [B] int (0 = off);
    top_p [B] fp32 in (0, 1] (1 = off); seeds [B] int64 (per request); steps [B] int64 (the
    index of the token being generated, so each step draws fresh noise).
    Returns token ids [B] int32.
    """
    check_sample(logits, temperature, top_k, top_p, seeds, steps)
    v = logits.shape[1]
    l32 = logits.float()
    greedy = l32.argmax(dim=-1)
    temp = temperature.float().clamp_min(1e-6)
    scaled = l32 / temp[:, None]
    keep = torch.ones_like(scaled, dtype=torch.bool)

    k = top_k.to(torch.int64).clamp(0, v)
    use_k = k > 0
    if bool(use_k.any()):
        sorted_desc = scaled.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(1, (k.clamp_min(1) - 1)[:, None])
        keep &= ~use_k[:, None] | (scaled >= kth)

    p = top_p.float()
    use_p = p < 1.0
    if bool(use_p.any()):
        masked = scaled.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(masked, dim=-1)
        # Stable order: descending probability, then ascending token id.
        order = torch.sort(probs, dim=-1, descending=True, stable=True).indices
        sorted_probs = probs.gather(1, order)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep_sorted = mass_before < p[:, None]
        keep_sorted[:, 0] = True
        keep_p = torch.zeros_like(keep).scatter(1, order, keep_sorted)
        keep &= ~use_p[:, None] | keep_p

    gumbel = -torch.log(-torch.log(sampling_uniforms(seeds, steps, v)))
    drawn = (scaled + gumbel).masked_fill(~keep, float("-inf")).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, greedy).to(torch.int32)


def greedy_tokens(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Greedy token of each row, written in place: ``out[b] = argmax_i logits[b, i]``.

    logits [B, V] fp32 / bf16 / fp16; out [B] int64, overwritten and returned. Ties go to the
    lowest id (the sampler's greedy rule); -0.0 equals +0.0; NaN counts as larger than every
    number, so a row holding NaN gets its first NaN's id, as ``torch.argmax`` gives.
    Implementations must be capturable in a CUDA graph (no host sync, nothing that needs
    redoing per replay): the decode graphs end with this op, writing the tokens the next step
    reads.
    """
    return torch.argmax(logits, dim=-1, out=out)


def _greedy_case(batch: int, vocab: int, spots: str):
    def make(gen, dtype, device):
        logits = randn(gen, batch, vocab, dtype=dtype, device=device, scale=3.0)
        if spots == "ties":
            # Few distinct values (exact in every dtype): each row's maximum occurs many times.
            logits = torch.randint(-8, 8, (batch, vocab), generator=gen).to(dtype).to(device)
        elif spots == "specials":
            logits[0, vocab // 3] = float("nan")          # NaN wins, first NaN's id
            logits[0, vocab // 2] = float("nan")
            logits[1] = float("-inf")                     # all -inf: id 0
            logits[2, 7], logits[2, vocab - 1] = float("inf"), float("inf")
            logits[3] = 0.0                               # -0.0 == +0.0: id 0
            logits[3, 0] = -0.0
        out = torch.full((batch,), -1, dtype=torch.int64, device=device)
        return {"logits": logits, "out": out}
    return make


GREEDY_TOKENS = define_op(
    greedy_tokens,
    cases=[
        Case("one_row_vocab_248k", _greedy_case(1, 248_320, "random")),
        Case("rows_8_ties", _greedy_case(8, 5000, "ties")),
        Case("specials", _greedy_case(4, 3001, "specials")),
        Case("rows_33_odd_vocab", _greedy_case(33, 1031, "random")),
    ],
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT, torch.float16: EXACT},
    dtypes=(torch.float32, torch.bfloat16, torch.float16),
    mutates=("out",),
)


def _case(batch: int, vocab: int, mode: str):
    def make(gen, dtype, device):
        logits = randn(gen, batch, vocab, dtype=dtype, device=device, scale=3.0)
        temperature = torch.full((batch,), 0.0 if mode == "greedy" else 0.8)
        top_k = torch.zeros(batch, dtype=torch.int32)
        top_p = torch.ones(batch)
        if mode == "mixed":
            temperature = torch.tensor([0.0, 0.7, 1.0, 1.3][:batch] * (batch // 4 + 1))[:batch]
            top_k = torch.tensor([0, 40, 0, 5][:batch] * (batch // 4 + 1), dtype=torch.int32)[:batch]
            top_p = torch.tensor([1.0, 0.9, 0.5, 1.0][:batch] * (batch // 4 + 1))[:batch]
        seeds = torch.randint(0, 2**62, (batch,), generator=gen)
        steps = torch.randint(0, 4096, (batch,), generator=gen)
        return {"logits": logits, "temperature": temperature.to(device),
                "top_k": top_k.to(device), "top_p": top_p.to(device),
                "seeds": seeds.to(device), "steps": steps.to(device)}
    return make


SAMPLE = define_op(
    sample,
    cases=[
        Case("greedy", _case(4, 1000, "greedy")),
        Case("temperature", _case(5, 4096, "temperature")),
        Case("mixed_topk_topp", _case(8, 3000, "mixed")),
    ],
    # Token ids must match exactly: the noise is deterministic and fixtures are tie-free.
    tolerance={torch.float32: EXACT, torch.bfloat16: EXACT},
)
