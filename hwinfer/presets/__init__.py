"""Presets: the published config.json of each target model, shipped without weights.

A preset name (``deepseek-v4-flash``, ``qwen3.5-0.8b``, ...) works wherever a checkpoint path is
expected by :func:`hwinfer.loader.config.load_config`: the memory ledger
(``hwinfer ledger deepseek-v4-flash --context 1M``) and random-weight runs at the real
dimensions. Each ``<name>.json`` is the released file as published; where the file could not be
found verbatim it was rebuilt from the documented fields and says so in a top-level
``_hwinfer_source`` note (which the loader ignores: no model reads it).
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

SOURCE_KEY = "_hwinfer_source"


def _files() -> dict[str, Path]:
    root = resources.files(__name__)
    return {Path(entry.name).stem: Path(str(entry)) for entry in root.iterdir()
            if entry.name.endswith(".json")}


def preset_names() -> list[str]:
    """Every shipped preset name, sorted."""
    return sorted(_files())


def preset_path(name: str) -> Path | None:
    """The preset's config file, or None when no preset has that name (case-insensitive)."""
    return _files().get(name.strip().lower())


def load_preset(name: str) -> dict[str, Any]:
    """The preset's config.json as a dict (unknown name: KeyError listing the known ones)."""
    path = preset_path(name)
    if path is None:
        raise KeyError(f"no preset named {name!r}; presets: {', '.join(preset_names())}")
    return json.loads(path.read_text())


def resolve(path_or_name: str | Path) -> Path:
    """An existing path as given, else the file of the preset with that name; a name that is
    neither raises FileNotFoundError naming the presets."""
    path = Path(path_or_name)
    if path.exists():
        return path
    preset = preset_path(str(path_or_name))
    if preset is None:
        raise FileNotFoundError(f"{path_or_name} is neither an existing path nor a preset "
                                f"({', '.join(preset_names())})")
    return preset
