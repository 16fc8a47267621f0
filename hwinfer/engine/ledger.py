"""The memory ledger: what one request costs in cache memory, per layer kind, from the cache
declarations alone (``model.cache_specs()``, see :mod:`hwinfer.cache.spec`).

The model class is built on the meta device (no weights, no memory), so a published config.json
or a preset name is enough. Per layer kind the ledger gives, in bytes:

* ``bytes_per_token``: paged rows (``per="token"``), a row of ratio ``r`` counting 1/r per token;
* ``fixed_bytes_per_request``: ring rows, per-request state, and the ``window`` rows of a
  sliding-window layer's per-token tensors (only those are ever read);
* ``total_bytes`` at a context of ``N`` tokens: ``bytes_per_token * N + fixed_bytes_per_request``;
* ``decode_entries``: cached rows one decode step attends in one layer of that kind at ``N``.

``kv_format`` picks the row size (:data:`LEDGER_FORMATS`): ``"deployed"`` (the default) is each
architecture's deployed format (the FP8 row a layer declares in ``fp8_row_bytes``, else the
declared dtype, i.e. the model dtype for KV and fp32 for recurrent and compressor state);
``"auto"`` is what ``load_model`` allocates by default, the model dtype's rows (as ``"bf16"``
for bf16 models; the ledger's default was called ``auto`` until it meant two things);
``"bf16"`` ignores the FP8 rows; ``"fp8"`` also stores
undeclared model-dtype KV rows (token and ring tensors) as one e4m3 byte per value. Rows that
``shared_with`` another tensor are not stored in either format. ``pool_*`` report what
hwinfer's own cache pool allocates for the model as built (declared dtypes, or the packed rows a
model declares when its ``kv_format`` is ``"fp8"``, see :meth:`hwinfer.models.base.CausalLM.set_kv_format`;
V stored even where it is derived from K).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

# KV_FORMATS lives with the cache declarations (allocation validates the same names); kept here too.
from hwinfer.cache.spec import (  # noqa: F401
    KV_FORMATS, LEDGER_FORMATS, CacheTensor, check_kv_format,
)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# model_type -> the model_type whose class has the same cache geometry, for configs that hwinfer
# cannot load yet but whose cache the ledger can still count (text stack as in the target).
LEDGER_ONLY: dict[str, str] = {
    # Gemma 4 12B ("unified"): Gemma 4's text attention without PLE / MoE (transformers 5.23
    # Gemma4UnifiedTextAttention subclasses Gemma4TextAttention).
    "gemma4_unified": "gemma4",
    "gemma4_unified_text": "gemma4_text",
}


@dataclass
class KindRow:
    """One layer kind: how many layers, their bytes together, entries attended per layer."""

    kind: str
    layers: list[int]
    bytes_per_token: float
    fixed_bytes_per_request: int
    total_bytes: int
    decode_entries: int | None
    tensors: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.layers)


@dataclass
class Ledger:
    """A model's per-request cache memory at ``context`` tokens (bytes; see module docstring)."""

    model: str
    model_type: str
    context: int
    kv_format: str
    bytes_per_token: float
    fixed_bytes_per_request: int
    total_bytes: int
    pool_bytes_per_token: float
    pool_fixed_bytes_per_request: int
    kinds: list[KindRow]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for row, kind in zip(out["kinds"], self.kinds):
            row["count"] = kind.count
        return out


def row_bytes(spec: CacheTensor, kv_format: str, model_dtype: torch.dtype) -> int:
    """Bytes of one stored row of ``spec`` in ``kv_format`` (0 if another tensor's row serves)."""
    check_kv_format(kv_format, LEDGER_FORMATS)
    if spec.shared_with is not None:
        return 0
    if kv_format in ("deployed", "fp8") and spec.fp8_row_bytes is not None:
        return spec.fp8_row_bytes
    if spec.dtype != model_dtype:
        return spec.row_bytes
    if kv_format == "fp8" and spec.per != "request":
        per_value = 1
    else:   # "auto": the model dtype's bytes (2 for bf16 models, as "bf16" and "deployed")
        per_value = model_dtype.itemsize if kv_format == "auto" else 2
    return math.prod(spec.shape) * per_value


def spec_bytes(spec: CacheTensor, kv_format: str, model_dtype: torch.dtype) -> tuple[float, int]:
    """(bytes per token, fixed bytes per request) of one declared tensor."""
    size = row_bytes(spec, kv_format, model_dtype)
    if spec.per == "token" and spec.window is not None:
        return 0.0, spec.window * size
    if spec.per == "token":
        return size / spec.ratio, 0
    return 0.0, size * (spec.rows if spec.per == "ring" else 1)


def model_dtype(config: dict[str, Any]) -> torch.dtype:
    """The checkpoint's compute dtype (``torch_dtype`` / ``dtype``), bf16 when absent."""
    return _DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), torch.bfloat16)


def build_meta_model(config: dict[str, Any]) -> nn.Module:
    """The hwinfer model for ``config`` (flattened), built on the meta device: no weights."""
    from hwinfer.backend import fake_device, select
    from hwinfer.loader.config import model_class

    cfg = dict(config)
    if cfg.get("model_type") in LEDGER_ONLY:
        cfg["model_type"] = LEDGER_ONLY[cfg["model_type"]]
    ops = select(fake_device("cpu"))
    with torch.device("meta"):
        return model_class(cfg)(cfg, ops, model_dtype(cfg))


def _mixer(layer: nn.Module) -> nn.Module | None:
    """The layer's token mixer: its first child that declares ``decode_entries``."""
    return next((m for m in layer.children() if hasattr(m, "decode_entries")), None)


def kind_name(mixer: nn.Module | None) -> str:
    """A short name for a layer kind (``C4``, ``sliding window``, ``KDA (linear)``, ...)."""
    if mixer is None:
        return "other"
    cls = type(mixer).__name__
    if cls == "DeepseekV4Attention":
        return "sliding window" if not mixer.ratio else f"C{mixer.ratio} ({'CSA' if mixer.indexer else 'HCA'})"
    if cls == "MLAttention":
        return "MLA + DSA (" + ("own indexer" if mixer.indexer is not None else "shared selection") + ")"
    if cls == "Gemma4Attention":
        return ("sliding window" if mixer.window else "global") + (" (KV shared)" if mixer.shared else "")
    if cls == "MiniMaxM3Attention":
        return "block-sparse" if mixer.indexer is not None else "full attention"
    names = {"KimiDeltaAttention": "KDA (linear)", "GatedDeltaNet": "Gated DeltaNet (linear)",
             "KimiMLA": "MLA (full)", "GatedAttention": "full attention"}
    return names.get(cls, cls)


def compute(model: nn.Module, *, context: int, kv_format: str = "deployed", name: str = "",
            dtype: torch.dtype | None = None) -> Ledger:
    """The ledger of a built model (meta device is fine) at ``context`` tokens."""
    if context < 1:
        raise ValueError(f"context must be >= 1 token, got {context}")
    dtype = dtype or getattr(model, "dtype", torch.bfloat16)
    layers = list(getattr(model, "layers", []))
    rows: dict[str, KindRow] = {}
    pool_token, pool_fixed = 0.0, 0
    for i, specs in enumerate(model.cache_specs()):
        mixer = _mixer(layers[i]) if i < len(layers) else None
        if not specs and mixer is None:
            continue
        kind = kind_name(mixer)
        row = rows.setdefault(kind, KindRow(kind, [], 0.0, 0, 0, None))
        row.layers.append(i)
        row.decode_entries = mixer.decode_entries(context) if mixer is not None else None
        for spec in specs:
            per_token, fixed = spec_bytes(spec, kv_format, dtype)
            row.bytes_per_token += per_token
            row.fixed_bytes_per_request += fixed
            t = row.tensors.setdefault(spec.name, {"bytes_per_token": 0.0, "fixed_bytes_per_request": 0})
            t["bytes_per_token"] += per_token
            t["fixed_bytes_per_request"] += fixed
            pool_token += spec.bytes_per_token()
            pool_fixed += spec.fixed_bytes()
    for row in rows.values():
        row.total_bytes = round(row.bytes_per_token * context) + row.fixed_bytes_per_request
    kinds = list(rows.values())
    per_token = sum(r.bytes_per_token for r in kinds)
    fixed = sum(r.fixed_bytes_per_request for r in kinds)
    config = getattr(model, "config", {}) or {}
    return Ledger(name, str(config.get("model_type", "")), context, kv_format, per_token, fixed,
                  round(per_token * context) + fixed, pool_token, pool_fixed, kinds)


def ledger(model_or_config: str | Path | dict[str, Any], *, context: int, kv_format: str = "deployed") -> Ledger:
    """The ledger of a checkpoint directory, a config.json path, a preset name, or a config dict."""
    from hwinfer.loader.config import ConfigError, flatten_config, load_config
    from hwinfer.presets import resolve

    if isinstance(model_or_config, dict):
        config, name = flatten_config(model_or_config), str(model_or_config.get("model_type", ""))
    else:
        try:
            config, name = load_config(resolve(model_or_config)), str(model_or_config)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    model = build_meta_model(config)
    led = compute(model, context=context, kv_format=kv_format, name=name, dtype=model_dtype(config))
    led.model_type = str(config.get("model_type", led.model_type))
    return led


def parse_context(text: str | int) -> int:
    """``131072``, ``128K`` / ``128k`` (x1024) or ``1M`` (x1024^2) -> tokens."""
    if isinstance(text, int):
        return text
    s = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2}.get(s[-1:], 1)
    number = s[:-1] if scale > 1 else s
    try:
        return int(float(number) * scale)
    except ValueError:
        raise ValueError(f"context {text!r} is not a token count (e.g. 8192, 128K, 1M)") from None


KB, MB, GB = 1024, 1024 ** 2, 1024 ** 3


def format_table(led: Ledger) -> str:
    """The ledger as a text table; binary units (KB = 1024 B, MB = 1024^2 B, GB = 1024^3 B)."""
    head = (f"{led.model} ({led.model_type}): cache per request at {led.context:,} tokens, "
            f"kv format {led.kv_format}\nunits: KB = 1024 B, MB = 1024^2 B, GB = 1024^3 B\n")
    cols = f"{'layer kind':<30} {'layers':>6} {'KB/token':>10} {'fixed MB':>10} {'total GB':>10}  entries/decode step/layer"
    lines = [head, cols, "-" * len(cols)]
    for row in led.kinds:
        entries = "-" if row.decode_entries is None else f"{row.decode_entries:,}"
        lines.append(f"{row.kind:<30} {row.count:>6} {row.bytes_per_token / KB:>10.2f} "
                     f"{row.fixed_bytes_per_request / MB:>10.2f} {row.total_bytes / GB:>10.3f}  {entries}")
    lines.append("-" * len(cols))
    layers = sum(row.count for row in led.kinds)
    lines.append(f"{'all':<30} {layers:>6} {led.bytes_per_token / KB:>10.2f} "
                 f"{led.fixed_bytes_per_request / MB:>10.2f} {led.total_bytes / GB:>10.3f}")
    lines.append(f"\nhwinfer's cache pool today (declared dtypes, V stored apart even where derived from K): "
                 f"{led.pool_bytes_per_token / KB:.2f} KB/token, {led.pool_fixed_bytes_per_request / MB:.2f} MB fixed")
    return "\n".join(lines)


def presets_markdown(kv_format: str = "deployed") -> str:
    """Every preset's ledger at 8K, 128K and 1M tokens as a Markdown table (docs/ledger.md)."""
    from hwinfer.presets import preset_names

    from hwinfer.loader.config import load_config

    lines = ["| preset | max context | layer kinds (count) | KB/token | fixed MB | total at 8K (MB) "
             "| at 128K (GB) | at 1M (GB) | entries per decode step per layer at 1M |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name in preset_names():
        config = load_config(name)
        window = config.get("max_position_embeddings") or config.get("model_max_length")
        led = {n: ledger(name, context=n, kv_format=kv_format) for n in (8 * KB, 128 * KB, MB)}
        big = led[MB]
        kinds = ", ".join(f"{row.kind} ({row.count})" for row in big.kinds)
        entries = ", ".join(f"{row.kind}: {row.decode_entries:,}" for row in big.kinds)
        lines.append(f"| `{name}` | {window:,} | {kinds} | {big.bytes_per_token / KB:.2f} | "
                     f"{big.fixed_bytes_per_request / MB:.2f} | {led[8 * KB].total_bytes / MB:.1f} | "
                     f"{led[128 * KB].total_bytes / GB:.2f} | {big.total_bytes / GB:.2f} | {entries} |")
    return "\n".join(lines) + "\n"
