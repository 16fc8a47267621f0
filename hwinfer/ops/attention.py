"""Dense softmax attention contracts: varlen packed prefill (here) and paged decode
(:mod:`hwinfer.ops.attention_paged`, declared by the import at the bottom of this module).

Both share one masking rule, stated once here and used by both references:

* Every query and key has a *position* inside its sequence (0 = first token). With
  ``causal=True`` a query at position ``p`` sees keys at positions ``<= p``.
* ``window=W`` (sliding-window attention) additionally restricts it to positions
  ``p - W + 1 .. p``: the query itself plus the ``W - 1`` previous tokens. This is transformers'
  ``sliding_window`` convention for Gemma 4 (``config.sliding_window``, mask
  ``kv_idx > q_idx - sliding_window``) and DeepSeek-V4 (``config.sliding_window``, same mask; its
  cache keeps the last ``W - 1`` keys and appends the new one). vLLM / flash-attn express the same
  window as ``window_size_left = W - 1``.
* A per-head sink logit ``sinks[h]`` (DeepSeek-V4 ``attn_sink``, HY4 ``learnable_sink_param``,
  GPT-OSS) is appended to every row as one extra softmax column *in logit space* (it is not
  multiplied by ``scale``) and dropped afterwards, so the probabilities over real keys sum to
  less than 1.
* A query that sees no key (only possible here for a non-causal sequence without keys) gets an
  output of 0, never NaN.
"""
from __future__ import annotations

import math

import torch

from hwinfer.ops.contract import Case, Tol, define_op, randn

# fp32: different summation orders over a few hundred keys drift by ~1e-6 absolute on outputs of
# magnitude ~0.1-1, hence a small atol next to the rtol. Low precision: flash-style kernels round
# the probabilities to the input dtype before the P.V product.
TOL = {
    torch.float32: Tol(atol=2e-5, rtol=2e-5),
    torch.bfloat16: Tol(atol=1.5e-2, rtol=2e-2),
    torch.float16: Tol(atol=2e-3, rtol=2e-3),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------------
# Validation shared by the references and the torch impls.


def _rank(t: torch.Tensor, rank: int, name: str, shape: str, op: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{op}: {name} must have rank {rank} {shape}, got shape {tuple(t.shape)}")


def check_heads(hq: int, hkv: int, op: str) -> int:
    """Return the GQA group size ``Hq // Hkv`` or raise if Hq is not a multiple of Hkv."""
    if hkv < 1 or hq % hkv != 0:
        raise ValueError(f"{op}: query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    return hq // hkv


def check_extras(op: str, hq: int, out_shape: tuple[int, ...], window: int | None,
                 sinks: torch.Tensor | None, gate: torch.Tensor | None) -> None:
    """Validate the options both ops share: window, sinks [Hq], gate (shaped like the output)."""
    if window is not None and (isinstance(window, bool) or int(window) != window or window < 1):
        raise ValueError(f"{op}: window must be a positive int (keys p-W+1..p), got {window!r}")
    if sinks is not None and tuple(sinks.shape) != (hq,):
        raise ValueError(f"{op}: sinks must have shape [Hq]=({hq},), got {tuple(sinks.shape)}")
    if gate is not None and tuple(gate.shape) != out_shape:
        raise ValueError(f"{op}: gate must have the output's shape {out_shape}, got {tuple(gate.shape)}")


def check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool,
                    window: int | None, sinks: torch.Tensor | None,
                    gate: torch.Tensor | None) -> tuple[list[int], list[int]]:
    """Validate :func:`attention`'s inputs; return the (q, k) sequence boundaries as lists."""
    op = "attention"
    _rank(q, 3, "q", "[T, Hq, Dk]", op)
    _rank(k, 3, "k", "[S, Hkv, Dk]", op)
    if v is not None:
        _rank(v, 3, "v", "[S, Hkv, Dv]", op)
        if v.shape[:2] != k.shape[:2]:
            raise ValueError(f"{op}: v {tuple(v.shape)} and k {tuple(k.shape)} differ in [S, Hkv]")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{op}: q head dim {q.shape[2]} != k head dim {k.shape[2]}")
    check_heads(q.shape[1], k.shape[1], op)
    dv = (v if v is not None else k).shape[2]
    check_extras(op, q.shape[1], (q.shape[0], q.shape[1], dv), window, sinks, gate)
    if window is not None and not causal:
        raise ValueError(f"{op}: window is only defined for causal attention")
    bounds = []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]),
                            ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
        _rank(cu, 1, name, "[N+1]", op)
        if cu.is_floating_point() or cu.numel() < 1:
            raise ValueError(f"{op}: {name} must be a non-empty integer tensor [N+1]")
        b = [int(x) for x in cu.tolist()]
        if b[0] != 0 or b[-1] != total or any(x > y for x, y in zip(b, b[1:])):
            raise ValueError(f"{op}: {name} must rise from 0 to {total} (the packed length), got {b}")
        bounds.append(b)
    bq, bk = bounds
    if len(bq) != len(bk):
        raise ValueError(f"{op}: cu_seqlens_q has {len(bq) - 1} sequences, cu_seqlens_k {len(bk) - 1}")
    if causal:
        for i in range(len(bq) - 1):
            if bq[i + 1] - bq[i] > bk[i + 1] - bk[i]:
                raise ValueError(f"{op}: sequence {i} has q_len {bq[i + 1] - bq[i]} > k_len "
                                 f"{bk[i + 1] - bk[i]} (causal queries are the last q_len keys)")
    return bq, bk


# ----------------------------------------------------------------------------------------------
# The math, once.


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
           k_pos: torch.Tensor, *, scale: float, causal: bool, window: int | None,
           sinks: torch.Tensor | None) -> torch.Tensor:
    """One sequence: q [Lq, Hq, Dk], k [Lk, Hkv, Dk], v [Lk, Hkv, Dv], positions q_pos [Lq] and
    k_pos [Lk] (int64). Returns fp32 [Lq, Hq, Dv] (see the module docstring for the mask rule)."""
    lq, hq, _ = q.shape
    lk, hkv, dv = v.shape
    if lk == 0:
        return torch.zeros(lq, hq, dv, dtype=torch.float32, device=q.device)
    group = hq // hkv
    # GQA: query head h reads kv head h // group (consecutive query heads share a kv head).
    k32 = k.float().repeat_interleave(group, dim=1)
    v32 = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), k32) * scale
    visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    logits = logits.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink_col = sinks.float().view(hq, 1, 1).expand(hq, lq, 1)
        logits = torch.cat([logits, sink_col], dim=-1)
    row_max = logits.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(logits - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    p = torch.where(denom > 0, p / denom, torch.zeros_like(p))[..., :lk]
    return torch.einsum("hqk,khd->qhd", p, v32)


# ----------------------------------------------------------------------------------------------
# Varlen prefill.


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
              cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *, scale: float,
              causal: bool = True, window: int | None = None, sinks: torch.Tensor | None = None,
              gate: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention over several packed sequences (varlen prefill / chunked prefill).

    For sequence ``i`` (queries ``q[cu_seqlens_q[i]:cu_seqlens_q[i+1]]``, keys/values
    ``k, v[cu_seqlens_k[i]:cu_seqlens_k[i+1]]``), query head ``h``, kv head ``g = h // (Hq/Hkv)``:
    ``o[t, h] = sum_j softmax_j(scale * q[t,h] . k[j,g]  (masked), +sink) * v[j, g]``,
    then ``o *= sigmoid(gate)`` when a gate is given. fp32 throughout; cast to q.dtype once.

    Causal alignment is *bottom-right*: with ``q_len <= k_len`` the queries are the last
    ``q_len`` of the sequence's ``k_len`` positions (query ``t`` is at position
    ``k_len - q_len + t``), so the same call serves plain prefill (q_len = k_len) and a prefill
    chunk continuing after ``k_len - q_len`` cached tokens. ``causal=False`` (vision encoders)
    lets every query see all its sequence's keys and allows any q_len / k_len. Mask, ``window``
    and ``sinks`` semantics: see the module docstring.

    Args:
      q: [T, Hq, Dk] float; T = cu_seqlens_q[-1].
      k: [S, Hkv, Dk] float; S = cu_seqlens_k[-1]; Hq % Hkv == 0 (inputs may differ in float
        dtype: the math is fp32 and the output takes q.dtype).
      v: [S, Hkv, Dv] or None. None means V = K (DeepSeek-V4 shared-KV MQA: its single latent
        head is both key and value, Dv = Dk). Gemma 4's ``attention_k_eq_v`` global layers are
        *not* this case: they share the projection, but V = unweighted-RMSNorm(k_proj x) while
        K = RoPE(k_norm(k_proj x)), so the model passes v explicitly.
      cu_seqlens_q, cu_seqlens_k: [N+1] int32, from 0 to T / S, non-decreasing (empty sequences
        allowed), on q's device or on the CPU: implementations that split the work per sequence
        read the bounds on the host, so the engine passes host copies
        (``ForwardBatch.cu_seqlens_host``) and a prefill does not wait on the device.
      scale: logit multiplier (hd^-1/2 for Qwen3.5 / GLM / MiniMax; 1.0 for Gemma 4, whose q/k
        norms do the scaling; (qk_nope + qk_rope)^-1/2 = 192^-1/2 for Kimi-Linear MLA).
      causal: bottom-right causal mask (default) or none.
      window: sliding window W >= 1 (causal only): Gemma 4 ``sliding_window`` (512) on
        ``sliding_attention`` layers, DeepSeek-V4 ``sliding_window`` (128).
      sinks: [Hq] float (used in fp32), one sink logit per query head (DeepSeek-V4, HY4).
      gate: [T, Hq, Dv] raw gate logits; output multiplied by sigmoid(gate) (Qwen3.5 gated
        attention, MODELS.md 3.4: per head, q_proj's output holds [query hd | gate hd], the caller
        splits it; HY4 ``gate_proj`` [nh*v, H]; Kimi-K3 gated MLA ``g_proj``).

    Uses: Qwen3.5 / MiniMax-M3 full_attention layers (GQA, partial RoPE applied before by the rope
    op), Gemma 4 sliding and global layers, DeepSeek-V4's pure sliding layers (v=None, window,
    sinks; its inverse RoPE on the output is the caller's), Kimi-Linear MLA in non-absorbed form
    (Hq = Hkv, Dk = 192, Dv = 128, MODELS.md 4.3), HY4 / GLM-5 MLA prefill when the indexer keeps
    every key. No target model uses attention-logit soft-capping (Gemma 4 caps only its final
    logits and its audio encoder), so there is no softcap option.

    Returns [T, Hq, Dv] in q.dtype.
    """
    bq, bk = check_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, sinks, gate)
    v = k if v is None else v
    outs = []
    for i in range(len(bq) - 1):
        lq, lk = bq[i + 1] - bq[i], bk[i + 1] - bk[i]
        k_pos = torch.arange(lk, device=q.device)
        q_pos = torch.arange(lk - lq, lk, device=q.device)
        outs.append(attend(q[bq[i]:bq[i + 1]], k[bk[i]:bk[i + 1]], v[bk[i]:bk[i + 1]], q_pos, k_pos,
                           scale=scale, causal=causal, window=window, sinks=sinks))
    out = torch.cat(outs, dim=0) if outs else q.new_zeros(0, q.shape[1], v.shape[2]).float()
    if gate is not None:
        out = out * torch.sigmoid(gate.float())
    return out.to(q.dtype)


def _cu(lens: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32,
                        device=device)


def _varlen_case(q_lens: list[int], k_lens: list[int], hq: int, hkv: int, dk: int, dv: int | None,
                 *, causal: bool = True, window: int | None = None, sinks: bool = False,
                 gate: bool = False, scale: float | None = None, q_scale: float = 1.0):
    """dv=None builds the v=None (V = K) form. Logits stay O(1): q, k ~ N(0, 1), scale dk^-1/2."""
    def make(gen, dtype, device):
        t, s = sum(q_lens), sum(k_lens)
        inputs = {
            "q": randn(gen, t, hq, dk, dtype=dtype, device=device, scale=q_scale),
            "k": randn(gen, s, hkv, dk, dtype=dtype, device=device),
            "v": None if dv is None else randn(gen, s, hkv, dv, dtype=dtype, device=device),
            "cu_seqlens_q": _cu(q_lens, device),
            "cu_seqlens_k": _cu(k_lens, device),
            "scale": scale if scale is not None else 1.0 / math.sqrt(dk),
            "causal": causal,
            "window": window,
        }
        if sinks:
            inputs["sinks"] = randn(gen, hq, dtype=torch.float32, device=device, scale=2.0)
        if gate:
            inputs["gate"] = randn(gen, t, hq, dv or dk, dtype=dtype, device=device, scale=2.0)
        return inputs
    return make


ATTENTION = define_op(
    attention,
    cases=[
        # Qwen3.5 gated full attention (16 q / 2 kv heads x 256 scaled to 8 / 2 x 64); the last
        # sequence continues after 11 cached tokens.
        Case("qwen35_gqa4_gated", _varlen_case([9, 33, 1, 6], [9, 33, 1, 17], 8, 2, 64, 64, gate=True)),
        Case("minimax_gqa8_128", _varlen_case([96, 40], [96, 70], 8, 1, 128, 128)),
        # Gemma 4 sliding layer: scale 1.0 on normed q/k (inputs scaled so logits stay O(1)).
        Case("gemma4_sliding_w8", _varlen_case([30, 5, 12], [30, 21, 12], 4, 2, 32, 32, window=8,
                                               scale=1.0, q_scale=1.0 / math.sqrt(32))),
        Case("gemma4_sliding_long_prefix", _varlen_case([150, 3], [181, 40], 4, 2, 32, 32, window=24)),
        Case("gemma4_window1", _varlen_case([7, 3], [7, 9], 4, 4, 32, 32, window=1)),
        # Gemma 4 full layer at its real head dim: 512-wide K and V, V != K (k_eq_v shares the
        # projection, not the tensor), one KV head; the widest tile a GPU launches.
        Case("gemma4_full_512", _varlen_case([40, 9], [40, 20], 2, 1, 512, 512,
                                             scale=1.0, q_scale=1.0 / math.sqrt(512))),
        # DeepSeek-V4 pure sliding layer: one latent head that is key and value, window, sinks.
        Case("dsv4_swa_kv_shared_sinks", _varlen_case([20, 7], [20, 15], 8, 1, 64, None,
                                                      window=16, sinks=True)),
        # Kimi-Linear MLA non-absorbed: Dk = 128 + 64, Dv = 128, MHA.
        Case("kimi_mla_192_128", _varlen_case([13, 4], [13, 9], 4, 4, 192, 128)),
        # HY4 MLA (nope 192 + rope 64, v 256, scaled down): sinks and sigmoid output gate.
        Case("hy4_sinks_gate", _varlen_case([11, 5], [11, 5], 4, 4, 96, 64, sinks=True, gate=True)),
        # Vision-encoder style bidirectional attention, with an empty sequence in the middle.
        Case("noncausal_with_empty", _varlen_case([10, 0, 7], [10, 0, 7], 4, 2, 32, 32, causal=False)),
    ],
    tolerance=TOL,
    dtypes=DTYPES,
)

# The paged decode op shares validation and math with this module; importing it here declares
# it whenever the attention family is imported.
import hwinfer.ops.attention_paged  # noqa: E402,F401
