"""config.json and generation_config.json: reading, the architecture registry, quantization.

Published configs and transformers' ``save_pretrained`` configs spell some fields differently;
each model's config class accepts both. Vision-language configs (Qwen3.5, Gemma 4, MiniMax-M3)
carry the language model under ``text_config``: it is merged over the top level, whose
``quantization_config`` and ``tie_word_embeddings`` still apply.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


# model_type -> "module:Class" of the model file that implements it.
ARCHITECTURES: dict[str, str] = {
    "qwen3_5": "hwinfer.models.qwen3_5:Qwen3_5ForCausalLM",
    "qwen3_5_text": "hwinfer.models.qwen3_5:Qwen3_5ForCausalLM",
    "qwen3_5_moe": "hwinfer.models.qwen3_5:Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "hwinfer.models.qwen3_5:Qwen3_5ForCausalLM",
    "deepseek_v4": "hwinfer.models.deepseek_v4:DeepseekV4ForCausalLM",
    "kimi_linear": "hwinfer.models.kimi_linear:KimiLinearForCausalLM",
    "kimi_k3": "hwinfer.models.kimi_k3:KimiK3ForCausalLM",
    "glm_moe_dsa": "hwinfer.models.glm5:GlmMoeDsaForCausalLM",
    "deepseek_v32": "hwinfer.models.deepseek_v32:DeepseekV32ForCausalLM",
    "hy_v4": "hwinfer.models.hy_v4:HYV4ForCausalLM",
    "gemma4": "hwinfer.models.gemma4:Gemma4ForCausalLM",
    "gemma4_text": "hwinfer.models.gemma4:Gemma4ForCausalLM",
    "minimax_m3_vl": "hwinfer.models.minimax_m3:MiniMaxM3ForCausalLM",
    "minimax_m3_vl_text": "hwinfer.models.minimax_m3:MiniMaxM3ForCausalLM",
}


class ConfigError(ValueError):
    """config.json is missing, unreadable, or describes something hwinfer cannot run."""


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None


def load_config(path: str | Path) -> dict[str, Any]:
    """The model's config as one flat dict (text_config merged for VLM checkpoints). ``path``:
    a checkpoint directory, a config.json file, or a preset name (:mod:`hwinfer.presets`) when
    no such path exists."""
    root = Path(path)
    if not root.exists():
        from hwinfer.presets import preset_path

        root = preset_path(str(path)) or root
    raw = read_json(root / "config.json" if root.is_dir() else root)
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ConfigError(f"{root}: config.json has no model_type")
    return flatten_config(raw)


def flatten_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Merge a VLM config's ``text_config`` over its top level (see module docstring)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return dict(raw)
    merged = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
    merged.update(text)
    merged["model_type"] = raw["model_type"]
    merged["text_model_type"] = text.get("model_type")
    for key in ("quantization_config", "tie_word_embeddings"):
        if key in raw and key not in text:
            merged[key] = raw[key]
    return merged


def model_class(config: dict[str, Any]):
    """The hwinfer model class for ``config['model_type']`` (clear error when unknown)."""
    model_type = config.get("model_type")
    target = ARCHITECTURES.get(model_type)
    if target is None:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ConfigError(f"unknown model_type {model_type!r}; hwinfer supports: {known}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None


def load_generation_config(path: str | Path, config: dict[str, Any]) -> GenerationDefaults:
    """generation_config.json when present (eos ids, sampling defaults), else config.json's ids."""
    root = Path(path)
    gen_path = root / "generation_config.json"
    gen = read_json(gen_path) if gen_path.exists() else {}
    eos = gen.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    return GenerationDefaults(
        eos_token_ids=eos_ids,
        bos_token_id=gen.get("bos_token_id", config.get("bos_token_id")),
        temperature=float(gen.get("temperature", 1.0)) if gen.get("do_sample", True) else 0.0,
        top_p=float(gen.get("top_p", 1.0)),
        top_k=int(gen.get("top_k", 0) or 0),
        max_new_tokens=gen.get("max_new_tokens"),
    )


SUPPORTED_QUANT = "fp8 (e4m3, 128x128 blocks, UE8M0 or fp32 scales; FP4 experts), compressed-tensors mxfp4-pack-quantized"


def check_quantization(config: dict[str, Any]) -> str | None:
    """The checkpoint's quantization method, or None; an unsupported one is a clear error."""
    q = config.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method == "fp8":
        fmt = q.get("fmt", "e4m3")
        block = q.get("weight_block_size", [128, 128])
        if fmt != "e4m3" or list(block) != [128, 128]:
            raise ConfigError(f"unsupported fp8 quantization (fmt={fmt}, weight_block_size={block}); "
                              f"supported: {SUPPORTED_QUANT}")
        return "fp8"
    if method == "compressed-tensors":
        formats = {g.get("format") for g in (q.get("config_groups") or {}).values()} | {q.get("format")}
        formats.discard(None)
        if formats <= {"mxfp4-pack-quantized"}:
            return "mxfp4"
        raise ConfigError(f"unsupported compressed-tensors format(s) {sorted(formats)}; supported: {SUPPORTED_QUANT}")
    raise ConfigError(f"unsupported quantization method {method!r}; supported: {SUPPORTED_QUANT}")


def require(config: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` present in config (published or transformers spelling)."""
    for name in names:
        if name in config and config[name] is not None:
            return config[name]
    raise ConfigError(f"config.json lacks {' / '.join(names)}")
