"""The embedded default model: a tiny Qwen3.5 checkpoint the project writes itself.

``hwinfer serve`` with no path serves it, so a fresh machine answers without any download. The
checkpoint is deterministic (``write_checkpoint("qwen3_5", ..., size="tiny", seed=0)``): random
weights behind a real byte-level BPE tokenizer and a ChatML template. It is written once into the
cache directory (``$HWINFER_CACHE`` or ``~/.cache/hwinfer``) through a temporary directory and an
atomic rename, so concurrent first starts never see half a checkpoint.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "hwinfer-tiny-qwen3.5"
_DIR_NAME = "default-qwen3_5-tiny-v1"


def cache_dir() -> Path:
    return Path(os.environ.get("HWINFER_CACHE") or Path.home() / ".cache" / "hwinfer")


def default_checkpoint(root: str | Path | None = None) -> Path:
    """The embedded default checkpoint's directory, written on first use."""
    from hwinfer.testing.checkpoints import write_checkpoint

    base = Path(root) if root is not None else cache_dir()
    target = base / _DIR_NAME
    if (target / "config.json").exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".writing-", dir=base))
    try:
        write_checkpoint("qwen3_5", tmp, size="tiny", seed=0)
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first: its checkpoint is the same bytes.
            if not (target / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
