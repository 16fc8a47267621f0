"""Filling a model's parameters from a checkpoint, driven by the model's own layout declaration.

A model declares the checkpoint it expects as data (:class:`Layout`): for every checkpoint key,
its shape, the parameter it fills (optionally a slice of it, so per-expert tensors fill a fused
[E, 2I, H] parameter) and whether it may arrive quantized. The loader compares the checkpoint
with that declaration and fails naming every missing tensor, every unexpected one and every
shape mismatch; nothing is silently ignored except key prefixes the layout declares as not
used (a vision tower, say), and those are reported.

Quantized weights (FP8 e4m3 with 128x128 block scales, FP4 e2m1 with a UE8M0 scale per 32
inputs, compressed-tensors MXFP4) are dequantized here to the model dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from tqdm.auto import tqdm

from hwinfer.loader.checkpoint import CheckpointError, CheckpointReader

# Scale-tensor names that accompany a quantized ``<module>.weight`` in the published layouts:
# DeepSeek-V4 ``.scale``, DeepSeek-V3-style FP8 ``.weight_scale_inv``, compressed-tensors
# ``.weight_scale`` (whose packed weight is ``.weight_packed``).
_SCALE_SUFFIXES = (".scale", ".weight_scale_inv", ".weight_scale")


@dataclass(frozen=True)
class Entry:
    """One expected checkpoint tensor: fills ``param[index]`` with a tensor of ``shape``."""

    param: str
    shape: tuple[int, ...]
    index: tuple | None = None
    quantizable: bool = False  # a linear weight that may be stored FP8 / FP4


@dataclass
class Layout:
    """The checkpoint a model expects: key -> Entry, plus prefixes deliberately not loaded."""

    entries: dict[str, Entry]
    ignored_prefixes: tuple[str, ...] = ()
    name: str = "published"
    # Optional submodules (e.g. an MTP head) this layout does not carry: the loader drops them.
    without: tuple[str, ...] = ()

    def add(self, key: str, param: str, shape: tuple[int, ...], index: tuple | None = None,
            quantizable: bool = False) -> None:
        if key in self.entries:
            raise ValueError(f"layout declares {key!r} twice")
        self.entries[key] = Entry(param, tuple(shape), index, quantizable)


@dataclass
class LoadReport:
    loaded: int = 0
    dequantized: int = 0
    ignored: list[str] = field(default_factory=list)


def _module_prefix(key: str) -> str:
    return key[: -len(".weight")] if key.endswith(".weight") else key


def _find_quantized(reader: CheckpointReader, key: str) -> tuple[str, str] | None:
    """(weight key, scale key) when ``key`` is stored quantized, else None."""
    prefix = _module_prefix(key)
    weight_key = key if key in reader else f"{prefix}.weight_packed"
    if weight_key not in reader:
        return None
    for suffix in _SCALE_SUFFIXES:
        if f"{prefix}{suffix}" in reader:
            return weight_key, f"{prefix}{suffix}"
    return None


def _read_entry(reader: CheckpointReader, key: str, entry: Entry, dequant: dict[str, Callable],
                consumed: set[str]) -> tuple[torch.Tensor, bool]:
    quant = _find_quantized(reader, key) if entry.quantizable else None
    if quant is not None:
        wkey, skey = quant
        w, s = reader.get(wkey), reader.get(skey)
        consumed.update((wkey, skey))
        n, k = entry.shape[-2], entry.shape[-1]
        if w.dtype == torch.float8_e4m3fn:
            if tuple(w.shape) != entry.shape:
                raise CheckpointError(f"{wkey}: FP8 weight shape {tuple(w.shape)}, expected {entry.shape}")
            return dequant["fp8"](w, s), True
        if w.dtype in (torch.int8, torch.uint8):
            if tuple(w.shape) != (*entry.shape[:-1], k // 2) or tuple(s.shape) != (*entry.shape[:-1], k // 32):
                raise CheckpointError(
                    f"{wkey}: FP4 weight {tuple(w.shape)} / scale {tuple(s.shape)}, expected "
                    f"{(*entry.shape[:-1], k // 2)} / {(*entry.shape[:-1], k // 32)} for [{n}, {k}]")
            return dequant["fp4"](w, s), True
        raise CheckpointError(f"{wkey}: has a scale tensor {skey} but dtype {w.dtype} is not FP8 or packed FP4")
    if key not in reader:
        raise KeyError(key)
    t = reader.get(key)
    consumed.add(key)
    if tuple(t.shape) != entry.shape:
        raise CheckpointError(f"{key}: shape {tuple(t.shape)} in the checkpoint, the model expects {entry.shape}")
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise CheckpointError(f"{key}: stored as {t.dtype} without a scale tensor")
    return t, False


def load_into(model: torch.nn.Module, reader: CheckpointReader, layout: Layout,
              dequant: dict[str, Callable], *, progress: bool | None = None) -> LoadReport:
    """Copy every tensor of ``layout`` from ``reader`` into ``model``'s parameters and buffers."""
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    unknown_params = sorted({e.param for e in layout.entries.values()} - set(params))
    if unknown_params:
        raise ValueError(f"layout targets parameters the model lacks: {unknown_params[:5]}")

    report = LoadReport()
    consumed: set[str] = set()
    missing: list[str] = []
    show = progress if progress is not None else reader.total_bytes > (1 << 30)
    bar = tqdm(total=reader.total_bytes, unit="B", unit_scale=True, desc="loading", disable=not show)
    with torch.no_grad():
        for key, entry in layout.entries.items():
            try:
                tensor, was_quantized = _read_entry(reader, key, entry, dequant, consumed)
            except KeyError:
                missing.append(key)
                continue
            dest = params[entry.param]
            view = dest[entry.index] if entry.index is not None else dest
            if tuple(view.shape) != tuple(tensor.shape):
                raise CheckpointError(f"{key}: shape {tuple(tensor.shape)} does not fit {entry.param} "
                                      f"slice {tuple(view.shape)}")
            view.copy_(tensor.to(dtype=dest.dtype))
            report.loaded += 1
            report.dequantized += int(was_quantized)
            bar.update(tensor.numel() * tensor.element_size())
    bar.close()
    unexpected = []
    for key in reader.keys():
        if key in consumed:
            continue
        if any(key.startswith(p) for p in layout.ignored_prefixes):
            report.ignored.append(key)
        else:
            unexpected.append(key)
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing from the checkpoint: {_names(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s) in the checkpoint: {_names(unexpected)}")
    if problems:
        raise CheckpointError(f"checkpoint {reader.path} does not match the {layout.name} layout of "
                              f"{type(model).__name__}: " + "; ".join(problems))
    return report


def _names(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")
