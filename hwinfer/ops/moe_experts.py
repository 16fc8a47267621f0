"""Routed-expert FFN contracts (family ``moe``): dense, FP8-block and FP4 expert weights.
Routing is in :mod:`hwinfer.ops.moe`, Kimi-K3's latent MoE in :mod:`hwinfer.ops.moe_latent`;
shared experts are a dense MLP of the layer, not part of these ops.

Layout (transformers' fused experts and the published per-expert checkpoints, MODELS.md §9.1):
``w13 [E, 2I, H]`` = rows of ``w1`` (gate) then rows of ``w3`` (up), ``w2 [E, H, I]``. The
activations and the clamp are defined in :func:`moe_experts`'s docstring (the contract text).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hwinfer.ops.contract import Case, Tol, define_op, fan_in_scale, randn
from hwinfer.ops.quant import as_bytes, dequant_fp4, dequant_fp8_block
from hwinfer.ops.quant_pack import quantize_fp4, quantize_fp8_block

ACTIVATIONS = ("swiglu", "swiglu_oai", "situ", "gelu_tanh")


def check_activation(activation: str, limit: float | None, situ_beta: float,
                     situ_linear_beta: float | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, not {activation!r}")
    if limit is not None and not limit > 0:
        raise ValueError(f"limit must be positive or None, got {limit}")
    if not situ_beta > 0 or (situ_linear_beta is not None and not situ_linear_beta > 0):
        raise ValueError(f"situ_beta / situ_linear_beta must be positive, got {situ_beta}, "
                         f"{situ_linear_beta}")


def glu(gate_up: torch.Tensor, activation: str = "swiglu", limit: float | None = None,
        swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
        situ_linear_beta: float | None = None) -> torch.Tensor:
    """The gated activation on fp32 ``[..., 2I]`` (gate half first) -> ``[..., I]`` (see moe_experts)."""
    gate, up = gate_up.chunk(2, dim=-1)
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    if activation == "swiglu":
        return F.silu(gate) * up
    if activation == "swiglu_oai":
        return (up + 1.0) * gate * torch.sigmoid(swiglu_alpha * gate)
    if activation == "situ":
        if situ_linear_beta is not None:
            up = situ_linear_beta * torch.tanh(up / situ_linear_beta)
        return situ_beta * torch.tanh(gate / situ_beta) * torch.sigmoid(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"activation must be one of {ACTIVATIONS}, not {activation!r}")


def check_routing(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                  op: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [T, H], got shape {tuple(x.shape)}")
    if weights.dim() != 2 or tuple(ids.shape) != tuple(weights.shape) or weights.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: weights and ids must both be [T={x.shape[0]}, k], got "
                         f"{tuple(weights.shape)} and {tuple(ids.shape)}")
    if ids.is_floating_point():
        raise ValueError(f"{op}: ids must be an integer tensor, not {ids.dtype}")
    if ids.numel() and not (int(ids.min()) >= -1 and int(ids.max()) < num_experts):
        raise ValueError(f"{op}: expert ids must lie in [0, {num_experts}) or be -1 (skipped)")


def check_expert_shapes(h: int, w13_shape, w2_shape, op: str, packed: int = 1) -> tuple[int, int]:
    """(E, I) from w13 [E, 2I, H/packed] and w2 [E, H, I/packed]; ValueError on mismatch."""
    if len(w13_shape) != 3 or len(w2_shape) != 3 or w13_shape[1] % 2:
        raise ValueError(f"{op}: w13 must be [E, 2I, H] and w2 [E, H, I], got {tuple(w13_shape)}, "
                         f"{tuple(w2_shape)}")
    e, i = w13_shape[0], w13_shape[1] // 2
    if tuple(w13_shape) != (e, 2 * i, h // packed) or tuple(w2_shape) != (e, h, i // packed):
        raise ValueError(f"{op}: w13 {tuple(w13_shape)} / w2 {tuple(w2_shape)} do not fit H={h} "
                         f"(expected [E, 2I, {h // packed}] and [E, {h}, I/{packed}])")
    return e, i


def experts_loop(x32: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                 w2: torch.Tensor, act: dict) -> torch.Tensor:
    """Per-token, per-slot fp32 evaluation of the routed sum (the obvious form)."""
    out = torch.zeros(x32.shape[0], w2.shape[1], dtype=torch.float32, device=x32.device)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            h = glu(w13[e].float() @ x32[t], **act)
            out[t] += weights[t, j].float() * (w2[e].float() @ h)
    return out


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, *, activation: str = "swiglu", limit: float | None = None,
                swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                situ_linear_beta: float | None = None) -> torch.Tensor:
    """Routed experts, dense weights: ``y_t = sum_j weights[t,j] * W2_e glu(W13_e x_t)``, e = ids[t,j].

    Shapes: x [T, H]; weights [T, k] (fp32 from the router); ids [T, k] int32/int64 in [0, E),
    or -1 = skipped (padding, experts owned by another rank); w13 [E, 2I, H] (gate rows then up
    rows; HF ``experts.gate_up_proj``); w2 [E, H, I] (HF ``experts.down_proj``). Everything in
    fp32 (x and weights upcast, the activation not rounded — transformers rounds it in bf16
    runs), cast once to x.dtype. Returns [T, H].

    ``glu`` on ``[gate | up] = W13_e x`` (fp32). First, if ``limit`` is set (any activation):
    ``gate = min(gate, limit)`` (from above only), ``up = clamp(up, -limit, limit)`` —
    DeepSeek-V4's / HY4's / GLM-5.3's ``swiglu_limit`` 10, MiniMax-M3's 7 (§2.8, §5). Then:

    * ``"swiglu"``: ``silu(gate) * up`` — Qwen3.5, Kimi-Linear, GLM-5 (no limit), DeepSeek-V4,
      HY4, GLM-5.3 (limit 10).
    * ``"swiglu_oai"``: ``(up + 1) * gate * sigmoid(swiglu_alpha * gate)`` — MiniMax-M3
      (``swiglu_alpha`` 1.702, ``swiglu_limit`` 7; as transformers' ``MiniMaxM3VLExperts``).
    * ``"situ"`` (Kimi-K3 SiTU-GLU): ``situ_beta * tanh(gate / situ_beta) * sigmoid(gate) * u``,
      ``u = situ_linear_beta * tanh(up / situ_linear_beta)`` if ``situ_linear_beta`` is set else
      ``up``. K3 config: ``hidden_act: "situ"``, ``activation_situ_beta`` 4.0,
      ``activation_situ_linear_beta`` 25.0, no clamp. Not in transformers: this is the
      ``SituAndMul`` module as it appears, identically and in fp32, in several public K3 ports
      (SGLang, vLLM-based, torchtitan, Paddle, a transcription of Moonshot's remote code). A ROCm
      kernel family ("SiTUv2") also clamps like SwiGLU; ``limit`` allows that, but it is not
      known to be what K3 does.
    * ``"gelu_tanh"``: ``gelu_tanh(gate) * up`` — Gemma 4 (``gelu_pytorch_tanh``).
    """
    check_activation(activation, limit, situ_beta, situ_linear_beta)
    e, _ = check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts")
    check_routing(x, weights, ids, e, "moe_experts")
    act = dict(activation=activation, limit=limit, swiglu_alpha=swiglu_alpha, situ_beta=situ_beta,
               situ_linear_beta=situ_linear_beta)
    return experts_loop(x.float(), weights, ids, w13, w2, act).to(x.dtype)


def fp8_w13_grid(i: int, h: int, block: tuple[int, int]) -> tuple[int, int]:
    """w13's scale grid: gate's and up's own grids stacked, ``[2 * ceil(I/b0), ceil(H/b1)]``."""
    return 2 * math.ceil(i / block[0]), math.ceil(h / block[1])


def dequant_w13_fp8(w13: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """[..., 2I, H] e4m3 + stacked grids -> fp32; gate and up halves dequantized separately."""
    i, g = w13.shape[-2] // 2, scale.shape[-2] // 2
    gate = dequant_fp8_block(w13[..., :i, :], scale[..., :g, :], block=block)
    up = dequant_fp8_block(w13[..., i:, :], scale[..., g:, :], block=block)
    return torch.cat([gate, up], dim=-2)


def moe_experts_fp8(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                    block: tuple[int, int] = (128, 128), activation: str = "swiglu",
                    limit: float | None = None, swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                    situ_linear_beta: float | None = None) -> torch.Tensor:
    """Routed experts with block-scaled FP8 weights; equals :func:`moe_experts` (same x, weights,
    ids and activation options) on the fp32 dequantized weights
    (:func:`hwinfer.ops.quant.dequant_fp8_block`).

    w13 [E, 2I, H] e4m3 (or bytes as uint8); w13_scale [E, 2*ceil(I/b0), ceil(H/b1)]: the gate's
    grid then the up's grid, as the per-expert checkpoint tensors ``w1``/``w3`` (or
    ``gate_proj``/``up_proj``) carry them — so a tile never straddles gate and up, and when
    I % b0 == 0 this is the plain grid of the fused [2I, H] tensor. w2 [E, H, I] e4m3;
    w2_scale [E, ceil(H/b0), ceil(I/b1)]. Scales fp32 or UE8M0 (e8m0fnu / uint8). Models: FP8
    releases of Qwen3.5-MoE, GLM-5, MiniMax-M3 (fp32 ``weight_scale_inv``, block [128, 128]).
    Returns [T, H] in x.dtype.
    """
    check_activation(activation, limit, situ_beta, situ_linear_beta)
    e, i = check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts_fp8")
    want13 = (e, *fp8_w13_grid(i, x.shape[-1], block))
    want2 = (e, math.ceil(x.shape[-1] / block[0]), math.ceil(i / block[1]))
    if tuple(w13_scale.shape) != want13 or tuple(w2_scale.shape) != want2:
        raise ValueError(f"moe_experts_fp8: scales {tuple(w13_scale.shape)}, {tuple(w2_scale.shape)} "
                         f"!= {want13}, {want2}")
    check_routing(x, weights, ids, e, "moe_experts_fp8")
    act = dict(activation=activation, limit=limit, swiglu_alpha=swiglu_alpha, situ_beta=situ_beta,
               situ_linear_beta=situ_linear_beta)
    w13_32 = dequant_w13_fp8(w13, w13_scale, block)
    w2_32 = dequant_fp8_block(w2, w2_scale, block=block)
    return experts_loop(x.float(), weights, ids, w13_32, w2_32, act).to(x.dtype)


def moe_experts_fp4(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                    activation: str = "swiglu", limit: float | None = None,
                    swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                    situ_linear_beta: float | None = None) -> torch.Tensor:
    """Routed experts with packed FP4 weights; equals :func:`moe_experts` (same x, weights, ids
    and activation options) on the fp32 dequantized weights (:func:`hwinfer.ops.quant.dequant_fp4`).

    w13 [E, 2I, H/2] int8/uint8 (low nibble = even column), w13_scale [E, 2I, H/32] UE8M0;
    w2 [E, H, I/2], w2_scale [E, H, I/32]. H and I multiples of 32. DeepSeek-V4 routed experts
    (``expert_dtype: fp4``; per-expert ``w1``/``w3`` stacked as gate rows then up rows) with
    ``activation="swiglu", limit=10``; Kimi-K3 (compressed-tensors ``weight_packed`` /
    ``weight_scale``, same bytes) through :func:`latent_moe`. Returns [T, H] in x.dtype.
    """
    check_activation(activation, limit, situ_beta, situ_linear_beta)
    h = x.shape[-1]
    e, i = check_expert_shapes(h, w13.shape, w2.shape, "moe_experts_fp4", packed=2)
    if h % 32 or i % 32:
        raise ValueError(f"moe_experts_fp4: H={h} and I={i} must be multiples of 32 (scale groups)")
    if tuple(w13_scale.shape) != (e, 2 * i, h // 32) or tuple(w2_scale.shape) != (e, h, i // 32):
        raise ValueError(f"moe_experts_fp4: scales {tuple(w13_scale.shape)}, {tuple(w2_scale.shape)} "
                         f"!= {(e, 2 * i, h // 32)}, {(e, h, i // 32)}")
    check_routing(x, weights, ids, e, "moe_experts_fp4")
    act = dict(activation=activation, limit=limit, swiglu_alpha=swiglu_alpha, situ_beta=situ_beta,
               situ_linear_beta=situ_linear_beta)
    w13_32, w2_32 = dequant_fp4(w13, w13_scale), dequant_fp4(w2, w2_scale)
    return experts_loop(x.float(), weights, ids, w13_32, w2_32, act).to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Cases. Routing tensors as a router emits them: k distinct experts per token, positive fp32
# weights; ``pad`` marks some slots (and one whole token) -1.


def routing_inputs(gen: torch.Generator, t: int, e: int, k: int, device: torch.device,
                   pad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=gen) + 0.1
    w = w / w.sum(dim=-1, keepdim=True)
    if pad:
        ids[::3, -1] = -1
        ids[-1] = -1
    return w.to(device), ids.to(device)


def expert_weights(gen: torch.Generator, e: int, i: int, h: int, gate_scale: float, up_scale: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 CPU (w13, w2) keeping |gate| ~ gate_scale and |up| ~ up_scale for unit-variance x."""
    w13 = torch.randn(e, 2 * i, h, generator=gen) * fan_in_scale(h)
    w13[:, :i] *= gate_scale
    w13[:, i:] *= up_scale
    return w13, torch.randn(e, h, i, generator=gen) * fan_in_scale(i)


def _dense_case(t, e, k, h, i, act, gate_scale=1.0, up_scale=1.0, pad=False):
    def make(gen, dtype, device):
        weights, ids = routing_inputs(gen, t, e, k, device, pad)
        w13, w2 = expert_weights(gen, e, i, h, gate_scale, up_scale)
        return {"x": randn(gen, t, h, dtype=dtype, device=device), "weights": weights, "ids": ids,
                "w13": w13.to(device=device, dtype=dtype), "w2": w2.to(device=device, dtype=dtype), **act}
    return make


def _fp8_case(t, e, k, h, i, act, scale_format, gate_scale=1.0):
    def make(gen, dtype, device):
        weights, ids = routing_inputs(gen, t, e, k, device)
        w13, w2 = expert_weights(gen, e, i, h, gate_scale, 1.0)
        gate_q, gate_s = quantize_fp8_block(w13[:, :i], scale_format=scale_format)
        up_q, up_s = quantize_fp8_block(w13[:, i:], scale_format=scale_format)
        w2_q, w2_s = quantize_fp8_block(w2, scale_format=scale_format)
        w13_q, w13_s = torch.cat([gate_q, up_q], dim=1), torch.cat([gate_s, up_s], dim=1)
        return {"x": randn(gen, t, h, dtype=dtype, device=device), "weights": weights, "ids": ids,
                "w13": w13_q.to(device), "w13_scale": w13_s.to(device),
                "w2": w2_q.to(device), "w2_scale": as_bytes(w2_s).to(device),
                "block": (128, 128), **act}
    return make


def fp4_expert_inputs(gen: torch.Generator, e: int, i: int, h: int, device: torch.device,
                      gate_scale: float = 1.0, up_scale: float = 1.0) -> dict:
    w13, w2 = expert_weights(gen, e, i, h, gate_scale, up_scale)
    (p13, s13), (p2, s2) = quantize_fp4(w13), quantize_fp4(w2)
    return {"w13": p13.to(device), "w13_scale": s13.to(device),
            "w2": p2.to(device), "w2_scale": as_bytes(s2).to(device)}


def _fp4_case(t, e, k, h, i, act, gate_scale=1.0, up_scale=1.0, int8=False):
    def make(gen, dtype, device):
        weights, ids = routing_inputs(gen, t, e, k, device)
        ex = fp4_expert_inputs(gen, e, i, h, device, gate_scale, up_scale)
        if int8:  # DeepSeek-V4 ships the packed bytes as int8
            ex["w13"], ex["w2"] = ex["w13"].view(torch.int8), ex["w2"].view(torch.int8)
        return {"x": randn(gen, t, h, dtype=dtype, device=device), "weights": weights, "ids": ids,
                **ex, **act}
    return make


SWIGLU_CLAMP = {"activation": "swiglu", "limit": 10.0}
SITU_K3 = {"activation": "situ", "situ_beta": 4.0, "situ_linear_beta": 25.0}
# fp32 atol 1e-4: the clamp cases drive |gate|, |up| to ~10 so terms reach O(100) and cancel;
# per-slot vs grouped summation order then moves small outputs by ~1e-5 absolute.
EXPERT_TOL = {torch.float32: Tol(1e-4, 1e-5), torch.bfloat16: Tol(1e-2, 1e-2)}

MOE_EXPERTS = define_op(
    moe_experts,
    cases=[
        Case("dsv4_swiglu_clamp", _dense_case(16, 16, 6, 128, 64, SWIGLU_CLAMP, 5.0, 5.0)),
        Case("qwen35_swiglu_top8", _dense_case(12, 32, 8, 128, 32, {"activation": "swiglu"})),
        Case("minimax_swiglu_oai", _dense_case(10, 8, 4, 96, 64, {"activation": "swiglu_oai", "limit": 7.0,
                                                                 "swiglu_alpha": 1.702}, 4.0, 4.0)),
        Case("k3_situ", _dense_case(10, 16, 4, 64, 48, SITU_K3, gate_scale=3.0, up_scale=20.0)),
        Case("gemma4_gelu_tanh", _dense_case(8, 8, 2, 64, 32, {"activation": "gelu_tanh"})),
        Case("padding_ids", _dense_case(9, 8, 3, 64, 32, {"activation": "swiglu"}, pad=True)),
    ],
    tolerance=EXPERT_TOL,
    family="moe",
)

MOE_EXPERTS_FP8 = define_op(
    moe_experts_fp8,
    cases=[
        Case("qwen35_fp32_scales", _fp8_case(8, 8, 4, 256, 128, {"activation": "swiglu"}, "fp32")),
        Case("partial_tiles_ue8m0_clamp", _fp8_case(6, 4, 2, 160, 96, SWIGLU_CLAMP, "ue8m0", 5.0)),
    ],
    tolerance=EXPERT_TOL,
    family="moe",
)

MOE_EXPERTS_FP4 = define_op(
    moe_experts_fp4,
    cases=[
        Case("dsv4_int8_swiglu_clamp", _fp4_case(12, 8, 6, 128, 64, SWIGLU_CLAMP, 5.0, 5.0, int8=True)),
        Case("k3_uint8_situ", _fp4_case(8, 8, 4, 64, 64, SITU_K3, 3.0, 20.0)),
    ],
    tolerance=EXPERT_TOL,
    family="moe",
)
