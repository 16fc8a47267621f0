"""Write small checkpoints in the published layouts, for tests and the embedded default model.

``write_checkpoint(arch, path, size="tiny", quant=None, shards=1, seed=0)`` writes config.json
(published field names), safetensors weights in the model's published layout (optionally FP8 /
FP4 quantized the way that architecture's releases are, optionally sharded with an index),
tokenizer.json + tokenizer_config.json (real byte-level BPE, ChatML template) and
generation_config.json. Everything is deterministic in ``seed``.

Per-architecture facts live in ``hwinfer/testing/tiny/<arch>.py``: ``config(size) -> dict`` (the
published config.json fields), ``QUANT: dict[str, dict]`` (quant name -> the release's
quantization_config), ``quant_scheme(key, quant) -> str | None`` (how that release stores one
tensor), optional ``init(model, gen)`` (special initialisation) and ``extra_tensors(config, gen)``.
Weights are stored in fp32 so fp32 oracle comparisons are exact.
"""
from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hwinfer.backend import fake_device, select
from hwinfer.loader.config import flatten_config, model_class
from hwinfer.ops.quant_pack import quantize_fp4, quantize_fp8_block
from hwinfer.testing.tokenizer_fixture import write_tokenizer

ARCHS = ("qwen3_5", "qwen3_5_moe", "deepseek_v4", "kimi_linear", "kimi_k3", "glm_moe_dsa", "hy_v4",
         "gemma4", "gemma4_moe", "minimax_m3")


def tiny_module(arch: str):
    if arch not in ARCHS:
        raise ValueError(f"no checkpoint writer for {arch!r}; known: {', '.join(ARCHS)}")
    return importlib.import_module(f"hwinfer.testing.tiny.{arch}")


def random_init(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Deterministic random weights that keep activations O(1) through the network (drawn on
    the generator's device, so real-size models initialise where they run). Large tensors are
    drawn a slice of their first dimension at a time (an fp32 draw of Kimi-K3's packed experts
    whole is 37 GiB). Packed FP4 bytes (uint8, two e2m1 codes a byte) get uniform random codes
    (RMS ~2.9) and their UE8M0 scale bytes (``*_scale``) the exponent that brings a row of
    ``32 x scale bytes`` inputs to ~1 / sqrt(fan_in)."""
    dev = gen.device
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dtype == torch.uint8:
                if leaf.endswith("_scale"):
                    fan_in = p.shape[-1] * 32
                    p.fill_(round(127 - math.log2(2.9) - 0.5 * math.log2(fan_in)))
                else:
                    for part in _slices(p):
                        part.copy_(torch.randint(0, 256, part.shape, generator=gen, device=dev,
                                                 dtype=torch.uint8))
                continue
            for part in _slices(p):
                if leaf == "A_log":
                    part.copy_(torch.log(torch.rand(part.shape, generator=gen, device=dev) * 7 + 1))
                elif leaf in ("dt_bias", "bias", "e_score_correction_bias"):
                    part.copy_(torch.randn(part.shape, generator=gen, device=dev) * 0.1)
                elif p.dim() == 1:
                    part.copy_(1.0 + torch.randn(part.shape, generator=gen, device=dev) * 0.1)
                else:
                    part.copy_(torch.randn(part.shape, generator=gen, device=dev) / math.sqrt(p.shape[-1]))


def _slices(p: torch.Tensor, limit: int = 1 << 26) -> list[torch.Tensor]:
    """p itself, or its slices along dim 0 when it has more than ``limit`` elements."""
    return list(p) if p.numel() > limit and p.dim() > 1 else [p]


def _quantize(tensor: torch.Tensor, scheme: str) -> dict[str, torch.Tensor]:
    """scheme: 'fp8_fp32' (e4m3 + fp32 weight_scale_inv), 'fp8_ue8m0' (e4m3 + e8m0 .scale),
    'fp4' (packed e2m1 int8 + e8m0 .scale per 32), 'mxfp4_ct' (compressed-tensors
    mxfp4-pack-quantized: uint8 .weight_packed + uint8 e8m0 .weight_scale per 32)."""
    if scheme == "fp8_fp32":
        q, s = quantize_fp8_block(tensor.float(), scale_format="fp32")
        return {"weight": q, "weight_scale_inv": s}
    if scheme == "fp8_ue8m0":
        q, s = quantize_fp8_block(tensor.float(), scale_format="ue8m0")
        return {"weight": q, "scale": s}
    if scheme == "fp4":
        q, s = quantize_fp4(tensor.float())
        return {"weight": q.view(torch.int8), "scale": s}
    if scheme == "mxfp4_ct":
        q, s = quantize_fp4(tensor.float())
        return {"weight_packed": q, "weight_scale": s.view(torch.uint8)}
    raise ValueError(f"unknown quantization scheme {scheme!r}")


def write_checkpoint(arch: str, path: str | Path, *, size: str = "tiny", quant: str | None = None,
                     shards: int = 1, seed: int = 0, overrides: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint for ``arch`` into ``path`` (see module docstring); returns the path."""
    tiny = tiny_module(arch)
    config = {**tiny.config(size), **(overrides or {})}
    schemes = getattr(tiny, "QUANT", {})
    if quant is not None and quant not in schemes:
        raise ValueError(f"{arch} checkpoints are not released with quant={quant!r}; known: {sorted(schemes)}")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    ops = select(fake_device("cpu"))
    flat = flatten_config(config)
    model = model_class(flat)(flat, ops, torch.float32)
    random_init(model, gen)
    if hasattr(tiny, "init"):
        tiny.init(model, gen)
    layout = model.layouts()[0]
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    tensors: dict[str, torch.Tensor] = {}
    for key, entry in layout.entries.items():
        value = params[entry.param]
        value = (value[entry.index] if entry.index is not None else value).detach().clone().contiguous()
        scheme = tiny.quant_scheme(key, quant) if quant and entry.quantizable else None
        if scheme is None:
            tensors[key] = value
            continue
        stem = key[: -len(".weight")]
        for suffix, t in _quantize(value, scheme).items():
            tensors[f"{stem}.{suffix}"] = t
    for key, t in getattr(tiny, "extra_tensors", lambda c, g: {})(config, gen).items():
        tensors[key] = t
    if quant:
        config["quantization_config"] = tiny.QUANT[quant]
    _save(tensors, root, shards)
    special = write_tokenizer(root, min(flat["vocab_size"], 512))
    eos = special["<|im_end|>"]
    config.setdefault("eos_token_id", eos)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [eos, special["<|endoftext|>"]], "do_sample": True, "temperature": 0.7,
         "top_p": 0.9, "top_k": 20}, indent=2))
    return root


def _save(tensors: dict[str, torch.Tensor], root: Path, shards: int) -> None:
    if shards <= 1:
        save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
        return
    keys = list(tensors)
    per = -(-len(keys) // shards)
    weight_map = {}
    for i in range(shards):
        part = keys[i * per:(i + 1) * per]
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, str(root / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
