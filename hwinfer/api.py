"""``load_model(path, device=..., dtype=...)``: a published checkpoint, ready to generate."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

import torch

from hwinfer.backend import resolve_device, select
from hwinfer.cache.spec import check_kv_format
from hwinfer.layers.basic import bind_dense_ops
from hwinfer.loader.checkpoint import CheckpointError, CheckpointReader
from hwinfer.loader.config import (
    check_quantization, load_config, load_generation_config, model_class,
)
from hwinfer.loader.weights import Layout, load_into

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def _resolve_dtype(dtype: str | torch.dtype | None, config: dict, device_type: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        name = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
        # The CPU computes bf16 slowly and tests compare in fp32: default to fp32 there.
        return torch.float32 if device_type == "cpu" else _DTYPES.get(name, torch.bfloat16)
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def pick_layout(layouts: list[Layout], reader: CheckpointReader) -> Layout:
    """The declared layout that best explains the checkpoint: most keys found, fewest missing
    (the first declared wins ties, so the published layout is preferred)."""
    keys = set(reader.keys())

    def score(layout: Layout) -> int:
        hits = 0
        for key in layout.entries:
            stem = key[: -len(".weight")] if key.endswith(".weight") else key
            hits += key in keys or f"{stem}.weight_packed" in keys
        return 2 * hits - len(layout.entries)
    return max(layouts, key=score)


def load_model(path: str | Path, device: str = "auto", dtype: str | torch.dtype | None = None, *,
               impl: Mapping[str, str] | None = None, strict: bool = False,
               progress: bool | None = None, tensor_parallel: int = 1, expert_parallel: int = 1,
               kv_format: str = "auto"):
    """Load a checkpoint directory (config.json, *.safetensors, tokenizer.json, ...).

    ``device``: cpu, cuda[:N] (NVIDIA or AMD), xpu[:N], npu[:N] or auto. ``dtype``: the compute
    dtype (default: the checkpoint's on accelerators, fp32 on the CPU). ``impl`` / ``strict``:
    op selection overrides and strict mode (see :func:`hwinfer.backend.select`).
    Every problem (unknown architecture, missing or unexpected tensors, a shape mismatch, an
    unsupported quantization, a corrupt file, an absent device) raises a clear error.

    ``tensor_parallel=N`` > 1 shards the model over N processes, one per device (rank r on
    device index r, counted from ``device``'s; any N on the CPU), and returns rank 0's model in
    this process: generate, the engine and the server use it as usual; ``model.close()`` (or a
    ``with`` block, or the interpreter's exit) stops the other ranks. Under torchrun this process
    joins the job's rendezvous instead (N must equal WORLD_SIZE; ranks other than 0 serve rank 0
    and exit). ``expert_parallel``: 1, or N to spread MoE experts over the same ranks. See
    docs/parallel.md.

    ``kv_format``: how the caches the model allocates store KV rows: ``"auto"`` / ``"bf16"``
    (default: the compute dtype, as always) or ``"fp8"`` (DeepSeek-V4's packed ``fp8_ds_mla``
    rows; other models refuse it). See :meth:`hwinfer.models.base.CausalLM.set_kv_format`.
    """
    check_kv_format(kv_format)  # a bad name fails before anything is read
    if tensor_parallel != 1 or expert_parallel != 1:
        from hwinfer.parallel.driver import check_sizes, load_parallel

        if check_sizes(tensor_parallel, expert_parallel) != (1, 1):
            # Rank 0's cache declarations travel to the followers with each allocation.
            model = load_parallel(path, device, dtype, tensor_parallel=tensor_parallel,
                                  expert_parallel=expert_parallel, impl=impl, strict=strict)
            try:
                model.set_kv_format(kv_format)
            except ValueError:
                model.close()
                raise
            return model
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"checkpoint path {root} does not exist")
    start = time.perf_counter()
    config = load_config(root)
    cls = model_class(config)
    check_quantization(config)
    dev = resolve_device(device)
    ops = select(dev, impl=impl, strict=strict)
    compute_dtype = _resolve_dtype(dtype, config, dev.device_type)
    reader = CheckpointReader(root)
    with torch.device("meta"):
        model = cls(config, ops, compute_dtype)
    model.set_kv_format(kv_format)  # refuse an unsupported format before reading any weight
    model = model.to_empty(device="cpu")
    layout = pick_layout(model.layouts(), reader)
    for name in layout.without:
        setattr(model, name, None)
    dequant = {
        "fp8": lambda w, s: ops.dequant_fp8_block(w, s, out_dtype=torch.float32),
        "fp4": lambda w, s: ops.dequant_fp4(w, s, out_dtype=torch.float32),
    }
    report = load_into(model, reader, layout, dequant, progress=progress)
    model.post_load()
    bind_dense_ops(model, model.ops)
    model = model.to(dev.torch_device).eval()
    model.load_report = report
    model.load_seconds = time.perf_counter() - start
    model.checkpoint_bytes = reader.total_bytes
    model.layout_name = layout.name
    if (root / "tokenizer.json").exists():
        from hwinfer.tokenizer import Tokenizer

        model.tokenizer = Tokenizer(root)
    model.generation_defaults = load_generation_config(root, config)
    return model


def random_model(config_path: str | Path, device: str = "auto", dtype: str | torch.dtype | None = None,
                 *, seed: int = 0, impl: Mapping[str, str] | None = None, strict: bool = False,
                 kv_format: str = "auto"):
    """A model at the real dimensions of a config (a checkpoint directory, a config.json, or a
    preset name) with deterministic random weights: for benchmarks without the weights. It has
    no tokenizer; generation_config.json defaults apply when the directory has one.
    ``kv_format`` as in :func:`load_model`."""
    from hwinfer.testing.checkpoints import random_init

    config = load_config(config_path)
    cls = model_class(config)
    dev = resolve_device(device)
    ops = select(dev, impl=impl, strict=strict)
    compute_dtype = _resolve_dtype(dtype, config, dev.device_type)
    with torch.device("meta"):
        model = cls(config, ops, compute_dtype)
    model = model.to_empty(device=dev.torch_device)
    random_init(model, torch.Generator(device=dev.torch_device).manual_seed(seed))
    model.post_load()
    bind_dense_ops(model, model.ops)
    model.generation_defaults = load_generation_config(Path(config_path), config) \
        if Path(config_path).is_dir() else model.generation_defaults
    model.set_kv_format(kv_format)
    return model.eval()
